"""Command line: `python -m finetune_app COMMAND ...` (also the `finetune-app` console script).

Each command module exposes `add_<name>_arguments(parser)` and `run_<name>(args) -> int`; this file
only wires them together. Heavy libraries are imported by the commands that need them.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from .config import ConfigError, RunConfig, build_config, load_config, load_yaml

EXIT_BAD_INPUT = 2


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", nargs="?", help="YAML preset (presets/NAME.yaml); optional with --resume")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. training.learning_rate=1e-4 lora.r=32"
    )
    parser.add_argument(
        "--set",
        dest="set_overrides",
        action="append",
        default=[],
        metavar="key=value",
        help="same as a positional override (repeatable)",
    )
    parser.add_argument("--run-dir", type=Path, help="run directory (default: output.dir/output.run_name)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir (or the preset's run dir) from its last checkpoint",
    )


def run_train(args: argparse.Namespace) -> int:
    from .runner import RunError

    overrides = list(args.overrides) + list(args.set_overrides)
    try:
        cfg, run_dir = resolve_train_target(args.preset, overrides, args.run_dir, args.resume)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if cfg.world_size > 1 and not _inside_distributed_launch():
        from .launch import launch_distributed

        return launch_distributed(cfg, run_dir, resume=args.resume)
    _restrict_visible_gpus(cfg)
    from .runner import run_training

    try:
        result = run_training(cfg, run_dir, resume=args.resume)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # data, model source, OOM ...: the message, not a traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"(the full traceback is in {Path(run_dir) / 'error.log'})", file=sys.stderr)
        return 1
    print(f"{result.status}: {result.output_path}")
    return 0


def resolve_train_target(
    preset: str | None, overrides: list[str], run_dir: Path | None, resume: bool
) -> tuple[RunConfig, Path]:
    """The validated config and the run directory of a `train` command. Raises ConfigError."""
    if preset and "=" in preset:
        overrides = [preset, *overrides]
        preset = None
    if preset is None:
        if not (resume and run_dir):
            raise ConfigError("train needs a preset (presets/NAME.yaml), or --resume --run-dir RUN_DIR")
        cfg = load_config(run_dir / "config.yaml", overrides, gpus=_gpus_or_none())
        return cfg, run_dir
    cfg = load_config(preset, overrides, gpus=_gpus_or_none())
    if run_dir is None and resume and not cfg.output.run_name:
        raise ConfigError("--resume needs the run to continue: pass --run-dir RUN_DIR (or set output.run_name)")
    if run_dir is None:
        name = cfg.output.run_name or f"{Path(preset).stem}-{datetime.now():%Y%m%d-%H%M%S}"
        run_dir = Path(cfg.output.dir) / name
    return cfg, run_dir


def _gpus_or_none():
    """Detected GPUs, so that validation can refuse what this hardware cannot do (e.g. bf16 on a T4)."""
    from .hardware import detect_hardware

    return detect_hardware().gpus or None


def _restrict_visible_gpus(cfg: RunConfig) -> None:
    """A single-process run on distributed.gpu_ids=[k] sees only GPU k (as cuda:0), before torch starts."""
    import os

    if cfg.distributed.strategy == "single" and cfg.distributed.gpu_ids and "torch" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in cfg.distributed.gpu_ids)


def _inside_distributed_launch() -> bool:
    import os

    return "LOCAL_RANK" in os.environ


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help="YAML preset to check")
    parser.add_argument("overrides", nargs="*", metavar="key=value")


def run_validate(args: argparse.Namespace) -> int:
    from .config import dump_yaml

    try:
        cfg = build_config(load_yaml(args.preset), args.overrides, source=args.preset)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(dump_yaml(cfg), end="")
    return 0


def add_gui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser window")


def run_gui(args: argparse.Namespace) -> int:
    from .gui.app import launch

    launch(port=args.port, open_browser=not args.no_browser)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .export import add_export_arguments, run_export
    from .memory.cli import add_estimate_arguments, add_gpus_arguments, run_estimate, run_gpus

    parser = argparse.ArgumentParser(
        prog="python -m finetune_app",
        description="QLoRA fine-tuning with a live memory budget. Run without a command for the GUI "
        "(python launcher.py).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    table = [
        ("train", "train from a YAML preset, headless", add_train_arguments, run_train),
        (
            "estimate",
            "itemized GPU memory budget of a preset, verdict and advice",
            add_estimate_arguments,
            run_estimate,
        ),
        ("gpus", "detected GPUs and CPU memory", add_gpus_arguments, run_gpus),
        ("export", "save / merge / push the result of a run", add_export_arguments, run_export),
        ("validate", "check a preset and print it fully resolved", add_validate_arguments, run_validate),
        ("gui", "open the Gradio app", add_gui_arguments, run_gui),
    ]
    for name, help_text, add_arguments, run in table:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        add_arguments(sub)
        sub.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may also come after options (`train P --run-dir D lora.r=8`).
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    return args.run(args)
