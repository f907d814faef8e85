"""The live memory budget: a MemoryEstimate drawn as one stacked bar per GPU against its VRAM, as HTML.

Computed from the model's config.json only (memory.shape.load_model_shape is cached), so redrawing on every
settings change is instant. Stable element ids (budget-total, budget-verdict) let browser tests read it.
"""

from __future__ import annotations

import html
from typing import Any

from finetune_app.config import RunConfig

GIB = 1 << 30

# (component key in MemoryEstimate.components, label, colour), in the estimator's order.
COMPONENTS = (
    ("weights", "Model weights", "#2563eb"),
    ("quant_constants", "Quantization constants", "#60a5fa"),
    ("lora", "LoRA parameters", "#16a34a"),
    ("gradients", "Gradients", "#f59e0b"),
    ("optimizer", "Optimizer states", "#dc2626"),
    ("activations", "Activations", "#9333ea"),
    ("logits", "Logits / loss", "#db2777"),
    ("temporaries", "Temporaries", "#a16207"),
    ("allocator_overhead", "Allocator overhead", "#64748b"),
    ("cuda_context", "CUDA context", "#1f2937"),
)
VERDICT_TEXT = {"fits": "Fits", "tight": "Tight", "does_not_fit": "Does not fit", "unknown": "No GPU to compare"}

CSS = """
#budget-column { position: sticky; top: 8px; align-self: flex-start; }
#preset-row button { margin-top: 2.6em; }
#config-errors pre { color: #b91c1c; white-space: pre-wrap; }
#budget-panel .budget-head { font-size: 1.05em; margin-bottom: .4em; }
#budget-total { font-weight: 700; font-size: 1.35em; }
.verdict { display: inline-block; padding: .1em .6em; border-radius: 1em; font-weight: 700; color: white; }
.verdict-fits { background: #16a34a; } .verdict-tight { background: #d97706; }
.verdict-does_not_fit { background: #dc2626; } .verdict-unknown { background: #64748b; }
.gpu-row { margin: .5em 0; }
.gpu-label { font-size: .9em; display: flex; justify-content: space-between; }
.bar { position: relative; display: flex; height: 26px; border-radius: 4px; overflow: hidden;
       background: repeating-linear-gradient(45deg, #e5e7eb, #e5e7eb 6px, #f3f4f6 6px, #f3f4f6 12px); }
.bar .seg { height: 100%; }
.bar .vram-line { position: absolute; top: 0; bottom: 0; width: 3px; background: #111827; }
.legend { display: grid; grid-template-columns: auto 1fr auto; gap: .1em .6em; font-size: .88em; margin-top: .5em; }
.legend .sw { width: .9em; height: .9em; border-radius: 2px; display: inline-block; margin-top: .2em; }
.legend .val { text-align: right; font-variant-numeric: tabular-nums; }
.budget-notes { font-size: .8em; color: #6b7280; margin-top: .5em; }
.budget-error { color: #b91c1c; }
#run-status .run-bar { height: 10px; background: #e5e7eb; border-radius: 5px; margin: .4em 0; }
#run-status .run-bar-fill { height: 100%; background: #2563eb; border-radius: 5px; transition: width .5s; }
#run-status[data-state=completed] .run-bar-fill { background: #16a34a; }
#run-status[data-state=failed] .run-bar-fill, #run-status[data-state=stopped] .run-bar-fill { background: #d97706; }
.run-stats th { text-align: left; padding-right: 1em; font-weight: 500; color: #4b5563; }
.tok-train { background: #bbf7d0; } .tok-ctx { color: #6b7280; }
#data-preview pre { white-space: pre-wrap; font-size: .85em; }
.preview-item { border: 1px solid #e5e7eb; border-radius: 6px; padding: .4em; margin: .4em 0; }
.preview-info, .preview-note { font-size: .85em; color: #4b5563; }
.preview-error { color: #b91c1c; }
"""


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _bar(components: dict[str, int], vram: int | None) -> str:
    total = sum(components.values())
    scale = max(total, vram or 0) * 1.02 or 1
    segments = "".join(
        f'<div class="seg" style="width:{100 * components.get(key, 0) / scale:.3f}%;background:{colour}" '
        f'title="{label}: {gib(components.get(key, 0))}"></div>'
        for key, label, colour in COMPONENTS
        if components.get(key, 0) > 0
    )
    line = f'<div class="vram-line" style="left:{100 * vram / scale:.3f}%" title="VRAM"></div>' if vram else ""
    return f'<div class="bar">{segments}{line}</div>'


def budget_html(estimate: Any, gpus: list[Any], verdict: str, note_lines: list[str] | None = None) -> str:
    """The stacked bars (one per GPU the run uses), the total, the verdict, the legend and the notes.

    `gpus` are hardware.GPUInfo (`.name`, `.total_bytes`); empty = nothing to compare with.
    """
    components = dict(estimate.components)
    total = estimate.total
    used = gpus[: max(estimate.num_gpus, 1)] if gpus else []
    vram_text = f" of {gib(used[0].total_bytes)}" if used else ""
    head = (
        f'<div class="budget-head">Memory per GPU: <span id="budget-total" data-bytes="{total}">{gib(total)}</span>'
        f'{vram_text} &nbsp; <span id="budget-verdict" class="verdict verdict-{verdict}" '
        f'data-verdict="{verdict}">{VERDICT_TEXT.get(verdict, verdict)}</span></div>'
    )
    rows = []
    for index, gpu in enumerate(used or [None]):
        vram = gpu.total_bytes if gpu is not None else None
        label = f"GPU {index} · {html.escape(gpu.name)}" if gpu is not None else "Estimated use (no GPU to compare)"
        right = f"{gib(total)} / {gib(vram)}" if vram else gib(total)
        rows.append(
            f'<div class="gpu-row"><div class="gpu-label"><span>{label}</span><span>{right}</span></div>'
            f"{_bar(components, vram)}</div>"
        )
    if len(used) < estimate.num_gpus:
        rows.append(
            f'<div class="budget-error">The run uses {estimate.num_gpus} GPUs but only {len(used)} are '
            "planned: raise the GPU count in tab 1 or lower distributed.num_processes.</div>"
        )
    legend = "".join(
        f'<span class="sw" style="background:{colour}"></span><span>{label}</span>'
        f'<span class="val">{gib(components.get(key, 0))}</span>'
        for key, label, colour in COMPONENTS
    )
    peaks = (
        f"PyTorch peak allocated {gib(estimate.allocated_peak)}, reserved {gib(estimate.reserved_peak)}; "
        "the total adds the CUDA context (what nvidia-smi shows)."
    )
    notes = [peaks, *(note_lines or []), *estimate.notes]
    notes_html = "".join(f"<div>• {html.escape(note)}</div>" for note in notes)
    return (
        f'<div id="budget" data-total="{total}">{head}{"".join(rows)}'
        f'<div class="legend">{legend}</div><div class="budget-notes">{notes_html}</div></div>'
    )


def error_html(message: str) -> str:
    return (
        '<div id="budget"><div class="budget-head">Memory per GPU: <span id="budget-total" data-bytes="">?</span> '
        '<span id="budget-verdict" class="verdict verdict-unknown" data-verdict="unknown">unknown</span></div>'
        f'<div class="budget-error">{html.escape(message)}</div></div>'
    )


def _shape(cfg: RunConfig):
    from finetune_app.memory.shape import load_model_shape

    return load_model_shape(cfg.model.name_or_path, cfg.model.revision)  # cached by the shape module


def _flash(gpus: list[Any]) -> bool:
    return bool(gpus) and all(gpu.flash_attention for gpu in gpus)


def render(cfg: RunConfig, gpus: list[Any], max_suggestions: int = 4) -> tuple[str, str]:
    """(budget HTML, advice markdown) for cfg on the planned GPUs. Never raises: problems are shown instead."""
    from finetune_app.config import hardware_problems
    from finetune_app.memory import advice
    from finetune_app.memory.estimator import estimate_memory
    from finetune_app.memory.shape import ShapeError

    try:
        shape = _shape(cfg)
        estimate = estimate_memory(cfg, shape, flash_available=_flash(gpus))
        tips = advice.suggestions(cfg, shape, gpus_available=len(gpus), flash_available=_flash(gpus))
    except ShapeError as exc:
        return error_html(f"Cannot size {cfg.model.name_or_path}: {exc}"), ""
    used = gpus[: max(estimate.num_gpus, 1)]
    verdicts = [advice.verdict(estimate, gpu.total_bytes) for gpu in used]
    order = ("fits", "tight", "does_not_fit")
    status = max((v.status for v in verdicts), key=order.index) if verdicts else "unknown"
    warnings = [f"Warning: {problem}" for problem in (hardware_problems(cfg, used) if used else [])]
    page = budget_html(estimate, used, status, [*warnings, model_line(shape)])
    return page, advice_markdown(status, verdicts, sorted(tips, key=lambda t: -t.saving)[:max_suggestions])


def model_line(shape: Any) -> str:
    return (
        f"Model: {shape.model_type}, {shape.total_params / 1e9:.2f} B parameters, {shape.num_layers} layers, "
        f"hidden size {shape.hidden_size}, vocabulary {shape.vocab_size:,} (from its config.json; no weights loaded)."
    )


def advice_markdown(status: str, verdicts: list[Any], tips: list[Any]) -> str:
    lines = []
    if status == "unknown":
        lines.append("Pick a GPU to plan for in tab 1 to see whether this fits.")
    elif status == "fits":
        spare = min(v.headroom for v in verdicts)
        lines.append(f"**Fits**, with {gib(spare)} to spare on the smallest GPU.")
    elif status == "tight":
        lines.append("**Tight**: within 7% of the GPU's memory. It may run out of memory; consider a saving below.")
    else:
        short = -min(v.headroom for v in verdicts)
        lines.append(f"**Does not fit**: {gib(short)} too much. Press *Fit to my GPU*, or apply a change below.")
    if tips:
        lines.append("\n**Ways to save memory** (each on its own):")
        lines += [f"- {tip.title}: **−{tip.saving / GIB:.2f} GiB** ({tip.cost})" for tip in tips]
    return "\n".join(lines)


def fit(cfg: RunConfig, gpus: list[Any]) -> tuple[RunConfig | None, str]:
    """advice.fit_to_gpu on the smallest planned GPU: (changed config, what was done) or (None, why not)."""
    from finetune_app.memory import advice
    from finetune_app.memory.shape import ShapeError

    if not gpus:
        return None, "Pick a GPU to plan for in tab 1 first."
    try:
        shape = _shape(cfg)
    except ShapeError as exc:
        return None, f"Cannot size {cfg.model.name_or_path}: {exc}"
    smallest = min(gpus, key=lambda gpu: gpu.total_bytes)
    result = advice.fit_to_gpu(cfg, shape, smallest.total_bytes, gpus_available=len(gpus), flash_available=_flash(gpus))
    total = f"{gib(result.estimate.total)} of {gib(smallest.total_bytes)} ({smallest.name})"
    if not result.applied:
        if result.verdict.fits:
            return None, f"Already fits: {total}. Nothing changed."
        return None, f"Nothing in the settings can make this fit: {total}. Use a smaller model or a bigger GPU."
    changes = "; ".join(f"{s.title} (−{s.saving / GIB:.2f} GiB)" for s in result.applied)
    outcome = "now fits" if result.verdict.fits else f"still {result.verdict.status.replace('_', ' ')}"
    return result.config, f"**Fit to my GPU** applied: {changes}. Estimated {total}: {outcome}."
