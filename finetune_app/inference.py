"""Greedy answers from a base model, with or without a trained adapter (the GUI's "Try it", the demo check)."""

from __future__ import annotations

from pathlib import Path

from .config import RunConfig


def load_for_inference(cfg: RunConfig, adapter_dir: Path | None = None, *, quantized: bool = True):
    """(model, tokenizer): the run's base model, loaded as it was trained, plus the adapter if given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .model_source import resolve_model
    from .translate import model_load_kwargs

    resolved = resolve_model(cfg.model)
    on_cuda = torch.cuda.is_available()
    kwargs = model_load_kwargs(cfg, "sdpa", on_cuda=on_cuda)
    if not quantized:
        kwargs.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_pretrained(resolved.path, **kwargs)
    tokenizer_source = (
        adapter_dir if adapter_dir and (Path(adapter_dir) / "tokenizer_config.json").exists() else resolved.path
    )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    return model, tokenizer


def greedy_answer(model, tokenizer, question: str, max_new_tokens: int = 40) -> str:
    import torch

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(model.device)
    with torch.no_grad():
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    return tokenizer.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()
