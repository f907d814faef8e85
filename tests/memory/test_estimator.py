"""The estimator's components against hand calculations, and the directions every change must move it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from finetune_app.config import build_config
from finetune_app.memory.estimator import COMPONENTS, TENSOR_COMPONENTS, estimate_memory
from finetune_app.memory.shape import KNOWN_CONFIGS, shape_from_config

# Llama-3.1-8B's published config.
LLAMA8B = shape_from_config(KNOWN_CONFIGS["meta-llama/Llama-3.1-8B-Instruct"])
QLORA = ["training.micro_batch_size=2", "training.max_length=2048", "memory.attention=sdpa"]


def est(*overrides: str, shape=LLAMA8B, **kwargs):
    return estimate_memory(build_config({}, [*QLORA, *overrides]), shape, **kwargs)


def test_llama8b_parameter_count():
    assert LLAMA8B.total_params == 8_030_261_248  # the published count


def test_weights_4bit_double_quant_by_hand():
    e = est()
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)  # q, o, k, v, gate, up, down
    other = 2 * 128256 * 4096 + 32 * 2 * 4096 + 4096  # embeddings + lm_head + norms (bf16)
    assert e.components["weights"] == linear // 2 + 2 * other
    # 4.127 bits per quantized weight in all (QLoRA paper), i.e. constants ~0.127 bits.
    assert e.components["quant_constants"] == pytest.approx(linear * 0.127 / 8, rel=0.01)


def test_quant_constants_without_double_quant_are_4_bytes_per_64():
    e = est("quantization.double_quant=false")
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert e.components["quant_constants"] == linear // 64 * 4
    saving = e.total - est().total
    assert saving == pytest.approx(linear * 0.373 / 8, rel=0.02)  # ~0.373 bits per parameter


def test_lora_gradients_and_adamw_by_hand():
    e = est("lora.r=16", "lora.target_modules=all-linear")
    per_layer = 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 14336) * 2 + (14336 + 4096))
    params = 32 * per_layer  # 41.9M, what PEFT prints for Llama-3.1-8B r=16 all-linear
    assert params == 41_943_040
    # A 4-bit base: TRL casts the adapters to bf16, and torch AdamW keeps its two states in that dtype.
    assert e.components["lora"] == 2 * params
    assert e.components["gradients"] == 2 * params
    assert e.components["optimizer"] == 4 * params
    plain = est(
        "lora.r=16", "lora.target_modules=all-linear", "quantization.load_in=none", "quantization.double_quant=false"
    )
    assert plain.components["lora"] == 4 * params  # PEFT's fp32 adapters on an unquantized base
    assert plain.components["gradients"] == 4 * params
    assert plain.components["optimizer"] == 8 * params  # AdamW: two fp32 states


def test_eight_bit_optimizer_and_paged_states():
    params = est().components["lora"] // 2  # bf16 adapters on the 4-bit base
    e8 = est("training.optimizer=adamw_8bit")
    assert e8.components["optimizer"] == pytest.approx(2 * params, rel=0.05)
    paged = est("training.optimizer=paged_adamw_8bit")
    # Paged states are CUDA unified memory: seen by nvidia-smi, not by torch's allocator.
    assert paged.allocated_peak == e8.allocated_peak - e8.components["optimizer"]
    assert paged.total == pytest.approx(e8.total, rel=0.01)


def test_activations_with_checkpointing_by_hand():
    e = est("memory.gradient_checkpointing=true", "lora.dropout=0.0")
    tokens = 2 * 2048
    checkpoints = 32 * 2 * 4096 * tokens  # each layer's bf16 input
    # One recomputed layer: norms 2 x 4h(+4), q k v out (k/v repeated under a padding mask), lse, SwiGLU 3 x I,
    # bf16 adapters on the 4-bit layers hold the inputs bitsandbytes keeps outside autograd once per group:
    # the attention norm's output (h), the MLP norm's output (h) and down_proj's input (I); o_proj's input
    # is the attention output, already counted. Plus the rank-16 output of each of the 7 adapters.
    h, inter, heads = 4096, 14336, 32
    layer = 2 * (4 * h + 4) + 2 * 4 * h + 4 * heads + 3 * 2 * inter + 2 * (2 * h + inter) + 7 * 2 * 16
    shared = tokens * (24 + 2 * 2 * 128 + 4 * h) + 2 * 2048 * 2048
    assert e.components["activations"] == checkpoints + layer * tokens + shared


def test_logits_are_tiled_not_full():
    e = est()
    tokens = 2 * 2048
    full_fp32_logits = tokens * 128256 * 4
    assert e.components["logits"] < full_fp32_logits / 5
    assert e.components["logits"] >= 4096 * 32768 * 2  # at least one tile


def test_components_sum_to_peaks():
    e = est()
    assert tuple(e.components) == COMPONENTS
    assert e.allocated_peak == sum(e.components[k] for k in TENSOR_COMPONENTS)
    assert e.reserved_peak == e.allocated_peak + e.components["allocator_overhead"]
    assert e.total == e.reserved_peak + e.components["cuda_context"]


def test_gradient_accumulation_is_free():
    assert est("training.gradient_accumulation_steps=16").components == est().components


@pytest.mark.parametrize(
    "small, large",
    [
        (["lora.r=8"], ["lora.r=64"]),
        (["training.max_length=512"], ["training.max_length=4096"]),
        (["training.micro_batch_size=1"], ["training.micro_batch_size=8"]),
        (["lora.target_modules=[q_proj,v_proj]"], ["lora.target_modules=all-linear"]),
        (["memory.attention=sdpa"], ["memory.attention=eager"]),
        (["memory.gradient_checkpointing=true"], ["memory.gradient_checkpointing=false"]),
        (["quantization.double_quant=true"], ["quantization.double_quant=false"]),
        ([], ["quantization.load_in=8bit", "quantization.double_quant=false"]),
        (
            ["quantization.load_in=8bit", "quantization.double_quant=false"],
            ["quantization.load_in=none", "quantization.double_quant=false"],
        ),
        (["distributed.strategy=fsdp", "distributed.num_processes=2"], []),
        (
            ["distributed.strategy=fsdp", "distributed.num_processes=4"],
            ["distributed.strategy=fsdp", "distributed.num_processes=2"],
        ),
        (
            ["distributed.strategy=fsdp", "distributed.num_processes=2", "distributed.cpu_offload=true"],
            ["distributed.strategy=fsdp", "distributed.num_processes=2"],
        ),
        (["training.optimizer=adamw_8bit"], ["training.optimizer=adamw_torch"]),
    ],
)
def test_monotonic(small, large):
    assert est(*small).total < est(*large).total


def test_fsdp_shards_model_states():
    single = est()
    fsdp = est("distributed.strategy=fsdp", "distributed.num_processes=4")
    for key in ("weights", "quant_constants", "lora", "gradients", "optimizer"):
        assert fsdp.components[key] == pytest.approx(single.components[key] / 4, rel=0.001)
    assert fsdp.components["activations"] == single.components["activations"]  # per-rank micro-batch
    assert fsdp.num_gpus == 4


def test_shard_grad_op_keeps_full_weights():
    e = est("distributed.strategy=fsdp", "distributed.num_processes=4", "distributed.fsdp_sharding=shard_grad_op")
    assert e.components["weights"] == est().components["weights"]


def test_ddp_replicates():
    ddp = est("distributed.strategy=ddp", "distributed.num_processes=2")
    assert ddp.components["weights"] == est().components["weights"]
    assert ddp.total > est().total  # gradient buckets


def test_full_fine_tune_bf16_states():
    e = est("lora.adapter=none", "quantization.load_in=none", "quantization.double_quant=false")
    p = LLAMA8B.total_params
    assert e.components["weights"] == 2 * p and e.components["gradients"] == 2 * p
    assert e.components["optimizer"] == 4 * p  # two bf16 AdamW states
    assert e.components["lora"] == 0


def test_flash_attention_not_more_than_sdpa():
    assert est(flash_available=True).total <= est().total


def test_importing_the_estimator_does_not_import_torch():
    code = (
        "import sys; import finetune_app.memory.estimator, finetune_app.memory.advice, finetune_app.hardware; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
