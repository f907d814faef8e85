"""The Hardware tab: detected GPUs as HTML, and the GPUs the memory budget is planned for.

Without a GPU the user picks one from hardware.GPU_CATALOGUE (and a count) to plan for; training still runs
on the CPU. Detection goes through hardware.detect_hardware (NVML, no torch) and is cached until Refresh.
"""

from __future__ import annotations

import html
import threading
from typing import Any

from finetune_app import hardware

THIS_MACHINE = "This computer's GPUs"
PLANNING_DEFAULT = "RTX 4090"  # a common card to plan for when this computer has none
GIB = 1 << 30

_lock = threading.Lock()
_cached: Any = None


def detect(refresh: bool = False):
    """The detected HardwareInfo (cached; refresh=True asks NVML again)."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            _cached = hardware.detect_hardware()
        return _cached


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def hardware_html(info) -> str:
    rows = []
    for gpu in info.gpus:
        major, minor = gpu.compute_capability
        rows.append(
            f"<tr><td>{gpu.index}</td><td>{html.escape(gpu.name)}</td><td>{gpu.total_bytes / GIB:.1f} GiB</td>"
            f"<td>{gpu.free_bytes / GIB:.1f} GiB</td><td>{major}.{minor}</td><td>{_yes(gpu.bf16)}</td>"
            f"<td>{_flash_text(gpu)}</td></tr>"
        )
    ram = f"CPU RAM: {info.cpu_ram_total / GIB:.1f} GiB ({info.cpu_ram_available / GIB:.1f} GiB free)"
    if not rows:
        return (
            '<div id="hardware-info" data-gpus="0"><p><b>No NVIDIA GPU was found on this computer.</b> '
            "You can still train the small demo model on the CPU (slowly, a few minutes), and plan a real run: "
            "pick the GPU you want to use below and the memory budget shows whether your settings fit it.</p>"
            f"<p>{ram}</p></div>"
        )
    versions = f"NVIDIA driver {info.driver_version or '?'} · CUDA {info.cuda_version or '?'}"
    table = (
        "<table><tr><th>#</th><th>GPU</th><th>VRAM</th><th>free</th><th>compute capability</th>"
        "<th>bf16</th><th>FlashAttention-2</th></tr>" + "".join(rows) + "</table>"
    )
    return f'<div id="hardware-info" data-gpus="{len(info.gpus)}">{table}<p>{versions}</p><p>{ram}</p></div>'


def _flash_text(gpu) -> str:
    if gpu.flash_attention:
        return "yes"
    return (
        "supported, flash-attn not installed" if gpu.flash_attention_capable else "no (needs compute capability 8.0+)"
    )


def target_choices(info) -> list[str]:
    names = list(hardware.GPU_CATALOGUE)
    return ([THIS_MACHINE] if info is not None and info.gpus else []) + names


def default_target(info) -> str:
    if info is not None and info.gpus:
        return THIS_MACHINE
    return PLANNING_DEFAULT if PLANNING_DEFAULT in hardware.GPU_CATALOGUE else next(iter(hardware.GPU_CATALOGUE))


def plan_gpus(choice: str | None, count: float | int | None) -> list[Any]:
    """The GPUs the budget is drawn against: the detected ones, or `count` copies of a catalogue GPU."""
    gpu = hardware.GPU_CATALOGUE.get(choice or "")
    if gpu is None:  # THIS_MACHINE (or a stale choice)
        return list(detect().gpus)
    return [gpu] * max(1, int(count or 1))
