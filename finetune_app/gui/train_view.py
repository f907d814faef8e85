"""What the Train tab shows for a job: status line, numbers, loss curve data. Pure functions, no gradio."""

from __future__ import annotations

import html
from typing import Any

from finetune_app.config import RunConfig
from finetune_app.gui.jobs import Job, RunProgress

STATE_TEXT = {
    "running": "Training",
    "stopping": "Stopping: saving a checkpoint and the adapter",
    "completed": "Finished",
    "stopped": "Stopped",
    "failed": "Failed",
}


def gb(value: float | int | None) -> str:
    return "–" if value is None else f"{value / (1 << 30):.2f} GiB"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def status_html(job: Job | None, state: str | None) -> str:
    """One headline with data-state for tests, a progress bar and what to do next."""
    if job is None or state is None:
        return (
            '<div id="run-status" data-state="idle"><b>No training run yet.</b> '
            "Check the settings and the memory budget, then press <i>Start training</i>.</div>"
        )
    progress = job.progress
    headline = STATE_TEXT.get(state, state)
    detail = ""
    if state == "completed":
        detail = (
            f"The adapter is saved in <code>{html.escape(str(progress.adapter_path))}</code>. Try it in the next tab."
        )
    elif state == "stopped":
        if progress.adapter_path:
            detail = f"The adapter so far is saved in <code>{html.escape(str(progress.adapter_path))}</code>."
        else:
            detail = "The run was stopped before it could save anything."
    elif state == "failed":
        reason = progress.error or "the training process ended without finishing; see the log below"
        detail = f"<pre class='run-error'>{html.escape(reason)}</pre>"
    elif not progress.total_steps:
        detail = "Preparing: loading the model and the data ..."
    step_text = f"step {progress.step} / {progress.total_steps}" if progress.total_steps else ""
    percent = round(100 * progress.fraction)
    return (
        f'<div id="run-status" data-state="{state}">'
        f'<div class="run-headline"><b>{headline}</b> <span class="run-step">{step_text}</span></div>'
        f'<div class="run-bar"><div class="run-bar-fill" style="width:{percent}%"></div></div>'
        f'<div class="run-dir">Run folder: <code>{html.escape(str(job.run_dir))}</code></div>'
        f"<div>{detail}</div></div>"
    )


def stats_html(progress: RunProgress) -> str:
    rows = [
        ("Step", f"{progress.step} / {progress.total_steps or '?'}"),
        ("Epoch", "–" if progress.epoch is None else f"{progress.epoch:.2f}"),
        ("Last loss", "–" if not progress.losses else f"{progress.losses[-1][1]:.4f}"),
        ("Last eval loss", "–" if not progress.eval_losses else f"{progress.eval_losses[-1][1]:.4f}"),
        ("Learning rate", "–" if progress.learning_rate is None else f"{progress.learning_rate:.2e}"),
        ("Tokens / s", "–" if progress.tokens_per_second is None else f"{progress.tokens_per_second:,.0f}"),
        ("Time left (ETA)", duration(progress.eta_seconds)),
        ("Device", html.escape(str(progress.device or "–"))),
    ]
    rows += memory_rows(progress)
    body = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    return f'<table class="run-stats" id="run-stats">{body}</table>'


def memory_rows(progress: RunProgress) -> list[tuple[str, str]]:
    """Measured peak next to the estimate: the check of the memory budget on real hardware."""
    estimate = progress.estimate or {}
    measured = progress.peak_memory
    out = []
    for key, est_key, label in (
        ("nvml_used", "total", "GPU memory used (nvidia-smi)"),
        ("reserved_peak", "reserved_peak", "Reserved by PyTorch, peak"),
        ("allocated_peak", "allocated_peak", "Allocated by tensors, peak"),
    ):
        if key in measured:
            out.append((label, f"{gb(measured[key])} (estimated {gb(_estimate_value(estimate, est_key))})"))
    if not out:
        estimated = _estimate_value(estimate, "total")
        out.append(("GPU memory", f"estimated {gb(estimated)}; measured only on a GPU" if estimated else "–"))
    if "host_rss" in measured:
        out.append(("CPU RAM of the training process, peak", gb(measured["host_rss"])))
    return out


def _estimate_value(estimate: dict[str, Any], key: str) -> float | None:
    """A figure of the estimate the runner recorded in its start event (MemoryEstimate.to_dict())."""
    value = estimate.get(key)
    return value if isinstance(value, int | float) else None


def loss_figure(progress: RunProgress):
    """The training (and eval) loss curve as a matplotlib Figure (rendered server-side: robust and cheap)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3), dpi=100, layout="tight")
    axes = figure.add_subplot()
    for points, label, colour, marker in (
        (progress.losses, "training loss", "#2563eb", None),
        (progress.eval_losses, "eval loss", "#f97316", "o"),
    ):
        if points:
            steps, values = zip(*points, strict=True)
            axes.plot(steps, values, label=label, color=colour, marker=marker, linewidth=1.6)
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.grid(alpha=0.3)
    if progress.total_steps:
        axes.set_xlim(0, progress.total_steps)
    if progress.losses or progress.eval_losses:
        axes.legend(loc="upper right")
    else:
        axes.text(
            0.5,
            0.5,
            "the loss appears here after the first steps",
            ha="center",
            va="center",
            transform=axes.transAxes,
            color="#6b7280",
        )
    return figure


def summary_markdown(cfg: RunConfig) -> str:
    """What pressing Start will train, in one line."""
    t = cfg.training
    length = f"{t.max_steps} steps" if t.max_steps > 0 else f"{t.num_epochs:g} epoch(s)"
    method = {"4bit": "QLoRA (4-bit base)", "8bit": "LoRA on an 8-bit base", "none": "LoRA"}[cfg.quantization.load_in]
    method += f" rank {cfg.lora.r}"
    if cfg.lora.adapter == "none":
        method = "a full fine-tune"
    return (
        f"**Will train** `{cfg.model.name_or_path}` on `{cfg.data.path}` with {method}, "
        f"{length}, batch {t.micro_batch_size} × {t.gradient_accumulation_steps} accumulation, "
        f"max_length {t.max_length}. Change it in tab 2."
    )
