"""The README.md model card of an export: what was trained, how, with what memory, and how to load it.

Built from the run's RunConfig and events log with huggingface_hub's ModelCard / ModelCardData.
The card never contains a token: it is made only from the config, the events and version numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from .config import DEMO_MODEL, ModelSection, RunConfig
from .events import measured_peak

DEMO_BASE_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
LOSS_CURVE_FILE = "training_loss.png"
DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")
GIB = 1024**3
ExportKind = Literal["adapter", "merged"]


@dataclass(frozen=True)
class TrainingRecord:
    """The facts about a finished run that the card reports, read from RUN/events.jsonl."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    estimate: dict[str, Any] = field(default_factory=dict)
    measured_peak: dict[str, int] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)
    device: str | None = None


def training_record(events: list[dict[str, Any]]) -> TrainingRecord:
    steps, losses, eval_steps, eval_losses = [], [], [], []
    estimate: dict[str, Any] = {}
    end: dict[str, Any] = {}
    device = None
    for event in events:
        kind = event.get("event")
        if kind == "start":
            estimate = event.get("estimate") or {}
            device = event.get("device")
        elif kind == "log" and isinstance(event.get("loss"), int | float):
            steps.append(int(event.get("step") or len(steps) + 1))
            losses.append(float(event["loss"]))
        elif kind == "eval" and isinstance(event.get("eval_loss"), int | float):
            eval_steps.append(int(event.get("step") or 0))
            eval_losses.append(float(event["eval_loss"]))
        elif kind == "end":
            end = event
    return TrainingRecord(steps, losses, eval_steps, eval_losses, estimate, measured_peak(events), end, device)


def public_base_id(model: ModelSection) -> str | None:
    """The Hub id of the base model if it has one (for card metadata and usage code), else None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    name = model.name_or_path
    if name == DEMO_MODEL:
        return DEMO_BASE_ID
    if name.endswith(".gguf") or os.path.exists(name) or name.count("/") != 1:
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def hub_dataset_id(cfg: RunConfig) -> str | None:
    path = cfg.data.path
    if (
        path.startswith("builtin:")
        or os.path.exists(path)
        or Path(path).suffix in DATA_SUFFIXES
        or path.count("/") != 1
    ):
        return None
    return path


def write_loss_curve(record: TrainingRecord, path: Path) -> bool:
    """Plot training (and eval) loss against steps into a PNG; False when there is nothing to plot."""
    if not record.losses:
        return False
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
    axes.plot(record.steps, record.losses, label="training loss", color="tab:blue")
    if record.eval_losses:
        axes.plot(record.eval_steps, record.eval_losses, "o-", label="eval loss", color="tab:orange")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


def method_description(cfg: RunConfig) -> str:
    q, lora = cfg.quantization, cfg.lora
    if lora.adapter == "none":
        return f"full fine-tune in {cfg.model.dtype}"
    rank = f"LoRA r={lora.r}, alpha={lora.alpha}" + (", rsLoRA" if lora.use_rslora else "")
    if q.load_in == "4bit":
        double = " + double quantization" if q.double_quant else ""
        return f"QLoRA: {rank} on a 4-bit {q.quant_type.upper()}{double} base (compute in {cfg.model.dtype})"
    if q.load_in == "8bit":
        return f"{rank} on an 8-bit (LLM.int8) base"
    return f"{rank} on a {cfg.model.dtype} base"


def build_model_card(
    cfg: RunConfig,
    record: TrainingRecord,
    kind: ExportKind,
    *,
    repo_id: str | None = None,
    merge_check: dict[str, Any] | None = None,
    has_loss_curve: bool = False,
):
    from huggingface_hub import ModelCard, ModelCardData

    base_id = public_base_id(cfg.model)
    dataset_id = hub_dataset_id(cfg)
    data = ModelCardData(
        base_model=base_id,
        datasets=[dataset_id] if dataset_id else None,
        library_name="peft" if kind == "adapter" else "transformers",
        pipeline_tag="text-generation",
        tags=["finetune_app", "trl", "sft", "lora"] + (["qlora"] if cfg.quantization.load_in == "4bit" else []),
        base_model_relation=("adapter" if kind == "adapter" else "finetune") if base_id else None,
    )
    sections = [
        _title(cfg, kind, repo_id, (merge_check or {}).get("dtype", cfg.export.merge_dtype)),
        _usage(kind, repo_id, base_id),
        _training(cfg, record, has_loss_curve),
        _hyperparameters(cfg),
        _memory(record),
        _merge_check(merge_check) if merge_check else "",
        _versions(),
    ]
    body = "\n\n".join(section for section in sections if section)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n")


def _title(cfg: RunConfig, kind: ExportKind, repo_id: str | None, merged_dtype: str) -> str:
    name = repo_id or cfg.output.run_name or "Fine-tuned model"
    base = public_base_id(cfg.model) or Path(cfg.model.name_or_path).name
    what = (
        f"A LoRA adapter for [{base}](https://huggingface.co/{base})"
        if kind == "adapter" and public_base_id(cfg.model)
        else f"A LoRA adapter for {base}"
        if kind == "adapter"
        else f"{base} with its fine-tuned LoRA adapter merged into the weights ({merged_dtype})"
    )
    lines = [f"# {name}", "", f"{what}, trained with finetune_app ({method_description(cfg)})."]
    if cfg.model.name_or_path == DEMO_MODEL:
        lines += [
            "",
            f"The base was the offline demo copy of {DEMO_BASE_ID} (converted from a Q4_1 GGUF), so its "
            "weights differ slightly from the original repository's.",
        ]
    return "\n".join(lines)


def _usage(kind: ExportKind, repo_id: str | None, base_id: str | None) -> str:
    where = repo_id or "path/to/this/folder"
    base = base_id or "path/to/the/base-model"
    if kind == "adapter":
        load = (
            "from peft import PeftModel\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'base = AutoModelForCausalLM.from_pretrained("{base}", dtype="auto")\n'
            f'model = PeftModel.from_pretrained(base, "{where}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")\n'
        )
    else:
        load = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model = AutoModelForCausalLM.from_pretrained("{where}", dtype="auto")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")\n'
        )
    generate = (
        '\nmessages = [{"role": "user", "content": "Hello!"}]\n'
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, "
        'return_tensors="pt", return_dict=True)\n'
        "output = model.generate(**inputs, max_new_tokens=64)\n"
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n'
    )
    return f"## Usage\n\n```python\n{load}{generate}```"


def _training(cfg: RunConfig, record: TrainingRecord, has_loss_curve: bool) -> str:
    data = cfg.data
    dataset = hub_dataset_id(cfg) or (
        f"the built-in `{data.path.split(':', 1)[1]}` dataset of finetune_app"
        if data.path.startswith("builtin:")
        else f"a local file `{Path(data.path).name}`"
    )
    end = record.end
    lines = [
        "## Training",
        "",
        f"- Method: {method_description(cfg)}",
        f"- Base model: `{public_base_id(cfg.model) or Path(cfg.model.name_or_path).name}`",
        f"- Dataset: {dataset} (format {data.format}, split {data.split}"
        + (f", first {data.max_samples} rows" if data.max_samples else "")
        + ")",
        f"- Loss on: {'completion/assistant tokens only' if data.completion_only_loss else 'all tokens'}",
    ]
    if record.steps:
        lines.append(f"- Optimizer steps: {record.steps[-1]}, last logged training loss: {record.losses[-1]:.4f}")
    if record.eval_losses:
        lines.append(f"- Last eval loss: {record.eval_losses[-1]:.4f}")
    if end:
        status = end.get("status", "?")
        runtime = end.get("runtime_seconds")
        lines.append(
            f"- Run status: {status}" + (f", {runtime / 60:.1f} min" if isinstance(runtime, int | float) else "")
        )
    if record.device:
        lines.append(f"- Device: {record.device}")
    if has_loss_curve:
        lines += ["", f"![Training loss]({LOSS_CURVE_FILE})"]
    return "\n".join(lines)


def _hyperparameters(cfg: RunConfig) -> str:
    rows = ["## Hyperparameters", "", "Every setting of the run (its full `config.yaml` is in this folder):", ""]
    rows += ["| setting | value |", "| --- | --- |"]
    for section, values in cfg.model_dump(mode="json").items():
        if section == "output":
            continue
        for key, value in values.items():
            rows.append(f"| `{section}.{key}` | `{value}` |")
    return "\n".join(rows)


def _memory(record: TrainingRecord) -> str:
    estimate = {k: v for k, v in record.estimate.items() if isinstance(v, int | float)}
    if not estimate and not record.measured_peak:
        return ""
    lines = ["## GPU memory", ""]
    if estimate:
        lines += ["Estimated by finetune_app before training (per GPU):", "", "| component | GiB |", "| --- | --- |"]
        lines += [f"| {key} | {value / GIB:.2f} |" for key, value in estimate.items()]
        lines.append("")
    if record.measured_peak:
        lines.append("Measured during training (peak over all logged steps):")
        lines.append("")
        lines += [f"- {key}: {value / GIB:.2f} GiB" for key, value in sorted(record.measured_peak.items())]
    else:
        lines.append("No GPU memory was measured (the run did not use a CUDA GPU).")
    return "\n".join(lines)


def _merge_check(check: dict[str, Any]) -> str:
    verdict = "passed" if check.get("passed") else "FAILED"
    return "\n".join(
        [
            "## Merge check",
            "",
            f"After merging in {check['dtype']} on {check['device']}, the merged model's logits were compared with "
            f"the unmerged base + adapter on {check['prompts']} prompts ({check['tokens']} token positions): "
            f"max |difference| = {check['max_abs_diff']:.3g}, which is {check['relative_diff']:.3g} of the largest "
            f"logit magnitude ({check['logit_scale']:.3g}); tolerance {check['tolerance']:g} for {check['dtype']} "
            f"-> {verdict}. RMS difference {check['rms_relative_diff']:.3g} of the RMS logit; the most likely next "
            f"token agrees at {check['top1_agreement']:.1%} of positions. Figures are in `merge_check.json`.",
        ]
    )


def _versions() -> str:
    names = ["finetune_app", "transformers", "peft", "trl", "torch", "bitsandbytes", "huggingface_hub"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return "## Framework versions\n\n" + ", ".join(found)
