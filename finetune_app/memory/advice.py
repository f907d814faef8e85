"""Does a run fit a GPU, and what to change when it does not (pure: only the estimator is consulted).

Verdict margin: a run "fits" when its estimated nvidia-smi total stays below 93% of the GPU's memory.
The 7% covers the estimator's median error against published measurements (docs/memory.md), the
memory the driver reserves on the card, and other processes. Between 93% and 100% it is "tight";
above, it "does_not_fit".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..config import ConfigError, RunConfig, build_config
from .estimator import MemoryEstimate, estimate_memory
from .shape import ModelShape, ShapeError

FIT_MARGIN = 0.07
Status = Literal["fits", "tight", "does_not_fit"]


@dataclass(frozen=True)
class Verdict:
    status: Status
    total: int
    gpu_bytes: int
    headroom: int  # gpu_bytes - total (negative when it does not fit)

    @property
    def fits(self) -> bool:
        return self.status == "fits"


@dataclass(frozen=True)
class Suggestion:
    title: str
    overrides: tuple[str, ...]  # dotted key=value, as on the command line
    saving: int  # bytes per GPU
    cost: str  # what it costs in quality or speed


@dataclass(frozen=True)
class FitResult:
    config: RunConfig
    applied: tuple[Suggestion, ...]
    estimate: MemoryEstimate
    verdict: Verdict


def verdict(estimate: MemoryEstimate, gpu_bytes: int) -> Verdict:
    total = estimate.total
    if total <= gpu_bytes * (1 - FIT_MARGIN):
        status: Status = "fits"
    elif total <= gpu_bytes:
        status = "tight"
    else:
        status = "does_not_fit"
    return Verdict(status, total, gpu_bytes, gpu_bytes - total)


def with_overrides(cfg: RunConfig, overrides: list[str] | tuple[str, ...]) -> RunConfig:
    """A validated copy of `cfg` with dotted overrides applied (raises ConfigError if invalid)."""
    return build_config(cfg.model_dump(mode="json"), list(overrides), source="suggestion")


def _fits(cfg: RunConfig, shape: ModelShape, gpu_bytes: int, flash: bool) -> bool:
    return verdict(estimate_memory(cfg, shape, flash_available=flash), gpu_bytes).fits


def _candidates(cfg: RunConfig, gpus_available: int) -> list[tuple[str, list[str], str]]:
    """Changes in order of cost: free ones first, then speed, then quality."""
    t, q, lora, mem, dist = cfg.training, cfg.quantization, cfg.lora, cfg.memory, cfg.distributed
    out: list[tuple[str, list[str], str]] = []
    if mem.attention == "eager":
        out.append(("use SDPA attention instead of eager", ["memory.attention=sdpa"], "none (usually faster)"))
    if q.load_in == "4bit" and not q.double_quant:
        out.append(("double-quantize the 4-bit constants", ["quantization.double_quant=true"], "none measurable"))
    if t.optimizer in ("adamw_torch", "adamw_torch_fused", "paged_adamw_32bit"):
        out.append(("8-bit paged AdamW", ["training.optimizer=paged_adamw_8bit"], "negligible quality"))
    if not mem.gradient_checkpointing:
        out.append(("gradient checkpointing", ["memory.gradient_checkpointing=true"], "~25% slower steps"))
    b, ga = t.micro_batch_size, t.gradient_accumulation_steps
    while b > 1:
        half = b // 2
        ga = ga * b // half if (ga * b) % half == 0 else ga * 2
        b = half
        out.append(
            (
                f"micro-batch {b} x {ga} accumulation steps (same effective batch)",
                [f"training.micro_batch_size={b}", f"training.gradient_accumulation_steps={ga}"],
                "slower steps",
            )
        )
    if dist.strategy != "fsdp" and gpus_available >= 2 and q.load_in != "8bit":
        out.append(
            (
                f"FSDP over {gpus_available} GPUs",
                ["distributed.strategy=fsdp", f"distributed.num_processes={gpus_available}"],
                "needs the GPUs; communication overhead",
            )
        )
    if lora.adapter == "none":
        out.append(
            (
                "QLoRA instead of a full fine-tune",
                ["lora.adapter=lora", "quantization.load_in=4bit", "quantization.double_quant=true"],
                "quality",
            )
        )
    elif q.load_in == "none":
        out.append(
            (
                "quantize the base to 4-bit (QLoRA)",
                ["quantization.load_in=4bit", "quantization.double_quant=true"],
                "small quality",
            )
        )
    if lora.adapter == "lora" and lora.r > 8:
        out.append(
            (
                f"LoRA rank {lora.r // 2}",
                [f"lora.r={lora.r // 2}", f"lora.alpha={max(1, lora.alpha // 2)}"],
                "adapter capacity",
            )
        )
    if lora.adapter == "lora" and lora.target_modules == "all-linear":
        out.append(
            ("LoRA on attention only", ["lora.target_modules=[q_proj,k_proj,v_proj,o_proj]"], "adapter capacity")
        )
    if dist.strategy == "fsdp" and not dist.cpu_offload:
        out.append(("FSDP CPU offload", ["distributed.cpu_offload=true"], "much slower steps"))
    return out


def suggestions(
    cfg: RunConfig, shape: ModelShape, *, gpus_available: int = 1, flash_available: bool = False
) -> list[Suggestion]:
    """Each change on its own, with the bytes it saves per GPU (only those that save something)."""
    base = estimate_memory(cfg, shape, flash_available=flash_available).total
    out = []
    for title, overrides, cost in _candidates(cfg, gpus_available):
        try:
            changed = with_overrides(cfg, overrides)
            saving = base - estimate_memory(changed, shape, flash_available=flash_available).total
        except (ConfigError, ShapeError):
            continue
        if saving > 0:
            out.append(Suggestion(title, tuple(overrides), saving, cost))
    return out


def largest_max_length(
    cfg: RunConfig, shape: ModelShape, gpu_bytes: int, *, flash_available: bool = False, upper: int | None = None
) -> int | None:
    """Longest training.max_length that fits (binary search); None if even 8 tokens do not."""
    upper = upper or shape.max_position_embeddings or 131072
    return _largest(cfg, shape, gpu_bytes, "training.max_length", 8, upper, flash_available)


def largest_micro_batch_size(
    cfg: RunConfig, shape: ModelShape, gpu_bytes: int, *, flash_available: bool = False, upper: int = 1024
) -> int | None:
    return _largest(cfg, shape, gpu_bytes, "training.micro_batch_size", 1, upper, flash_available)


def _largest(cfg, shape, gpu_bytes, key, low, high, flash) -> int | None:
    section, name = key.split(".")

    def fits(value: int) -> bool:
        trial = cfg.model_copy(update={section: getattr(cfg, section).model_copy(update={name: value})})
        return _fits(trial, shape, gpu_bytes, flash)

    if not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def fit_to_gpu(
    cfg: RunConfig, shape: ModelShape, gpu_bytes: int, *, gpus_available: int = 1, flash_available: bool = False
) -> FitResult:
    """Apply the cheapest changes, one after another, until the run fits; shorten max_length last."""
    applied: list[Suggestion] = []
    current = cfg
    estimate = estimate_memory(current, shape, flash_available=flash_available)
    for title, overrides, cost in _candidates(cfg, gpus_available):
        if verdict(estimate, gpu_bytes).fits:
            break
        try:
            trial = with_overrides(current, overrides)
        except ConfigError:
            continue
        trial_estimate = estimate_memory(trial, shape, flash_available=flash_available)
        saving = estimate.total - trial_estimate.total
        deficit = estimate.total - gpu_bytes * (1 - FIT_MARGIN)
        if saving <= 0.02 * deficit:  # a change that barely helps is not worth its cost
            continue
        applied.append(Suggestion(title, tuple(overrides), saving, cost))
        current, estimate = trial, trial_estimate
    if not verdict(estimate, gpu_bytes).fits:
        length = largest_max_length(
            current, shape, gpu_bytes, flash_available=flash_available, upper=current.training.max_length
        )
        if length is not None:
            overrides = (f"training.max_length={length}",)
            trial = with_overrides(current, overrides)
            trial_estimate = estimate_memory(trial, shape, flash_available=flash_available)
            applied.append(
                Suggestion(
                    f"max_length {length}",
                    overrides,
                    estimate.total - trial_estimate.total,
                    "longer examples are truncated",
                )
            )
            current, estimate = trial, trial_estimate
    return FitResult(current, tuple(applied), estimate, verdict(estimate, gpu_bytes))
