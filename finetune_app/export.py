"""Export a finished run: save the adapter, merge it into the base, push either to the Hub.

Every export folder is written into a hidden temporary sibling and renamed into place only once it is
complete (see `atomic.atomic_dir`), so a crash never leaves a folder that looks finished and an earlier
export is replaced only by a complete new one. Each export carries a README.md model card, the run's
config.yaml and `finetune_app_export.json`, which records what it was made from so a failed push can be
retried without rebuilding.

Merging reloads the base UN-quantized in the chosen dtype (a QLoRA run trained on 4-bit weights, but
merging into 4-bit weights would round the update away), checks that RAM/VRAM and disk suffice first,
and afterwards compares the merged model's logits with the unmerged base + adapter.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .atomic import atomic_dir, atomic_write_text
from .config import DEMO_MODEL, DTYPE_BYTES, ConfigError, Dtype, ModelSection, RunConfig, dump_yaml, load_config
from .hub import PushError
from .runner import ADAPTER_DIR, CONFIG_FILE

Progress = Callable[[str], None] | None

EXPORTS_DIR = "exports"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
EXPORT_MARKER = "finetune_app_export.json"
MERGE_CHECK_FILE = "merge_check.json"
CARD_FILE = "README.md"
DEFAULT_MAX_SHARD_SIZE = "5GB"
DTYPE_ALIASES: dict[str, Dtype] = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
# Merge check: max |merged - unmerged| over all logits, divided by the largest |logit| of the unmerged
# model. fp32 differs only by summation order; half precision rounds W + BA once per weight (8 or 11
# mantissa bits) and the rounding grows through the layers: SmolLM2-135M with a strong random adapter
# measured 5e-6 (fp32), 5e-3 (fp16) and 4e-2 (bf16), hence these bounds.
MERGE_TOLERANCE: dict[str, float] = {"float32": 1e-4, "bfloat16": 1e-1, "float16": 2e-2}
CHECK_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Fine-tuning a language model with LoRA means",
)
GIB = 1024**3
# Beyond the weights, a merge needs the adapter (kept in fp32 by PEFT), Python/torch and short prompts.
MERGE_OVERHEAD_FRACTION = 0.10
MERGE_OVERHEAD_BYTES = 512 * 1024**2
EXPORT_DISK_MARGIN_BYTES = 64 * 1024**2


class ExportError(RuntimeError):
    """An export that cannot be done; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# The run directory


@dataclass(frozen=True)
class RunFiles:
    run_dir: Path
    cfg: RunConfig
    events: list[dict[str, Any]]

    @property
    def adapter_dir(self) -> Path:
        return self.run_dir / ADAPTER_DIR


def load_run(run_dir: Path | str, cfg: RunConfig | None = None) -> RunFiles:
    """The run's config, events and final adapter, or ExportError saying what is missing."""
    from .events import read_events

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"run directory not found: {run_dir}")
    if cfg is None:
        cfg = _load_run_config(run_dir)
    run = RunFiles(run_dir, cfg, read_events(run_dir))
    _check_adapter_present(run)
    return run


def _load_run_config(run_dir: Path) -> RunConfig:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ExportError(f"cannot read the run's config: {exc}") from None


def _check_adapter_present(run: RunFiles) -> None:
    if run.cfg.lora.adapter != "lora":
        raise ExportError(
            f"{run.run_dir} is a full fine-tune (lora.adapter=none): its complete model is in "
            f"{run.run_dir / 'model'} already; there is no adapter to save or merge"
        )
    missing = [name for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG) if not (run.adapter_dir / name).is_file()]
    if missing:
        from .runner import last_checkpoint

        checkpoint = last_checkpoint(run.run_dir)
        hint = f" The latest checkpoint is {checkpoint}." if checkpoint else ""
        raise ExportError(
            f"{run.run_dir} has no final adapter yet ({', '.join(missing)} missing in {run.adapter_dir}): "
            f"training has not finished or was interrupted; finish or resume it first.{hint}"
        )


def adapter_fingerprint(adapter_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        with open(adapter_dir / name, "rb") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def normalize_dtype(name: str) -> Dtype:
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise ExportError(f"unknown dtype {name!r}: use bf16, fp16 or fp32") from None


def default_export_dir(run_dir: Path, kind: str, dtype: str | None = None) -> Path:
    name = "adapter" if kind == "adapter" else f"merged-{_short_dtype(dtype or 'bfloat16')}"
    return Path(run_dir) / EXPORTS_DIR / name


def _short_dtype(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype]


# ---------------------------------------------------------------------------------------------
# Export folders: safety, reuse, metadata


def check_output_dir(path: Path) -> None:
    """Refuse to replace a folder that is not one of our exports (e.g. a mistyped --output)."""
    if path.exists() and (not path.is_dir() or (any(path.iterdir()) and not (path / EXPORT_MARKER).is_file())):
        raise ExportError(
            f"refusing to replace {path}: it exists and is not a finetune_app export. Choose a new or empty "
            "--output folder"
        )


def read_export_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def reusable_export(folder: Path, kind: str, dtype: str | None, fingerprint: str) -> bool:
    """True when `folder` is a complete export of this same adapter (same kind and dtype)."""
    marker = read_export_marker(folder)
    return (
        bool(marker)
        and marker.get("kind") == kind
        and marker.get("dtype") == dtype
        and (marker.get("adapter_sha256") == fingerprint)
    )


def _write_marker(folder: Path, kind: str, dtype: str | None, fingerprint: str) -> None:
    from . import __version__

    marker = {
        "kind": kind,
        "dtype": dtype,
        "adapter_sha256": fingerprint,
        "created": round(time.time()),
        "finetune_app_version": __version__,
    }
    (folder / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def write_card(run: RunFiles, folder: Path, kind: str, repo_id: str | None = None, atomic: bool = False) -> None:
    """(Re)write README.md from the run; `atomic` when replacing the card of a finished export."""
    from .model_card import LOSS_CURVE_FILE, build_model_card, training_record

    check = _read_json(folder / MERGE_CHECK_FILE)
    card = build_model_card(
        run.cfg,
        training_record(run.events),
        kind,
        repo_id=repo_id,
        merge_check=check,
        has_loss_curve=(folder / LOSS_CURVE_FILE).is_file(),
    )
    if atomic:
        atomic_write_text(folder / CARD_FILE, str(card))
    else:
        (folder / CARD_FILE).write_text(str(card), encoding="utf-8")


def _write_run_documents(run: RunFiles, folder: Path) -> None:
    """config.yaml and the loss curve; the card is written after them because it refers to both."""
    from .model_card import LOSS_CURVE_FILE, training_record, write_loss_curve

    (folder / CONFIG_FILE).write_text(dump_yaml(run.cfg), encoding="utf-8")
    write_loss_curve(training_record(run.events), folder / LOSS_CURVE_FILE)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _tokenizer_files(adapter_dir: Path) -> list[Path]:
    """Everything the runner saved beside the adapter except the adapter itself, PEFT's stub card and the config."""
    skip = {ADAPTER_WEIGHTS, ADAPTER_CONFIG, CARD_FILE, CONFIG_FILE}
    return [path for path in sorted(adapter_dir.iterdir()) if path.is_file() and path.name not in skip]


def check_disk_space(needed_bytes: int, free_bytes: int, what: str, where: Path) -> None:
    if needed_bytes > free_bytes:
        raise ExportError(
            f"not enough disk space for the {what}: it needs {needed_bytes / GIB:.2f} GiB but only "
            f"{free_bytes / GIB:.2f} GiB are free at {where}. Free some space or choose another --output"
        )


def free_disk_bytes(path: Path) -> int:
    existing = Path(path)
    while not existing.exists():
        existing = existing.parent
    return shutil.disk_usage(existing).free


# ---------------------------------------------------------------------------------------------
# Adapter export


def export_adapter(
    run_dir: Path | str,
    *,
    output: Path | str | None = None,
    repo_id: str | None = None,
    rebuild: bool = False,
    progress: Progress = None,
    cfg: RunConfig | None = None,
) -> Path:
    """Save the adapter + tokenizer + config.yaml + model card into RUN/exports/adapter (or `output`)."""
    say = progress or _silent
    run = load_run(run_dir, cfg)
    target = Path(output) if output else default_export_dir(run.run_dir, "adapter")
    fingerprint = adapter_fingerprint(run.adapter_dir)
    if not rebuild and reusable_export(target, "adapter", None, fingerprint):
        say(f"Reusing the existing adapter export at {target} (same adapter)")
        return target
    check_output_dir(target)
    size = sum(path.stat().st_size for path in run.adapter_dir.iterdir() if path.is_file())
    check_disk_space(size + EXPORT_DISK_MARGIN_BYTES, free_disk_bytes(target), "adapter export", target)
    say(f"Saving the adapter to {target} ...")
    with atomic_dir(target) as tmp:
        shutil.copy2(run.adapter_dir / ADAPTER_WEIGHTS, tmp / ADAPTER_WEIGHTS)
        _write_adapter_config(run, tmp / ADAPTER_CONFIG)
        for path in _tokenizer_files(run.adapter_dir):
            shutil.copy2(path, tmp / path.name)
        _write_run_documents(run, tmp)
        write_card(run, tmp, "adapter", repo_id)
        _write_marker(tmp, "adapter", None, fingerprint)
    say(f"Adapter saved to {target}")
    return target


def _write_adapter_config(run: RunFiles, path: Path) -> None:
    """Point base_model_name_or_path at the public base id (not a local cache path) when there is one."""
    from .model_card import public_base_id

    config = json.loads((run.adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base_id = public_base_id(run.cfg.model)
    if base_id:
        config["base_model_name_or_path"] = base_id
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Merge: planning (pure numbers)


@dataclass(frozen=True)
class MergePlan:
    dtype: str
    base_params: int
    adapter_params: int

    @property
    def weights_bytes(self) -> int:
        return self.base_params * DTYPE_BYTES[self.dtype]

    @property
    def memory_bytes(self) -> int:
        adapter = self.adapter_params * 4
        return int(self.weights_bytes * (1 + MERGE_OVERHEAD_FRACTION)) + adapter + MERGE_OVERHEAD_BYTES

    @property
    def disk_bytes(self) -> int:
        return self.weights_bytes + EXPORT_DISK_MARGIN_BYTES

    def describe(self) -> str:
        return (
            f"Merge plan: {self.base_params / 1e6:,.1f}M base parameters in {self.dtype} = "
            f"{self.weights_bytes / GIB:.2f} GiB of weights; needs ~{self.memory_bytes / GIB:.2f} GiB of memory "
            f"(RAM or VRAM) and ~{self.disk_bytes / GIB:.2f} GiB of disk"
        )


def choose_merge_device(plan: MergePlan, *, ram_available: int, disk_free: int, gpu_free: list[int]) -> str:
    """'cuda:N' when a GPU has room, else 'cpu' when RAM has room; ExportError naming the shortfall otherwise."""
    if plan.disk_bytes > disk_free:
        raise ExportError(
            f"the merged model will not fit on disk: it needs ~{plan.disk_bytes / GIB:.2f} GiB, "
            f"{disk_free / GIB:.2f} GiB are free. Free some space or choose another --output"
        )
    if gpu_free:
        best = max(range(len(gpu_free)), key=lambda index: gpu_free[index])
        if gpu_free[best] >= plan.memory_bytes:
            return f"cuda:{best}"
    if ram_available >= plan.memory_bytes:
        return "cpu"
    gpu_text = f", largest free GPU memory {max(gpu_free) / GIB:.2f} GiB" if gpu_free else ""
    raise ExportError(
        f"the merge will not fit in memory: it needs ~{plan.memory_bytes / GIB:.2f} GiB, available RAM "
        f"{ram_available / GIB:.2f} GiB{gpu_text}. Close other programs, merge on a bigger machine, or export "
        "the adapter alone (--adapter)"
    )


def safetensors_param_count(folder: Path) -> int | None:
    """Parameters stored in a folder's *.safetensors files, read from their headers (no weights loaded)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        for name, info in _safetensors_header(path).items():
            if name != "__metadata__":
                count = 1
                for dim in info["shape"]:
                    count *= dim
                total += count
    return total


def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        return json.loads(handle.read(length))


def base_param_count(base_path: str, model: ModelSection) -> int:
    local = safetensors_param_count(Path(base_path)) if Path(base_path).is_dir() else None
    if local is not None:
        return local
    # A Hub id or .bin checkpoint: build the architecture on the meta device and count.
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(
            base_path, revision=model.revision, trust_remote_code=model.trust_remote_code
        )
    except OSError as exc:
        raise ExportError(f"cannot read the base model {base_path}: {exc}") from None
    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(config, trust_remote_code=model.trust_remote_code)
    return sum(param.numel() for param in empty.parameters())


def gpu_free_bytes() -> list[int]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.mem_get_info(index)[0] for index in range(torch.cuda.device_count())]


def ram_available_bytes() -> int:
    import psutil

    return psutil.virtual_memory().available


# ---------------------------------------------------------------------------------------------
# Merge: doing it


def resolve_base_path(model: ModelSection, progress: Progress = None) -> tuple[str, str | None]:
    """The un-quantized base as a from_pretrained path (+ revision)."""
    try:
        from .model_source import ModelSourceError, resolve_model
    except ModuleNotFoundError as exc:  # model_source is optional for this module's tests
        if exc.name != f"{__package__}.model_source":
            raise
        return _fallback_base_path(model, progress), model.revision
    try:
        resolved = resolve_model(model, log=progress or _silent)
    except ModelSourceError as exc:
        raise ExportError(str(exc)) from None
    return resolved.path, resolved.revision


def _fallback_base_path(model: ModelSection, progress: Progress) -> str:
    if model.name_or_path == DEMO_MODEL:
        from .demo_model import ensure_demo_model

        return str(ensure_demo_model(progress or _silent))
    return model.name_or_path


def refuse_quantized_checkpoint(base_path: str) -> None:
    """A pre-quantized checkpoint (e.g. a '-bnb-4bit' repo) has no full-precision weights to merge into."""
    config = _read_json(Path(base_path) / "config.json") if Path(base_path).is_dir() else None
    if config and config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "quantized")
        raise ExportError(
            f"the base {base_path} is a pre-quantized ({method}) checkpoint: merging into quantized weights would "
            "round the LoRA update away. Set model.name_or_path to the original full-precision model and retry"
        )


def refuse_quantized_model(model) -> None:
    """Never merge into 4-bit/8-bit weights: raise instead of silently degrading the update."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quantized = (
        getattr(base, "is_loaded_in_4bit", False)
        or getattr(base, "is_loaded_in_8bit", False)
        or getattr(base, "hf_quantizer", None) is not None
        or any(type(module).__name__ in ("Linear4bit", "Linear8bitLt") for module in base.modules())
    )
    if quantized:
        raise ExportError(
            "refusing to merge into a quantized model: merged 4-bit/8-bit weights lose most of the LoRA update. "
            "Load the base un-quantized (bfloat16, float16 or float32) and merge into that"
        )


def check_inputs(tokenizer, device: str) -> list[dict[str, Any]]:
    """A few short prompts (one through the chat template) as model inputs."""
    texts = list(CHECK_PROMPTS)
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": "Say hello in three languages."}]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return [{k: v.to(device) for k, v in tokenizer(text, return_tensors="pt").items()} for text in texts]


def all_logits(model, inputs: list[dict[str, Any]]) -> list[Any]:
    import torch

    with torch.no_grad():
        return [model(**batch).logits.float().cpu() for batch in inputs]


def compare_logits(reference: list[Any], merged: list[Any], dtype: str, device: str) -> dict[str, Any]:
    """The merge check figure: max |merged - unmerged| relative to the largest |logit| (plus RMS and
    how often the most likely next token agrees, for a reader who wants more than one number)."""
    import torch

    ref, new = torch.cat([a[0] for a in reference]), torch.cat([b[0] for b in merged])
    max_diff = float((new - ref).abs().max())
    scale = float(ref.abs().max()) or 1.0
    tolerance = MERGE_TOLERANCE[dtype]
    return {
        "dtype": dtype,
        "device": device,
        "prompts": len(reference),
        "tokens": int(ref.shape[0]),
        "max_abs_diff": max_diff,
        "logit_scale": scale,
        "relative_diff": max_diff / scale,
        "rms_relative_diff": float((new - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()),
        "top1_agreement": float((new.argmax(-1) == ref.argmax(-1)).float().mean()),
        "tolerance": tolerance,
        "passed": max_diff / scale <= tolerance,
    }


def merge_adapter(
    run_dir: Path | str,
    *,
    dtype: str | None = None,
    output: Path | str | None = None,
    repo_id: str | None = None,
    rebuild: bool = False,
    max_shard_size: str = DEFAULT_MAX_SHARD_SIZE,
    progress: Progress = None,
    cfg: RunConfig | None = None,
) -> Path:
    """Merge the run's adapter into an un-quantized copy of the base; save it with card and merge check."""
    say = progress or _silent
    run = load_run(run_dir, cfg)
    dtype = normalize_dtype(dtype or run.cfg.export.merge_dtype)
    target = Path(output) if output else default_export_dir(run.run_dir, "merged", dtype)
    fingerprint = adapter_fingerprint(run.adapter_dir)
    if not rebuild and reusable_export(target, "merged", dtype, fingerprint):
        say(f"Reusing the existing merged export at {target} (same adapter, {dtype})")
        return target
    check_output_dir(target)
    base_path, revision = resolve_base_path(run.cfg.model, say)
    refuse_quantized_checkpoint(base_path)
    plan = MergePlan(dtype, base_param_count(base_path, run.cfg.model), _adapter_params(run.adapter_dir))
    say(plan.describe())
    device = choose_merge_device(
        plan, ram_available=ram_available_bytes(), disk_free=free_disk_bytes(target), gpu_free=gpu_free_bytes()
    )
    say(
        f"Merging on {device} (RAM available {ram_available_bytes() / GIB:.1f} GiB, "
        f"disk free {free_disk_bytes(target) / GIB:.1f} GiB)"
    )
    merged, tokenizer, check = _merge_and_check(run, base_path, revision, dtype, device, say)
    with atomic_dir(target) as tmp:
        say(f"Saving the merged model to {target} ...")
        merged.save_pretrained(str(tmp), max_shard_size=max_shard_size)
        tokenizer.save_pretrained(str(tmp))
        (tmp / MERGE_CHECK_FILE).write_text(json.dumps(check, indent=2) + "\n", encoding="utf-8")
        _write_run_documents(run, tmp)
        write_card(run, tmp, "merged", repo_id)
        _write_marker(tmp, "merged", dtype, fingerprint)
    say(f"Merged model saved to {target}")
    return target


def _adapter_params(adapter_dir: Path) -> int:
    return sum(
        _count(info["shape"])
        for name, info in _safetensors_header(adapter_dir / ADAPTER_WEIGHTS).items()
        if name != "__metadata__"
    )


def _count(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _merge_and_check(run: RunFiles, base_path: str, revision: str | None, dtype: str, device: str, say):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(run.adapter_dir))
    say(f"Loading the base {base_path} un-quantized in {dtype} ...")
    try:
        base = AutoModelForCausalLM.from_pretrained(
            base_path,
            revision=revision,
            dtype=getattr(torch, dtype),
            device_map={"": device},
            trust_remote_code=run.cfg.model.trust_remote_code,
        )
    except OSError as exc:
        raise ExportError(f"cannot load the base model {base_path}: {exc}") from None
    if base.get_input_embeddings().weight.shape[0] < len(tokenizer):
        base.resize_token_embeddings(len(tokenizer))  # the run added tokens; the adapter expects them
    model = PeftModel.from_pretrained(base, str(run.adapter_dir)).eval()
    refuse_quantized_model(model)
    inputs = check_inputs(tokenizer, device)
    reference = all_logits(model, inputs)
    say("Merging the adapter into the weights ...")
    merged = model.merge_and_unload().eval()
    check = compare_logits(reference, all_logits(merged, inputs), dtype, device)
    say(
        f"Merge check: max |logit difference| {check['max_abs_diff']:.3g} = {check['relative_diff']:.3g} of the "
        f"logit scale {check['logit_scale']:.3g} (tolerance {check['tolerance']:g} for {dtype}) -> "
        + ("passed" if check["passed"] else "FAILED")
    )
    if not check["passed"]:
        raise ExportError(
            f"the merged model does not reproduce base + adapter: relative logit difference "
            f"{check['relative_diff']:.3g} exceeds the {dtype} tolerance {check['tolerance']:g}. Nothing was saved; "
            "try --dtype fp32"
        )
    return merged, tokenizer, check


# ---------------------------------------------------------------------------------------------
# Push


def push_export(
    run_dir: Path | str,
    folder: Path | str,
    repo_id: str,
    private: bool,
    *,
    progress: Progress = None,
    cfg: RunConfig | None = None,
) -> str:
    """Push a finished export folder; its card is rewritten first so the usage code names `repo_id`."""
    from .hub import check_repo_id, push_folder

    folder = Path(folder)
    marker = read_export_marker(folder)
    if marker is None:
        raise ExportError(f"{folder} is not a complete finetune_app export; export it again before pushing")
    check_repo_id(repo_id)
    write_card(load_run(run_dir, cfg), folder, marker["kind"], repo_id, atomic=True)
    return push_folder(folder, repo_id, private, progress=progress)


# ---------------------------------------------------------------------------------------------
# After a preset run


@dataclass
class ExportResult:
    adapter_dir: Path | None = None
    merged_dir: Path | None = None
    repo_url: str | None = None
    merge_check: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        parts = {k: str(v) for k, v in asdict(self).items() if v and k != "merge_check"}
        if self.merge_check:
            parts["merge_check"] = f"relative diff {self.merge_check['relative_diff']:.3g}"
        return ", ".join(f"{k}={v}" for k, v in parts.items()) or "nothing exported"


def export_after_training(cfg: RunConfig, run_dir: Path | str, progress: Progress = None) -> ExportResult:
    """Do what cfg.export asks at the end of a run. Never raises for export problems: training already
    succeeded, so problems are returned (and every export finished before a failure stays on disk)."""
    say = progress or _silent
    export = cfg.export
    result = ExportResult()
    try:
        adapter_repo = export.push_to_hub if export.push_what == "adapter" else None
        result.adapter_dir = export_adapter(run_dir, repo_id=adapter_repo, progress=say, cfg=cfg)
        if export.merge:
            merged_repo = export.push_to_hub if export.push_what == "merged" else None
            result.merged_dir = merge_adapter(
                run_dir, dtype=export.merge_dtype, repo_id=merged_repo, progress=say, cfg=cfg
            )
            result.merge_check = _read_json(result.merged_dir / MERGE_CHECK_FILE)
        if export.push_to_hub:
            folder = result.merged_dir if export.push_what == "merged" else result.adapter_dir
            result.repo_url = push_export(run_dir, folder, export.push_to_hub, export.private, progress=say, cfg=cfg)
    except (ExportError, PushError) as exc:
        result.problems.append(str(exc))
        say(f"Export problem: {exc}")
    except Exception as exc:  # e.g. out of memory while merging: the trained adapter is safe either way
        result.problems.append(f"{type(exc).__name__}: {exc}")
        say(f"Export problem: {type(exc).__name__}: {exc}")
    return result


# ---------------------------------------------------------------------------------------------
# CLI: python -m finetune_app export RUN_DIR (--adapter | --merge) ...


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="run directory (holds config.yaml, events.jsonl, adapter/)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--adapter", action="store_true", help="export the LoRA adapter (small)")
    what.add_argument("--merge", action="store_true", help="merge the adapter into an un-quantized copy of the base")
    parser.add_argument(
        "--dtype", choices=["bf16", "fp16", "fp32"], help="merged weights dtype (default: export.merge_dtype)"
    )
    parser.add_argument("--push", metavar="REPO_ID", help="push the export to this Hub repo (namespace/name)")
    visibility = parser.add_mutually_exclusive_group()
    visibility.add_argument(
        "--private",
        dest="private",
        action="store_true",
        default=None,
        help="create the Hub repo private (default: export.private of the run, normally true)",
    )
    visibility.add_argument("--public", dest="private", action="store_false", help="create the Hub repo public")
    parser.add_argument(
        "--output", type=Path, help="export folder (default: RUN_DIR/exports/adapter or merged-<dtype>)"
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild even if an up-to-date export exists")
    parser.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE, help="merged safetensors shard size")


def run_export(args: argparse.Namespace) -> int:
    try:
        export_from_args(args, progress=print)
    except (ExportError, PushError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # disk full, permissions, ... : the message is what the user needs
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: no export folder was left half-written", file=sys.stderr)
        return 130
    return 0


def export_from_args(args: argparse.Namespace, progress: Progress = print) -> Path:
    from .hub import preflight_push

    run = load_run(args.run_dir)
    private = run.cfg.export.private if args.private is None else args.private
    if args.push:
        # Before any long merge: a bad token or repo id should fail in seconds, not after the merge.
        preflight_push(args.push, private)
    if args.merge:
        folder = merge_adapter(
            run.run_dir,
            dtype=args.dtype,
            output=args.output,
            repo_id=args.push,
            rebuild=args.rebuild,
            max_shard_size=args.max_shard_size,
            progress=progress,
            cfg=run.cfg,
        )
    else:
        folder = export_adapter(
            run.run_dir, output=args.output, repo_id=args.push, rebuild=args.rebuild, progress=progress, cfg=run.cfg
        )
    if args.push:
        push_export(run.run_dir, folder, args.push, private, progress=progress, cfg=run.cfg)
    return folder


def _silent(_message: str) -> None:
    pass
