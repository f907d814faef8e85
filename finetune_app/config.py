"""The one typed description of a fine-tuning run.

Presets are YAML dumps of `RunConfig`; the CLI's ``key=value`` overrides and the GUI's widgets are
derived from its fields. Everything downstream receives a validated `RunConfig`, never a raw dict.
This module is pure: it imports neither torch nor the HF libraries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEMO_MODEL = "demo:smollm2-135m-instruct"

Dtype = Literal["bfloat16", "float16", "float32"]
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(Section):
    name_or_path: str = Field(
        DEMO_MODEL,
        description="Base model: a Hub id (org/name), a local HF folder, a .gguf file, or "
        f"'{DEMO_MODEL}' for the offline demo model (SmolLM2-135M-Instruct from PyPI).",
    )
    gguf_file: str | None = Field(
        None,
        description="File name of a GGUF inside a Hub repo given as name_or_path; converted once to a "
        "cached safetensors folder. Not needed when name_or_path is itself a .gguf path.",
    )
    revision: str | None = Field(None, description="Hub branch, tag or commit of the base model.")
    dtype: Dtype = Field(
        "bfloat16",
        description="Dtype the base is loaded and computed in (also the 4-bit compute dtype and the "
        "mixed-precision mode). bfloat16 needs an Ampere or newer GPU; use float16 on T4/V100.",
    )
    trust_remote_code: bool = Field(
        False, description="Run Python code shipped in the model repo. Off unless you trust the repo."
    )


class QuantizationSection(Section):
    load_in: Literal["4bit", "8bit", "none"] = Field(
        "4bit",
        description="How the frozen base weights are stored: bitsandbytes 4-bit (QLoRA), 8-bit "
        "(LLM.int8), or not quantized (plain LoRA / full fine-tune in model.dtype).",
    )
    quant_type: Literal["nf4", "fp4"] = Field(
        "nf4", description="4-bit data type: NF4 (NormalFloat, best for normally distributed weights) or FP4."
    )
    double_quant: bool = Field(
        True,
        description="Quantize the 4-bit quantization constants too (saves ~0.37 bit/param, ~0.4 GB on 8B).",
    )
    quant_storage: Dtype | Literal["uint8", "auto"] = Field(
        "auto",
        description="Storage dtype of packed 4-bit weights. 'auto' = uint8 on one process, model.dtype "
        "under FSDP (FSDP must shard 4-bit weights in the same dtype as the rest).",
    )


class LoraSection(Section):
    adapter: Literal["lora", "none"] = Field(
        "lora", description="Train LoRA adapters ('lora') or all weights ('none' = full fine-tune)."
    )
    r: int = Field(16, ge=1, le=1024, description="LoRA rank: width of the low-rank update.")
    alpha: int = Field(32, ge=1, description="LoRA alpha: the update is scaled by alpha/r.")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Linear layers that get adapters: 'all-linear' (every linear layer of the decoder "
        "blocks, as PEFT resolves it) or a list of module names such as [q_proj, v_proj].",
    )
    use_rslora: bool = Field(False, description="Rank-stabilised LoRA: scale by alpha/sqrt(r).")


DataFormat = Literal["auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text"]


class DataSection(Section):
    path: str = Field(
        "builtin:demo-facts",
        description="Training data: a local .json/.jsonl/.csv/.parquet file, a Hub dataset id, or "
        "'builtin:demo-facts' (the small dataset shipped with the app).",
    )
    subset: str | None = Field(None, description="Hub dataset configuration name, if it has several.")
    split: str = Field("train", description="Split of a Hub dataset to train on.")
    format: DataFormat = Field(
        "auto",
        description="Row format: messages (chat), sharegpt (conversations/from/value), alpaca "
        "(instruction/input/output), prompt_completion, text, or auto-detect from the columns.",
    )
    eval_path: str | None = Field(None, description="Separate evaluation file or Hub dataset.")
    eval_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Hold out this fraction of the training rows for evaluation."
    )
    max_samples: int | None = Field(None, ge=1, description="Use only the first N training rows.")
    completion_only_loss: bool = Field(
        True,
        description="Compute the loss on assistant/completion tokens only (prompts are masked).",
    )
    packing: bool = Field(False, description="Pack several short examples into each max_length sequence.")

    @model_validator(mode="after")
    def _one_eval_source(self) -> DataSection:
        if self.eval_path and self.eval_fraction > 0:
            raise ValueError("set data.eval_path or data.eval_fraction, not both")
        return self


Optimizer = Literal[
    "adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "adafactor", "sgd"
]


class TrainingSection(Section):
    micro_batch_size: int = Field(4, ge=1, description="Sequences per forward pass on each GPU.")
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches summed before each optimizer step (costs no memory)."
    )
    max_length: int = Field(1024, ge=8, description="Tokens per sequence; longer examples are truncated.")
    num_epochs: float = Field(1.0, gt=0, description="Passes over the training data (ignored if max_steps > 0).")
    max_steps: int = Field(-1, ge=-1, description="Stop after this many optimizer steps; -1 = use num_epochs.")
    learning_rate: float = Field(2e-4, gt=0, description="Peak learning rate.")
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = Field(
        "cosine", description="Learning-rate schedule after warmup."
    )
    warmup_ratio: float = Field(0.03, ge=0.0, lt=1.0, description="Fraction of steps spent warming up.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, ge=0.0, description="Gradient clipping norm (0 = off).")
    optimizer: Optimizer = Field(
        "adamw_torch",
        description="Optimizer. adamw_8bit / paged_adamw_8bit keep states in 8 bits (bitsandbytes).",
    )
    logging_steps: int = Field(1, ge=1, description="Log loss every N optimizer steps.")
    save_steps: int = Field(100, ge=1, description="Write a checkpoint every N optimizer steps.")
    save_total_limit: int | None = Field(3, ge=1, description="Keep at most this many checkpoints.")
    eval_steps: int | None = Field(None, ge=1, description="Evaluate every N steps (default: save_steps).")
    seed: int = Field(42, description="Random seed for data order, dropout and LoRA init.")


class MemorySection(Section):
    attention: Literal["auto", "flash_attention_2", "sdpa", "eager"] = Field(
        "auto",
        description="Attention kernel. auto = FlashAttention-2 when installed and the GPU supports it, "
        "else SDPA. eager stores the full attention matrix (quadratic memory).",
    )
    gradient_checkpointing: bool = Field(
        True, description="Recompute each decoder layer in backward instead of storing its activations."
    )


class DistributedSection(Section):
    strategy: Literal["single", "ddp", "fsdp"] = Field(
        "single", description="single process, DDP (full copy per GPU) or FSDP (sharded)."
    )
    num_processes: int = Field(1, ge=1, description="Processes (GPUs) per node.")
    fsdp_sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard"] = Field(
        "full_shard",
        description="FSDP sharding: full_shard (params+grads+optimizer), shard_grad_op (grads+optimizer), "
        "hybrid_shard (full shard within a node, replicate across nodes).",
    )
    cpu_offload: bool = Field(False, description="FSDP only: keep sharded parameters in CPU RAM.")
    num_nodes: int = Field(1, ge=1, description="Machines taking part; >1 writes per-node commands.")
    rdzv_endpoint: str | None = Field(None, description="host:port of the rendezvous (node 0) when num_nodes > 1.")
    gpu_ids: list[int] | None = Field(None, description="CUDA device indices to use (default: all).")


class ExportSection(Section):
    merge: bool = Field(False, description="After training, merge the adapter into an unquantized copy of the base.")
    merge_dtype: Dtype = Field("bfloat16", description="Dtype of the merged model's weights.")
    push_to_hub: str | None = Field(None, description="Hub repo id (user/name) to push to after training.")
    push_what: Literal["adapter", "merged"] = Field("adapter", description="What to push to the Hub.")
    private: bool = Field(True, description="Create the Hub repo as private.")


class OutputSection(Section):
    dir: str = Field("runs", description="Folder that holds run directories.")
    run_name: str | None = Field(
        None, description="Name of this run's directory (default: preset name and a timestamp)."
    )


class RunConfig(Section):
    """A complete, validated fine-tuning run."""

    model: ModelSection = Field(default_factory=ModelSection, description="Base model.")
    quantization: QuantizationSection = Field(
        default_factory=QuantizationSection, description="bitsandbytes quantization of the base."
    )
    lora: LoraSection = Field(default_factory=LoraSection, description="Adapter (PEFT LoRA).")
    data: DataSection = Field(default_factory=DataSection, description="Training data.")
    training: TrainingSection = Field(default_factory=TrainingSection, description="Optimisation.")
    memory: MemorySection = Field(default_factory=MemorySection, description="Attention and activation memory.")
    distributed: DistributedSection = Field(default_factory=DistributedSection, description="Multi-GPU strategy.")
    export: ExportSection = Field(default_factory=ExportSection, description="What happens after training.")
    output: OutputSection = Field(default_factory=OutputSection, description="Where results go.")

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
        problems = combination_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _check_hardware(self, info: Any) -> RunConfig:
        # Hardware is passed as validation context (a list of hardware.GPUInfo) where it is known.
        gpus = (info.context or {}).get("gpus") if info.context else None
        if gpus:
            problems = hardware_problems(self, gpus)
            if problems:
                raise ValueError("\n".join(problems))
        return self

    # Convenience views used all over the app.
    @property
    def is_quantized(self) -> bool:
        return self.quantization.load_in != "none"

    @property
    def world_size(self) -> int:
        return self.distributed.num_processes * self.distributed.num_nodes

    @property
    def effective_quant_storage(self) -> str:
        q = self.quantization.quant_storage
        if q != "auto":
            return q
        return self.model.dtype if self.distributed.strategy == "fsdp" else "uint8"


def combination_problems(cfg: RunConfig) -> list[str]:
    """Cross-field rules. Each message names the fields and says how to fix them."""
    q, lora, dist = cfg.quantization, cfg.lora, cfg.distributed
    out: list[str] = []
    if cfg.is_quantized and lora.adapter == "none":
        out.append(
            f"quantization.load_in={q.load_in} needs an adapter: quantized weights cannot be trained "
            "directly. Set lora.adapter=lora or quantization.load_in=none"
        )
    if q.load_in != "4bit" and q.double_quant:
        out.append(
            "quantization.double_quant applies to 4-bit only: set quantization.double_quant=false "
            f"or quantization.load_in=4bit (now {q.load_in})"
        )
    if q.load_in != "4bit" and q.quant_type != "nf4":
        out.append("quantization.quant_type=fp4 applies to 4-bit only: set quantization.load_in=4bit")
    if lora.adapter == "none" and cfg.model.dtype == "float16":
        out.append(
            "a full fine-tune (lora.adapter=none) in model.dtype=float16 cannot train: the fp16 gradient scaler "
            "refuses fp16 parameters. Use model.dtype=bfloat16 or float32, or train an adapter"
        )
    if dist.strategy == "single" and dist.num_nodes > 1:
        out.append("distributed.num_nodes>1 needs distributed.strategy=ddp or fsdp")
    if dist.strategy == "single" and dist.num_processes > 1:
        out.append("distributed.num_processes > 1 needs distributed.strategy=ddp or fsdp")
    if dist.strategy == "fsdp" and cfg.world_size < 2:
        out.append("distributed.strategy=fsdp needs at least 2 processes: set distributed.num_processes>=2")
    if dist.strategy == "ddp" and cfg.world_size < 2:
        out.append("distributed.strategy=ddp needs at least 2 processes: set distributed.num_processes>=2")
    if dist.cpu_offload and dist.strategy != "fsdp":
        out.append("distributed.cpu_offload needs distributed.strategy=fsdp (DDP and single cannot offload)")
    if dist.strategy == "fsdp" and q.load_in == "8bit":
        out.append("8-bit (LLM.int8) weights cannot be sharded by FSDP: use quantization.load_in=4bit or none")
    if dist.strategy == "fsdp" and cfg.is_quantized and q.quant_storage == "uint8":
        out.append(
            "FSDP with 4-bit needs quant_storage equal to model.dtype (uint8 storage gives silent "
            "NaN/zero loss): set quantization.quant_storage=auto"
        )
    if dist.strategy == "fsdp" and dist.fsdp_sharding == "hybrid_shard" and dist.num_nodes < 2:
        out.append("distributed.fsdp_sharding=hybrid_shard needs distributed.num_nodes>=2")
    if dist.num_nodes > 1 and not dist.rdzv_endpoint:
        out.append("distributed.num_nodes>1 needs distributed.rdzv_endpoint=host:port of node 0")
    if dist.gpu_ids is not None and len(dist.gpu_ids) != dist.num_processes:
        out.append(f"distributed.gpu_ids lists {len(dist.gpu_ids)} GPUs but num_processes is {dist.num_processes}")
    if cfg.export.push_what == "merged" and cfg.export.push_to_hub and not cfg.export.merge:
        out.append("export.push_what=merged needs export.merge=true")
    return out


def hardware_problems(cfg: RunConfig, gpus: list[Any]) -> list[str]:
    """Rules that depend on the GPUs the run will use (objects with name, compute_capability, bf16)."""
    out: list[str] = []
    uses_bf16 = cfg.model.dtype == "bfloat16"
    chosen = cfg.distributed.gpu_ids
    if chosen is not None:
        missing = [i for i in chosen if i >= len(gpus)]
        if missing:
            out.append(f"distributed.gpu_ids names GPU(s) {missing} but only {len(gpus)} GPU(s) were found")
    used = [(i, gpu) for i, gpu in enumerate(gpus) if chosen is None or i in chosen]
    for index, gpu in used:
        if uses_bf16 and not gpu.bf16:
            major, minor = gpu.compute_capability
            out.append(
                f"model.dtype=bfloat16 is not supported by GPU {index} ({gpu.name}, compute capability "
                f"{major}.{minor}; bf16 needs 8.0+): set model.dtype=float16"
            )
    if cfg.distributed.strategy != "single" and cfg.distributed.num_nodes == 1:
        if cfg.distributed.num_processes > len(gpus):
            out.append(f"distributed.num_processes={cfg.distributed.num_processes} but only {len(gpus)} GPU(s) found")
    return out


# ---------------------------------------------------------------------------------------------
# YAML, overrides and error messages


class ConfigError(Exception):
    """A config that cannot be used; the message lists every problem and how to fix it."""


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"preset not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (model:, lora:, ...), not {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """'training.learning_rate=1e-4' -> (['training', 'learning_rate'], 0.0001). Values are YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like section.field=value, e.g. training.learning_rate=1e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in a raw preset dict; unknown keys are reported with the valid ones."""
    data = {section: dict(values or {}) if isinstance(values, dict) else values for section, values in data.items()}
    for text in overrides:
        path, value = parse_override(text)
        _check_path(path, text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        # YAML reads 'null' / '~' as None; a bare string like 'q_proj,v_proj' becomes a list for list fields.
        node[path[-1]] = _coerce_for_field(path, value)
    return data


def _check_path(path: list[str], text: str) -> None:
    sections = RunConfig.model_fields
    if len(path) != 2 or path[0] not in sections:
        raise ConfigError(
            f"unknown override key {'.'.join(path)!r} in {text!r}; keys look like section.field, sections: "
            + ", ".join(sections)
        )
    section_model = sections[path[0]].annotation
    if path[1] not in section_model.model_fields:
        raise ConfigError(
            f"unknown field {path[1]!r} in section {path[0]!r}; valid fields: " + ", ".join(section_model.model_fields)
        )


def _coerce_for_field(path: list[str], value: Any) -> Any:
    if path == ["lora", "target_modules"] and isinstance(value, str) and value != "all-linear":
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def format_validation_error(error: ValidationError, source: str = "config") -> str:
    """Every offending field on its own line, with what is allowed."""
    lines = [f"{source} has {error.error_count()} problem(s):"]
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"]) or "(whole config)"
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = f"unknown key; allowed here: {', '.join(_allowed_keys(item['loc']))}"
        elif "input" in item and item["type"] not in ("value_error",):
            msg = f"{msg} (got {item['input']!r})"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        # A cross-field validator reports several problems, one per line.
        lines.extend(f"  - {loc}: {part}" for part in msg.split("\n"))
    return "\n".join(lines)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return list(model.model_fields)


def build_config(
    data: dict[str, Any], overrides: list[str] | None = None, *, source: str = "config", gpus: list[Any] | None = None
) -> RunConfig:
    """Validate raw data (+ overrides) into a RunConfig, or raise ConfigError listing every problem."""
    data = apply_overrides(data, overrides or [])
    try:
        return RunConfig.model_validate(data, context={"gpus": gpus} if gpus else None)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: str | Path, overrides: list[str] | None = None, *, gpus: list[Any] | None = None) -> RunConfig:
    return build_config(load_yaml(path), overrides, source=str(path), gpus=gpus)


def dump_yaml(cfg: RunConfig) -> str:
    """Stable YAML: field order as declared, so load -> dump -> load -> dump is byte-identical."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100)


def field_docs() -> dict[str, str]:
    """'section.field' -> description, for help texts and the README."""
    docs = {}
    for section, field in RunConfig.model_fields.items():
        for name, sub in field.annotation.model_fields.items():
            docs[f"{section}.{name}"] = sub.description or ""
    return docs
