"""Presets as the GUI sees them: list, load, save, and the equivalent headless command line."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from finetune_app.atomic import atomic_write_text
from finetune_app.config import ConfigError, RunConfig, build_config, dump_yaml, load_config
from finetune_app.gui.widgets import override_args

_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*$")


def presets_dir() -> Path:
    """$FINETUNE_APP_PRESETS, else the presets/ folder next to the package (the repository's)."""
    explicit = os.environ.get("FINETUNE_APP_PRESETS")
    if explicit:
        return Path(explicit).expanduser()
    return Path(__file__).resolve().parents[2] / "presets"


def list_presets(folder: Path | None = None) -> list[str]:
    folder = folder or presets_dir()
    if not folder.is_dir():
        return []
    return sorted(path.stem for path in folder.glob("*.yaml"))


def preset_path(name: str, folder: Path | None = None) -> Path:
    return (folder or presets_dir()) / f"{name}.yaml"


def load_preset(name: str, folder: Path | None = None) -> RunConfig:
    """Raises ConfigError with the preset's problems."""
    return load_config(preset_path(name, folder))


def save_preset(cfg: RunConfig, name: str, folder: Path | None = None) -> Path:
    name = name.strip().removesuffix(".yaml")
    if not _NAME.match(name):
        raise ConfigError(
            f"preset name {name!r} is not usable as a file name: use letters, digits, '-', '_' or '.', e.g. my-run"
        )
    path = preset_path(name, folder)
    if path.exists():
        raise ConfigError(f"preset {name!r} exists already ({path}); choose another name so it is not overwritten")
    atomic_write_text(path, dump_yaml(cfg))
    return path


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def headless_commands(cfg: RunConfig, preset: str | None, folder: Path | None = None) -> str:
    """The two equivalent command lines that run exactly these settings without the GUI."""
    base_cfg = None
    if preset:
        try:
            base_cfg = load_preset(preset, folder)
        except ConfigError:
            base_cfg = None
    if base_cfg is None:
        # Without a preset the overrides are relative to an empty YAML file (= all defaults).
        base_cfg = build_config({})
        path_text = "SETTINGS.yaml"
        note = "# save these settings as a preset first (or put {} in SETTINGS.yaml: the defaults)\n"
    else:
        path_text = _display_path(preset_path(preset, folder))
        note = ""
    overrides = override_args(cfg, base_cfg)
    quoted = [shlex.quote(arg) for arg in overrides]
    train = " ".join(["python -m finetune_app train", shlex.quote(path_text), *quoted])
    launcher = " ".join(["python launcher.py --preset", shlex.quote(path_text), *(f"--set {q}" for q in quoted)])
    return f"{note}{train}\n# or\n{launcher}"
