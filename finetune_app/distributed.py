"""Multi-GPU: the SFTConfig arguments for DDP/FSDP. Launch commands live in launch.py."""

from __future__ import annotations

from typing import Any

from .config import RunConfig


def sft_distributed_args(cfg: RunConfig) -> dict[str, Any]:
    """Extra SFTConfig kwargs for the strategy (empty for single and DDP: accelerate sets DDP up)."""
    if cfg.distributed.strategy != "fsdp":
        return {}
    return {}
