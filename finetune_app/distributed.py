"""Multi-GPU at run time: what each rank passes to the HF libraries under DDP and FSDP.

`launch.py` starts the processes (through `accelerate launch`); this module is what every one of those
processes uses: the FSDP settings for the Trainer, where a rank puts its copy of the model, and which
rank writes files. Heavy libraries are imported inside the functions only.
"""

from __future__ import annotations

import os
from typing import Any

from .config import RunConfig

# Set by launch.py in the environment of the ranks it starts: the launcher already created the run
# directory (config.yaml), so the ranks must accept it instead of refusing to overwrite it.
LAUNCHED_ENV = "FINETUNE_APP_LAUNCHED"


def launched_by_us() -> bool:
    return os.environ.get(LAUNCHED_ENV) == "1"


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_rank() -> bool:
    """Rank 0 of the whole job writes the run directory (events, adapter); the others only compute."""
    return global_rank() == 0


def fsdp_options(cfg: RunConfig, layer_classes: list[str] | None = None) -> dict[str, Any]:
    """The FSDP2 settings, in the keys TrainingArguments.fsdp_config and accelerate's config file share.

    - every decoder layer (with its LoRA matrices) is one FSDP unit, so a rank holds 1/N of each layer's
      4-bit base weights and gathers one layer at a time; `layer_classes` None = the model's own
      `_no_split_modules` (e.g. LlamaDecoderLayer), which is what accelerate falls back to;
    - activation checkpointing stays the HF flag (non-reentrant torch.utils.checkpoint per decoder layer),
      not FSDP's own: FSDP's wraps every layer in a CheckpointWrapper whose `_checkpoint_wrapped_module`
      name PEFT does not strip when it picks the adapter weights out of the gathered state dict, so the
      saved adapter came out empty (peft 0.21, accelerate 1.15);
    - the state dict is gathered in full for saving so the adapter is an ordinary, unsharded PEFT adapter.
    """
    dist = cfg.distributed
    options: dict[str, Any] = {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        # FSDP2 has no sharding-strategy enum: shard_grad_op = keep parameters gathered after forward.
        "reshard_after_forward": dist.fsdp_sharding != "shard_grad_op",
        "cpu_offload": dist.cpu_offload,
        "activation_checkpointing": False,
        "state_dict_type": "FULL_STATE_DICT",
        # Each rank loads the (small, 4-bit) model itself; rank-0-only loading is skipped for
        # bitsandbytes weights by accelerate anyway, so one setting fits both cases.
        "cpu_ram_efficient_loading": False,
    }
    if layer_classes:
        options["transformer_layer_cls_to_wrap"] = list(layer_classes)
    return options


def sft_distributed_args(cfg: RunConfig) -> dict[str, Any]:
    """SFTConfig kwargs that override the single-process ones (DDP needs none: accelerate wraps it)."""
    if cfg.distributed.strategy != "fsdp":
        return {}
    args: dict[str, Any] = {
        "fsdp": True,
        "fsdp_config": fsdp_options(cfg),
    }
    if cfg.distributed.fsdp_sharding == "hybrid_shard":
        from accelerate.parallelism_config import ParallelismConfig

        # Shard within a node, replicate across nodes (HSDP on a 2-D device mesh).
        args["parallelism_config"] = ParallelismConfig(
            dp_replicate_size=cfg.distributed.num_nodes, dp_shard_size=cfg.distributed.num_processes
        )
    return args


def rank_placement(cfg: RunConfig, *, on_cuda: bool) -> dict[str, Any]:
    """from_pretrained kwargs that put this rank's copy of the model on this rank's GPU.

    Without it every rank would quantize and load onto GPU 0 (the model is loaded before accelerate
    sets the rank's device). The launcher restricts CUDA_VISIBLE_DEVICES to distributed.gpu_ids, so
    LOCAL_RANK indexes the visible GPUs.
    """
    if not on_cuda or cfg.distributed.strategy == "single":
        return {}
    return {"device_map": {"": local_rank()}}


def local_parameter_summary(model) -> dict[str, int]:
    """What this rank holds: frozen (base) and trainable (LoRA) parameters, whole and as local shards.

    FSDP2 turns parameters into DTensors whose `to_local()` is this rank's shard; under DDP every rank
    holds everything, so local == full.
    """
    summary = {
        "base_numel": 0,
        "base_local_numel": 0,
        "base_local_bytes": 0,
        "trainable_numel": 0,
        "trainable_local_numel": 0,
    }
    for param in model.parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        kind = "trainable" if param.requires_grad else "base"
        summary[f"{kind}_numel"] += param.numel()
        summary[f"{kind}_local_numel"] += local.numel()
        if kind == "base":
            summary["base_local_bytes"] += local.numel() * local.element_size()
    return summary


def distributed_callbacks(events, stop) -> list:
    """TrainerCallbacks needed when several processes train together (none for one process).

    - ShardReport records, once training starts, what each rank holds (a "shards" event);
    - StopAgreement makes every rank stop at the same step when any of them was asked to stop:
      a rank that stops alone would leave the others waiting in a collective forever.
    Built in a function so that importing this module does not import transformers.
    """
    import torch.distributed as dist
    from transformers import TrainerCallback

    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return []  # the process group itself only exists once the Trainer has set up accelerate

    class ShardReport(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if model is None:
                return
            mine = {"rank": dist.get_rank(), **local_parameter_summary(model)}
            everyone: list[dict[str, int] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)  # collective: every rank takes part
            if state.is_world_process_zero:
                events.emit("shards", strategy="fsdp" if args.fsdp else "ddp", ranks=everyone)

    class StopAgreement(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            import torch

            flag = torch.tensor([1.0 if stop.requested else 0.0], device=args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                stop.requested = True
                control.should_save = True
                control.should_training_stop = True
            return control

    return [ShardReport(), StopAgreement()]


def check_adapter_saved(folder) -> None:
    """Refuse to call a run complete when the saved adapter holds no weights.

    Under FSDP the adapter is picked out of a gathered state dict by name; a name mismatch (as with FSDP's
    own activation checkpointing) silently writes an empty file. Better a clear error than a useless result.
    """
    from pathlib import Path

    from safetensors import safe_open

    path = Path(folder) / "adapter_model.safetensors"
    if not path.is_file():
        return
    with safe_open(str(path), framework="pt") as handle:
        if not list(handle.keys()):
            raise RuntimeError(
                f"the saved adapter {path} holds no weights (sharded state dict not gathered); the run's "
                "checkpoints are kept"
            )
