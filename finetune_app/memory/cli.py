"""`python -m finetune_app estimate PRESET ...` and `python -m finetune_app gpus`.

Without a detected GPU and without --gpu / --gpu-memory, `estimate` plans for a 24 GiB GPU and says so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from ..config import ConfigError, build_config, load_yaml
from .shape import ShapeError

EXIT_BAD_INPUT = 2
DEFAULT_PLAN_BYTES = 24 * (1 << 30)
GiB = 1 << 30


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help="YAML preset (presets/NAME.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. lora.r=32")
    parser.add_argument(
        "--gpus",
        type=int,
        help="GPUs for the run (sets distributed.num_processes; >1 needs a "
        "distributed.strategy, FSDP is chosen when the preset says single)",
    )
    parser.add_argument("--gpu-memory", help="memory of each GPU, e.g. 24GiB, 80GB, 16000MiB")
    parser.add_argument("--gpu", help="plan for a catalogue GPU, e.g. 'RTX 4090' (see `gpus --catalogue`)")
    parser.add_argument("--json", action="store_true", help="print bytes as JSON")
    parser.add_argument("--fit", action="store_true", help="apply the cheapest changes that make it fit")
    parser.add_argument(
        "--measure",
        action="store_true",
        help="run 3 real training steps on this GPU and compare measured with estimated",
    )


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]i?b?|b)?\s*", text.lower())
    if not match:
        raise ValueError(f"cannot read memory size {text!r}; write e.g. 24GiB, 80GB or 16000MiB")
    number, unit = float(match.group(1)), (match.group(2) or "gib")
    base = 1024 if "i" in unit or unit in ("k", "m", "g", "t") else 1000
    power = {"b": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[0]]
    return int(number * base**power)


def _plan_target(args, gpus_detected) -> tuple[int, str, Any | None]:
    """(bytes per GPU, description, GPUInfo or None)."""
    from ..hardware import catalogue_gpu

    if args.gpu:
        gpu = catalogue_gpu(args.gpu)
        size = parse_size(args.gpu_memory) if args.gpu_memory else gpu.total_bytes
        return size, f"{gpu.name} ({size / GiB:.1f} GiB)", gpu
    if args.gpu_memory:
        size = parse_size(args.gpu_memory)
        return size, f"{size / GiB:.1f} GiB per GPU (given)", None
    if gpus_detected:
        gpu = gpus_detected[0]
        return gpu.total_bytes, f"{gpu.name} ({gpu.total_bytes / GiB:.1f} GiB, detected)", gpu
    return DEFAULT_PLAN_BYTES, "24.0 GiB per GPU (no NVIDIA GPU detected; pass --gpu or --gpu-memory)", None


def run_estimate(args: argparse.Namespace) -> int:
    from ..hardware import detect_hardware
    from .advice import fit_to_gpu, suggestions, verdict
    from .estimator import estimate_memory
    from .shape import load_model_shape

    overrides = list(args.overrides)
    if args.gpus:
        overrides.append(f"distributed.num_processes={args.gpus}")
    try:
        data = load_yaml(args.preset)
        if args.gpus and args.gpus > 1 and (data.get("distributed") or {}).get("strategy", "single") == "single":
            overrides.append("distributed.strategy=fsdp")
        cfg = build_config(data, overrides, source=args.preset)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    detected = [] if (args.gpu or args.gpu_memory) else detect_hardware().gpus
    try:
        gpu_bytes, target, gpu = _plan_target(args, detected)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.measure:
        return _measure(cfg, detected)
    if gpu is not None:
        from ..config import hardware_problems

        for problem in hardware_problems(cfg, [gpu]):
            print(f"warning: on {gpu.name} this run would be refused: {problem}", file=sys.stderr)
    flash = bool(gpu and gpu.flash_attention)
    try:
        shape = load_model_shape(cfg.model.name_or_path, cfg.model.revision)
        estimate = estimate_memory(cfg, shape, flash_available=flash)
    except ShapeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    gpus_available = max(len(detected), cfg.world_size, args.gpus or 1)
    result = verdict(estimate, gpu_bytes)
    advice = [] if result.fits else suggestions(cfg, shape, gpus_available=gpus_available, flash_available=flash)
    fitted = (
        fit_to_gpu(cfg, shape, gpu_bytes, gpus_available=gpus_available, flash_available=flash)
        if args.fit and not result.fits
        else None
    )
    if args.json:
        print(json.dumps(_as_json(estimate, result, advice, fitted, target), indent=2))
    else:
        _print_table(cfg, estimate, result, advice, fitted, target)
    return 0


def _as_json(estimate, result, advice, fitted, target) -> dict[str, Any]:
    out = {
        **estimate.to_dict(),
        "per_gpu": True,
        "target": target,
        "gpu_bytes": result.gpu_bytes,
        "verdict": result.status,
        "suggestions": [
            {"title": s.title, "overrides": list(s.overrides), "saving": s.saving, "cost": s.cost} for s in advice
        ],
    }
    if fitted is not None:
        out["fit"] = {
            "overrides": [o for s in fitted.applied for o in s.overrides],
            "verdict": fitted.verdict.status,
            "total": fitted.estimate.total,
        }
    return out


def _print_table(cfg, estimate, result, advice, fitted, target) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"Memory per GPU: {cfg.model.name_or_path} ({estimate.num_gpus} GPU(s), plan: {target})")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    for name, value in estimate.components.items():
        table.add_row(name.replace("_", " "), f"{value / GiB:.2f}", f"{value / estimate.total:.0%}")
    table.add_section()
    table.add_row("allocated peak (torch)", f"{estimate.allocated_peak / GiB:.2f}", "")
    table.add_row("reserved peak (torch)", f"{estimate.reserved_peak / GiB:.2f}", "")
    table.add_row("[bold]total per GPU (nvidia-smi)", f"[bold]{estimate.total / GiB:.2f}", "")
    console.print(table)
    colour = {"fits": "green", "tight": "yellow", "does_not_fit": "red"}[result.status]
    console.print(
        f"verdict: [{colour}]{result.status}[/] ({result.total / GiB:.2f} of {result.gpu_bytes / GiB:.2f} "
        f"GiB, headroom {result.headroom / GiB:+.2f} GiB)"
    )
    for note in estimate.notes:
        console.print(f"  note: {note}", style="dim")
    if advice:
        console.print("to make it fit, each saves on its own:")
        for s in advice:
            console.print(f"  - {s.title}: -{s.saving / GiB:.2f} GiB ({s.cost}): {' '.join(s.overrides)}")
    if fitted is not None:
        overrides = " ".join(o for s in fitted.applied for o in s.overrides)
        console.print(f"--fit: {fitted.verdict.status} at {fitted.estimate.total / GiB:.2f} GiB with: {overrides}")


def _measure(cfg, detected) -> int:
    if not detected:
        print(
            "error: --measure runs real training steps and needs an NVIDIA GPU; none was detected. "
            "Drop --measure to get the estimate.",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    import tempfile
    from pathlib import Path

    from ..events import measured_peak, read_events
    from ..runner import run_training
    from .estimator import estimate_memory
    from .shape import load_model_shape

    cfg = build_config(
        cfg.model_dump(mode="json"), ["training.max_steps=3", "training.logging_steps=1", "training.save_steps=1000"]
    )
    estimate = estimate_memory(
        cfg, load_model_shape(cfg.model.name_or_path, cfg.model.revision), flash_available=detected[0].flash_attention
    )
    with tempfile.TemporaryDirectory(prefix="finetune-measure-") as tmp:
        run_training(cfg, Path(tmp) / "run")
        peak = measured_peak(read_events(Path(tmp) / "run"))
    if "reserved_peak" not in peak:
        print("error: the run logged no GPU memory", file=sys.stderr)
        return 1
    measured = {key: peak.get(key, 0) for key in ("allocated_peak", "reserved_peak", "nvml_used")}
    rows = [
        ("allocated_peak", estimate.allocated_peak),
        ("reserved_peak", estimate.reserved_peak),
        ("nvml_used", estimate.total),
    ]
    print(f"{'metric':<16}{'measured GiB':>14}{'estimated GiB':>15}{'error':>9}")
    for key, value in rows:
        m = measured[key]
        error = f"{(value - m) / m:+.1%}" if m else "n/a"
        print(f"{key:<16}{m / GiB:>14.2f}{value / GiB:>15.2f}{error:>9}")
    return 0


def add_gpus_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print as JSON")
    parser.add_argument("--catalogue", action="store_true", help="also list the GPUs known for planning")


def run_gpus(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..hardware import GPU_CATALOGUE, detect_hardware

    info = detect_hardware()
    if args.json:
        out: dict[str, Any] = asdict(info)
        for gpu, item in zip(info.gpus, out["gpus"], strict=True):
            item.update(bf16=gpu.bf16, flash_attention_capable=gpu.flash_attention_capable)
        if args.catalogue:
            out["catalogue"] = {
                name: {"total_bytes": g.total_bytes, "compute_capability": g.compute_capability, "bf16": g.bf16}
                for name, g in GPU_CATALOGUE.items()
            }
        print(json.dumps(out, indent=2))
        return 0
    if not info.gpus:
        print("no NVIDIA GPU detected")
    for gpu in info.gpus:
        major, minor = gpu.compute_capability
        print(
            f"GPU {gpu.index}: {gpu.name}, {gpu.total_bytes / GiB:.1f} GiB ({gpu.free_bytes / GiB:.1f} free), "
            f"compute capability {major}.{minor}, bf16 {'yes' if gpu.bf16 else 'no'}, "
            f"FlashAttention-2 {'yes' if gpu.flash_attention else 'no'}"
        )
    if info.driver_version:
        print(f"driver {info.driver_version}, CUDA {info.cuda_version}")
    print(f"CPU RAM: {info.cpu_ram_total / GiB:.1f} GiB ({info.cpu_ram_available / GiB:.1f} available)")
    if args.catalogue:
        print("catalogue (for --gpu):")
        for name, g in GPU_CATALOGUE.items():
            print(f"  {name}: {g.total_bytes / GiB:.1f} GiB, cc {g.compute_capability[0]}.{g.compute_capability[1]}")
    return 0
