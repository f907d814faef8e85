"""One headless training run: TRL SFTTrainer + PEFT LoRA + bitsandbytes, driven by a RunConfig.

The GUI never calls this in its own process: it launches `python -m finetune_app train ...`, which
ends up here, and follows the run directory's event log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import atomic_dir, atomic_write_text
from .config import RunConfig, dump_yaml
from .distributed import check_adapter_saved, is_main_rank, launched_by_us
from .events import EventLog

CONFIG_FILE = "config.yaml"
ADAPTER_DIR = "adapter"
MODEL_DIR = "model"  # a full fine-tune saves the whole model here instead of an adapter


class SilentEventLog:
    """The event log of ranks other than 0: they compute but must not write the run's files."""

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        return {"event": event, **fields}


class RunError(RuntimeError):
    """A run that cannot start or continue; the message says what to do."""


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    status: str  # "completed" | "stopped"
    output_path: Path
    train_loss: float | None


def prepare_run_dir(run_dir: Path, cfg: RunConfig, *, resume: bool) -> None:
    """Create the run directory, or check it can be resumed. Never overwrites a previous run."""
    run_dir = Path(run_dir)
    if launched_by_us():
        return  # launch.py prepared (and checked) the run dir once for all ranks
    has_history = (run_dir / "events.jsonl").exists() or (run_dir / "checkpoints").exists()
    if resume:
        if not run_dir.is_dir():
            raise RunError(f"--resume: run directory {run_dir} does not exist")
        if last_checkpoint(run_dir) is None:
            raise RunError(f"--resume: {run_dir} has no checkpoint yet (checkpoints/checkpoint-N); start a new run")
    elif has_history:
        raise RunError(
            f"run directory {run_dir} already holds a run; pass --resume to continue it, or choose another "
            "output.run_name / --run-dir (nothing was changed)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / CONFIG_FILE, dump_yaml(cfg))


def last_checkpoint(run_dir: Path) -> Path | None:
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    done = [
        p
        for p in folder.glob("checkpoint-*")
        if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").exists()
    ]
    return max(done, key=lambda p: int(p.name.split("-")[-1]), default=None)


def run_training(cfg: RunConfig, run_dir: Path, *, resume: bool = False, log=print) -> RunResult:
    run_dir = Path(run_dir)
    prepare_run_dir(run_dir, cfg, resume=resume)
    # Under DDP/FSDP every rank runs this function; only rank 0 writes the event log.
    events = EventLog(run_dir) if is_main_rank() else SilentEventLog()
    attention = _choose_attention(cfg)
    events.emit(
        "start",
        run_dir=str(run_dir),
        config=cfg.model_dump(mode="json"),
        resume=resume,
        estimate=_estimate_or_none(cfg, log, flash=attention.implementation == "flash_attention_2"),
        device=_device_name(),
    )
    try:
        return _train(cfg, run_dir, events, attention, resume=resume, log=log)
    except KeyboardInterrupt:
        # Stop pressed while the model or data was loading (or a second Ctrl-C): nothing trained yet to save.
        events.emit("end", status="stopped", adapter_path=None, train_loss=None, runtime_seconds=None, step=0)
        raise
    except BaseException as exc:
        message = str(exc) if isinstance(exc, RunError) else f"{type(exc).__name__}: {exc}"
        events.emit("error", message=message)
        if is_main_rank() and not isinstance(exc, RunError):
            import traceback

            atomic_write_text(run_dir / "error.log", traceback.format_exc())
        raise


def _choose_attention(cfg: RunConfig):
    import torch

    from .attention import choose_attention
    from .hardware import flash_attn_installed

    on_cuda = torch.cuda.is_available()
    return choose_attention(
        cfg.memory.attention,
        on_cuda=on_cuda,
        flash_installed=flash_attn_installed(),
        gpu_supports_flash=on_cuda and torch.cuda.get_device_capability()[0] >= 8,
        dtype=cfg.model.dtype,
    )


def _train(cfg: RunConfig, run_dir: Path, events: EventLog, attention, *, resume: bool, log) -> RunResult:
    import torch
    from transformers import PrinterCallback
    from trl import SFTTrainer

    from .callbacks import EventCallback, StopOnSignal
    from .data import load_training_data
    from .distributed import distributed_callbacks, rank_placement
    from .model_source import resolve_model
    from .translate import model_load_kwargs, to_lora_config, to_sft_config

    _preflight_push(cfg)
    on_cuda = torch.cuda.is_available()
    if cfg.model.dtype == "float16" and not on_cuda:
        raise RunError("model.dtype=float16 training needs a GPU; on CPU use bfloat16 or float32")
    resolved = resolve_model(cfg.model, log=log)
    tokenizer = load_tokenizer(resolved.path, resolved.revision, cfg.model.trust_remote_code)
    bundle = load_training_data(cfg.data, tokenizer, seed=cfg.training.seed)
    for note in bundle.notes:
        events.emit("info", message=note)
    if bundle.chat_template:
        tokenizer.chat_template = bundle.chat_template

    if attention.reason:
        log(attention.reason)
        events.emit("info", message=attention.reason)
    load_kwargs = model_load_kwargs(cfg, attention.implementation, on_cuda=on_cuda)
    load_kwargs.update(rank_placement(cfg, on_cuda=on_cuda))
    model = _load_model(resolved.path, load_kwargs, log)

    stop = StopOnSignal()
    args = to_sft_config(
        cfg,
        run_dir,
        on_cuda=on_cuda,
        loss=bundle.loss,
        has_eval=bundle.eval is not None,
        attention=attention.implementation,
        extra=_distributed_args(cfg),
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=bundle.train,
        eval_dataset=bundle.eval,
        processing_class=tokenizer,
        peft_config=to_lora_config(cfg),
        callbacks=[EventCallback(events, on_cuda=on_cuda), stop, *distributed_callbacks(events, stop)],
    )
    trainer.remove_callback(PrinterCallback)  # EventCallback prints progress instead of raw dicts
    checkpoint = last_checkpoint(run_dir) if resume else None
    if checkpoint:
        events.emit("info", message=f"resuming from {checkpoint.name}")
    with stop.installed():
        output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    status = "stopped" if stop.requested else "completed"
    output_path = _save_result(trainer, tokenizer, cfg, run_dir)
    step, main_rank = trainer.state.global_step, trainer.is_world_process_zero()
    # The merge reloads the base: give back what training held first.
    del trainer, model
    _free_accelerator_memory()
    if main_rank:
        if status == "completed":
            _export_after_training(cfg, run_dir, events, log)
        events.emit(
            "end",
            status=status,
            adapter_path=str(output_path),
            train_loss=output.training_loss,
            runtime_seconds=output.metrics.get("train_runtime"),
            step=step,
        )
    return RunResult(run_dir, status, output_path, output.training_loss)


def _free_accelerator_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def load_tokenizer(path: str, revision: str | None, trust_remote_code: bool):
    """The base model's tokenizer, with a pad token (also used by the GUI's data preview)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        # Padding with EOS is safe here: padded positions are masked out of the loss.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_model(path: str, kwargs: dict[str, Any], log):
    from transformers import AutoModelForCausalLM

    log(f"Loading {path} ({_describe_load(kwargs)}) ...")
    started = time.time()
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.config.use_cache = False  # the KV cache is useless in training and costs memory
    log(f"Loaded in {time.time() - started:.1f} s")
    return model


def _describe_load(kwargs: dict[str, Any]) -> str:
    quant = kwargs.get("quantization_config")
    how = "not quantized"
    if quant is not None:
        how = f"4-bit {quant.bnb_4bit_quant_type}" if quant.load_in_4bit else "8-bit"
        if quant.load_in_4bit and quant.bnb_4bit_use_double_quant:
            how += " + double quant"
    return f"{how}, {str(kwargs['dtype']).replace('torch.', '')}, attention {kwargs['attn_implementation']}"


def _save_result(trainer, tokenizer, cfg: RunConfig, run_dir: Path) -> Path:
    """Write the final adapter (or full model) atomically; only rank 0 writes under FSDP/DDP."""
    final = run_dir / (ADAPTER_DIR if cfg.lora.adapter == "lora" else MODEL_DIR)
    if trainer.is_fsdp_enabled:
        # Gather the sharded weights on every rank; save_model writes only on rank 0.
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    if not trainer.is_world_process_zero():
        trainer.save_model(str(run_dir / ".unused"))  # collective: every rank must take part
        return final
    with atomic_dir(final) as tmp:
        trainer.save_model(str(tmp))
        check_adapter_saved(tmp)
        tokenizer.save_pretrained(str(tmp))
        atomic_write_text(tmp / CONFIG_FILE, dump_yaml(cfg))
    return final


def _distributed_args(cfg: RunConfig) -> dict[str, Any]:
    from .distributed import sft_distributed_args

    return sft_distributed_args(cfg)


def _estimate_or_none(cfg: RunConfig, log, *, flash: bool) -> dict[str, Any] | None:
    """The memory estimate recorded before training, so each GPU run is a check of the estimator."""
    try:
        from .memory.estimator import estimate_memory
        from .memory.shape import load_model_shape

        shape = load_model_shape(cfg.model.name_or_path, cfg.model.revision)
        estimate = estimate_memory(cfg, shape, flash_available=flash)
        return estimate.to_dict()
    except Exception as exc:  # an estimate must never stop a run; say why it is missing
        log(f"memory estimate unavailable: {exc}")
        return None


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _preflight_push(cfg: RunConfig) -> None:
    if not cfg.export.push_to_hub:
        return
    from .hub import PushError, preflight_push

    try:
        preflight_push(cfg.export.push_to_hub, cfg.export.private)
    except PushError as exc:
        raise RunError(f"export.push_to_hub pre-flight failed before training: {exc}") from None


def _export_after_training(cfg: RunConfig, run_dir: Path, events: EventLog, log) -> None:
    if not (cfg.export.merge or cfg.export.push_to_hub):
        return
    from .export import export_after_training

    result = export_after_training(cfg, run_dir, progress=log)
    # Training succeeded either way; a failed export or push is reported and can be retried alone
    # with `python -m finetune_app export RUN_DIR ...`.
    for problem in result.problems:
        events.emit(
            "info", message=f"export after training failed (retry with `python -m finetune_app export`): {problem}"
        )
    events.emit(
        "export",
        ok=result.ok,
        adapter_dir=result.adapter_dir,
        merged_dir=result.merged_dir,
        repo_url=result.repo_url,
        merge_check=result.merge_check,
    )
