"""Where the app keeps its caches. Pure: no heavy imports."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$FINETUNE_APP_CACHE, else $XDG_CACHE_HOME/finetune_app, else ~/.cache/finetune_app."""
    explicit = os.environ.get("FINETUNE_APP_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "finetune_app"
