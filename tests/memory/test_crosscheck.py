"""The estimator's tensor components against the bytes real tensors hold in a CPU training step.

A tiny Llama is built here (bitsandbytes NF4 + double quant, PEFT LoRA, torch AdamW, bf16 autocast, SDPA)
and measured: parameters, .grad, optimizer.state, and every tensor autograd saves for backward
(torch.autograd.graph.saved_tensors_hooks, each storage counted once). docs/memory.md explains the gaps.
"""

from __future__ import annotations

from functools import cache

import pytest

from finetune_app.config import build_config
from finetune_app.memory.estimator import estimate_memory
from finetune_app.memory.shape import shape_from_config

DIMS = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    tie_word_embeddings=False,
)
SEQ = 128


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def cast_adapters_like_trl(model) -> None:
    """TRL's SFTTrainer (1.16) casts the adapters of a quantized base to bf16; our runner trains through it."""
    import torch

    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.bfloat16)


@cache
def measure_step(quantized: bool, dropout: float, gradient_checkpointing: bool = False) -> dict[str, int]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**DIMS, max_position_embeddings=SEQ, attn_implementation="sdpa")
    kwargs = {"dtype": torch.bfloat16}
    if quantized:
        import tempfile

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        with tempfile.TemporaryDirectory() as tmp:
            LlamaForCausalLM(config).save_pretrained(tmp)
            model = LlamaForCausalLM.from_pretrained(tmp, **kwargs)
    else:
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules="all-linear"))
    if quantized:
        cast_adapters_like_trl(model)
    model.train()

    out: dict[str, int] = {}
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    constants = []
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None:
            constants += [state.absmax, state.code]
            if state.nested:
                constants += [state.state2.absmax, state.state2.code]
    out["weights"] = _storage_bytes(base)
    out["quant_constants"] = _storage_bytes(constants)
    lora = [p for p in model.parameters() if p.requires_grad]
    out["lora"] = _storage_bytes(lora)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}

    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in param_ptrs:
            saved.append(t)
        return t

    ids = torch.randint(0, DIMS["vocab_size"], (1, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.base_model.model.model(input_ids=ids).last_hidden_state
    out["activations"] = _storage_bytes(saved)
    optimizer = torch.optim.AdamW(lora, lr=1e-4)
    hidden.float().pow(2).mean().backward()
    out["gradients"] = _storage_bytes(p.grad for p in lora)
    optimizer.step()
    out["optimizer"] = _storage_bytes(v for s in optimizer.state.values() for v in s.values() if v.dim() > 0)
    return out


def estimate(quantized: bool, dropout: float, gradient_checkpointing: bool = False):
    shape = shape_from_config({"model_type": "llama", **DIMS})
    overrides = [
        "training.micro_batch_size=1",
        f"training.max_length={SEQ}",
        "memory.attention=sdpa",
        "lora.r=8",
        f"lora.dropout={dropout}",
        f"memory.gradient_checkpointing={str(gradient_checkpointing).lower()}",
    ]
    if not quantized:
        overrides += ["quantization.load_in=none", "quantization.double_quant=false"]
    return estimate_memory(build_config({}, overrides), shape)


@pytest.mark.parametrize("quantized", [True, False], ids=["nf4-dq", "bf16"])
def test_model_states_match_real_tensors(quantized):
    measured = measure_step(quantized, dropout=0.05)
    est = estimate(quantized, dropout=0.05).components
    for key in ("weights", "quant_constants", "lora", "gradients", "optimizer"):
        assert est[key] == pytest.approx(measured[key], rel=0.02, abs=4096), key


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_saved_activations_match_real_tensors(dropout):
    measured = measure_step(True, dropout)["activations"]
    est = estimate(True, dropout).components["activations"]
    if dropout:
        # CPU dropout keeps its mask in the input's dtype (bf16 adapters: 2 bytes per value); CUDA's fused
        # dropout a bool one (1 byte), which is what the estimator counts.
        # Adapted inputs per layer: q k v gate up (h), o (h), down (I).
        h, inter = DIMS["hidden_size"], DIMS["intermediate_size"]
        est += 1 * (6 * h + inter) * SEQ * DIMS["num_hidden_layers"]
    # The estimate also counts the input ids/labels, the 4-D mask and the final norm that this
    # backbone-only measurement leaves out; within 15% of the per-layer tensors autograd really saves.
    assert est == pytest.approx(measured, rel=0.15)


@pytest.mark.slow
def test_demo_model_states_match_real_tensors():
    """The real SmolLM2-135M, 4-bit NF4 + double quant, LoRA r16 all-linear: model states within 2%."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from finetune_app.config import DEMO_MODEL
    from finetune_app.demo_model import ensure_demo_model
    from finetune_app.memory.shape import load_model_shape

    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    model = AutoModelForCausalLM.from_pretrained(ensure_demo_model(), dtype=torch.bfloat16, quantization_config=quant)
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    cast_adapters_like_trl(model)
    measured_lora = _storage_bytes(p for p in model.parameters() if p.requires_grad)
    measured_weights = _storage_bytes(p for n, p in model.named_parameters() if "lora_" not in n)
    est = estimate_memory(build_config({}, ["lora.r=16"]), load_model_shape(DEMO_MODEL)).components
    assert est["lora"] == pytest.approx(measured_lora, rel=0.02)
    assert est["weights"] == pytest.approx(measured_weights, rel=0.02)
