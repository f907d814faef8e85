"""Translate a RunConfig into the HF libraries' own config objects.

Heavy imports stay inside the functions so that importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import RunConfig


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "uint8": torch.uint8}[name]


def to_bnb_config(cfg: RunConfig):
    """BitsAndBytesConfig for the base weights, or None when the base is not quantized."""
    from transformers import BitsAndBytesConfig

    q = cfg.quantization
    if q.load_in == "none":
        return None
    if q.load_in == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.quant_type,
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=torch_dtype(cfg.model.dtype),
        bnb_4bit_quant_storage=torch_dtype(cfg.effective_quant_storage),
    )


def to_lora_config(cfg: RunConfig):
    """PEFT LoraConfig, or None for a full fine-tune."""
    from peft import LoraConfig

    lora = cfg.lora
    if lora.adapter == "none":
        return None
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        use_rslora=lora.use_rslora,
        bias="none",
        task_type="CAUSAL_LM",
    )


def model_load_kwargs(cfg: RunConfig, attn_implementation: str, *, on_cuda: bool) -> dict[str, Any]:
    """Keyword arguments for AutoModelForCausalLM.from_pretrained."""
    kwargs: dict[str, Any] = {
        "dtype": torch_dtype(cfg.model.dtype),
        "attn_implementation": attn_implementation,
        "trust_remote_code": cfg.model.trust_remote_code,
    }
    if cfg.model.revision:
        kwargs["revision"] = cfg.model.revision
    bnb = to_bnb_config(cfg)
    if bnb is not None:
        kwargs["quantization_config"] = bnb
    if on_cuda and cfg.distributed.strategy == "single":
        # One process, one GPU: put the whole model on it (FSDP/DDP place it themselves). The CLI makes
        # distributed.gpu_ids=[k] visible as the only GPU, cuda:0.
        kwargs["device_map"] = {"": 0}
    return kwargs


def to_sft_config(
    cfg: RunConfig,
    run_dir: Path,
    *,
    on_cuda: bool,
    loss: str,
    has_eval: bool,
    attention: str = "sdpa",
    extra: dict[str, Any] | None = None,
):
    """trl.SFTConfig (a transformers TrainingArguments) for this run."""
    from trl import SFTConfig

    t = cfg.training
    eval_every = t.eval_steps or t.save_steps
    kwargs: dict[str, Any] = dict(
        output_dir=str(Path(run_dir) / "checkpoints"),
        per_device_train_batch_size=t.micro_batch_size,
        per_device_eval_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        num_train_epochs=t.num_epochs,
        max_steps=t.max_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_ratio,  # transformers reads a value < 1 as a fraction of the steps
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        optim=t.optimizer,
        logging_steps=t.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=t.save_total_limit,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=eval_every if has_eval else None,
        seed=t.seed,
        data_seed=t.seed,
        bf16=cfg.model.dtype == "bfloat16",
        fp16=cfg.model.dtype == "float16" and on_cuda,
        use_cpu=not on_cuda,
        activation_checkpointing=cfg.memory.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if cfg.memory.gradient_checkpointing else None,
        max_length=t.max_length,
        packing=cfg.data.packing,
        assistant_only_loss=loss == "assistant_only",
        completion_only_loss=loss == "completion_only" if loss != "assistant_only" else None,
        include_num_input_tokens_seen="non_padding",  # feeds the tokens/s figure
        report_to="none",
        disable_tqdm=True,  # the runner draws its own progress bar from the same events the GUI reads
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False if cfg.distributed.strategy == "ddp" else None,
    )
    if cfg.data.packing and attention != "flash_attention_2":
        # TRL's default "bfd" packing is padding-free, which only FlashAttention handles correctly.
        kwargs["packing_strategy"] = "wrapped"
    kwargs.update(extra or {})
    return SFTConfig(**kwargs)
