"""Per-GPU training memory of a RunConfig, itemized, from the model's shape alone (pure, no torch).

Every term models what our stack (transformers 5 + PEFT + bitsandbytes + TRL SFTTrainer + torch) keeps
on the GPU; docs/memory.md gives each formula with its source and the check against published
measurements. Units are bytes per GPU (per rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import Any

from ..config import DTYPE_BYTES, RunConfig
from .shape import LinearModule, ModelShape, resolve_lora_targets

MiB = 1 << 20
GiB = 1 << 30

# Fixed order of the itemized components (tables, JSON, GUI).
COMPONENTS = (
    "weights",
    "quant_constants",
    "lora",
    "gradients",
    "optimizer",
    "activations",
    "logits",
    "temporaries",
    "allocator_overhead",
    "cuda_context",
)
TENSOR_COMPONENTS = COMPONENTS[:8]  # what torch.cuda.max_memory_allocated sees

# CUDA context + kernels loaded lazily: ~300-500 MB (pytorch PR #86509; 426 MiB on an RTX 6000 Ada).
CUDA_CONTEXT_BYTES = 450 * MiB
# Caching-allocator slack (reserved - allocated): small on long-lived tensors, larger on the
# per-step tensors that are freed and re-allocated in other sizes (activations, logits, temporaries).
ALLOCATOR_STATIC_FRACTION = 0.02
ALLOCATOR_DYNAMIC_FRACTION = 0.10
ALLOCATOR_MIN_BYTES = 64 * MiB
# Our runner does not call peft.prepare_model_for_kbit_training (it would upcast the embeddings, lm_head
# and norms to fp32 and make the residual stream fp32). Flip this if the runner starts calling it.
KBIT_FP32_UPCAST = False
# bitsandbytes 4-bit: one absmax per block of 64 weights; double quant stores absmax as uint8 with an
# fp32 scale per 256 absmax values, plus a 256-entry fp32 code table per tensor.
BNB_4BIT_BLOCKSIZE = 64
BNB_DQ_BLOCKSIZE = 256
# TRL's fused LM head scores tokens in tiles of 4096 tokens x 32768 vocabulary entries.
TRL_TOKEN_TILE = 4096
TRL_VOCAB_TILE = 32768


@dataclass(frozen=True)
class MemoryEstimate:
    components: dict[str, int]
    allocated_peak: int  # torch.cuda.max_memory_allocated
    reserved_peak: int  # torch.cuda.max_memory_reserved
    total: int  # what nvidia-smi shows for the process
    num_gpus: int
    notes: list[str] = field(default_factory=list)
    cpu_offload_bytes: int = 0  # CPU RAM per rank holding offloaded FSDP state

    @property
    def cuda_context(self) -> int:
        return self.components["cuda_context"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "components": dict(self.components),
            "allocated_peak": self.allocated_peak,
            "reserved_peak": self.reserved_peak,
            "cuda_context": self.cuda_context,
            "total": self.total,
            "num_gpus": self.num_gpus,
            "cpu_offload_bytes": self.cpu_offload_bytes,
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------------
# Model states


def quantized_weight_bytes(module: LinearModule, load_in: str) -> int:
    n = module.in_features * module.out_features
    bias = module.out_features * 2 if module.bias else 0  # biases stay in the compute dtype
    if load_in == "4bit":
        return module.count * (ceil(n / 2) + bias)
    return module.count * (n + bias)


def quant_constant_bytes(module: LinearModule, load_in: str, double_quant: bool) -> int:
    n = module.in_features * module.out_features
    if load_in == "8bit":
        return module.count * 4 * module.out_features  # LLM.int8: one fp32 scale per output row (SCB)
    blocks = ceil(n / BNB_4BIT_BLOCKSIZE)
    if not double_quant:
        return module.count * 4 * blocks
    return module.count * (blocks + 4 * ceil(blocks / BNB_DQ_BLOCKSIZE) + 4 * 256 + 4)


def weight_bytes(cfg: RunConfig, shape: ModelShape) -> tuple[int, int]:
    """(weights, quantization constants) of the whole model, unsharded."""
    c = DTYPE_BYTES[cfg.model.dtype]
    plain = 4 if KBIT_FP32_UPCAST and cfg.is_quantized else c  # embeddings, lm_head, norms, experts
    other = shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.expert_params
    decoder = [m for m in shape.linear_modules() if m.quantized]
    if not cfg.is_quantized:
        return (other + shape.decoder_linear_params) * c, 0
    q = cfg.quantization
    weights = other * plain + sum(quantized_weight_bytes(m, q.load_in) for m in decoder)
    constants = sum(quant_constant_bytes(m, q.load_in, q.double_quant) for m in decoder)
    return weights, constants


def trainable_params(cfg: RunConfig, shape: ModelShape) -> int:
    if cfg.lora.adapter == "none":
        return shape.total_params
    return sum(m.lora_params(cfg.lora.r) for m in lora_modules(cfg, shape))


def lora_modules(cfg: RunConfig, shape: ModelShape) -> tuple[LinearModule, ...]:
    if cfg.lora.adapter == "none":
        return ()
    return resolve_lora_targets(shape, cfg.lora.target_modules)


def trainable_dtype_bytes(cfg: RunConfig) -> int:
    """Bytes per trainable parameter (and per gradient value; torch AdamW keeps its states in it too).

    PEFT keeps adapters in fp32 (autocast_adapter_dtype=True), but TRL's SFTTrainer casts the adapters of a
    quantized base to bf16 (the QLoRA paper's choice); a full fine-tune trains the loaded dtype.
    """
    if cfg.lora.adapter == "lora":
        return 2 if cfg.is_quantized else 4
    return DTYPE_BYTES[cfg.model.dtype]


def optimizer_bytes(cfg: RunConfig, shape: ModelShape, params: int) -> int:
    opt = cfg.training.optimizer
    p = trainable_dtype_bytes(cfg)
    if opt in ("adamw_torch", "adamw_torch_fused", "paged_adamw_32bit"):
        return 2 * p * params if opt != "paged_adamw_32bit" else 8 * params
    if opt in ("adamw_8bit", "paged_adamw_8bit"):
        # Two uint8 states + one fp32 absmax per 256-value block for each.
        return 2 * params + 2 * 4 * ceil(params / 256)
    if opt == "adafactor":
        return 4 * _adafactor_factors(cfg, shape)
    return 0  # sgd without momentum (the transformers default) keeps no state


def _adafactor_factors(cfg: RunConfig, shape: ModelShape) -> int:
    """Adafactor keeps a row and a column second-moment vector per matrix (no first moment)."""
    r = cfg.lora.r
    if cfg.lora.adapter == "lora":
        return sum(
            m.count * ((r * m.rank_factor + m.in_features) + (m.out_features + r * m.rank_factor))
            for m in lora_modules(cfg, shape)
        )
    linears = sum(m.count * (m.in_features + m.out_features) for m in shape.linear_modules() if m.kind == "linear")
    return linears + shape.vocab_size + shape.hidden_size + shape.norm_params


# ---------------------------------------------------------------------------------------------
# Activations


def attention_kind(cfg: RunConfig, flash_available: bool) -> str:
    attn = cfg.memory.attention
    if attn == "auto":
        return "flash_attention_2" if flash_available and cfg.model.dtype != "float32" else "sdpa"
    return attn


def layer_activation_bytes_per_token(
    cfg: RunConfig, shape: ModelShape, attention: str, seq_len: int, padded: bool
) -> float:
    """Bytes one decoder layer saves for backward per token (derived from the tensors autograd keeps).

    RMSNorm: the fp32 upcast of its input (4h) and the rsqrt (4). Attention: q and k after RoPE, v, the
    output and the fp32 logsumexp for SDPA/FlashAttention; k/v are repeated to all heads when SDPA
    gets a padding mask (transformers' repeat_kv); eager adds the fp32 softmax and its 16-bit copy
    (quadratic in the sequence). SwiGLU/GeGLU: gate, act(gate) and up. LoRA on a module: the 16-bit
    copy of its input that autocast makes for the fp32 adapter, the dropout mask (1 byte/value) and
    the rank-r intermediate. A full fine-tune also saves every linear's input and the norms' inputs.
    """
    c = DTYPE_BYTES[cfg.model.dtype]
    h, q, kv, a, inter = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.num_heads, shape.intermediate_size
    full = cfg.lora.adapter == "none"
    total = shape.norms_per_layer * (4 * h + 4)
    if shape.qk_norm:
        total += 4 * q + 4 * kv + 8 * a
    kv_saved = q if (attention == "eager" or (attention == "sdpa" and padded)) else kv
    total += c * (2 * q + 2 * kv_saved)  # q, k, v, output
    if attention == "eager":
        total += (4 + c) * a * seq_len
    else:
        total += 4 * a  # logsumexp
    if shape.is_moe:
        e_inter, k = shape.expert_intermediate_size, shape.experts_per_token
        total += k * (3 * c * e_inter + c * h) + 4 * shape.num_experts + c * h
        total += 3 * c * shape.shared_expert_intermediate_size
    else:
        total += 3 * c * inter
    if full:
        total += c * (2 * h + q + (inter if not shape.is_moe else 0))  # inputs of the linears
        total += shape.norms_per_layer * c * h  # normalized input saved for the norm weight's gradient
    held_inputs: set[str] = set()
    for m in lora_modules(cfg, shape):
        if m.is_output or m.kind == "experts":  # expert adapters see only their routed tokens
            continue
        per_layer = m.count / shape.num_layers
        if cfg.is_quantized:
            copy = _bf16_adapter_input_bytes(m, c, held_inputs)
        else:
            copy = 2 * m.in_features if c == 2 else 4 * m.in_features
        mask = m.in_features if cfg.lora.dropout > 0 else 0
        total += per_layer * (copy + mask + c * cfg.lora.r)
    return total


# Which tensor a linear layer reads, by module name: the adapters of one group share their input.
_INPUT_GROUPS = {
    "attn_in": {"q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value", "Wqkv", "c_attn"},
    "attn_out": {"o_proj", "out_proj", "dense", "c_proj"},
    "mlp_in": {"gate_proj", "up_proj", "gate_up_proj", "w1", "w3", "fc1", "c_fc"},
    "mlp_out": {"down_proj", "w2", "fc2"},
}


def _bf16_adapter_input_bytes(m: LinearModule, c: int, held: set[str]) -> int:
    """Bytes a bf16 adapter on a 4/8-bit layer keeps alive for its input.

    bitsandbytes keeps the base matmul's input outside autograd's saved tensors, and the adapter's
    lora_A saves that same tensor: the normalized inputs of attention and MLP, and the SwiGLU product
    into down_proj, are held once per group; the attention output (o_proj's input) is already counted.
    With fp32 compute, PEFT also casts the input to the adapters' bf16 for every module.
    """
    group = next((name for name, members in _INPUT_GROUPS.items() if m.name in members), m.name)
    first = group not in held
    held.add(group)
    shared = c * m.in_features if first and group != "attn_out" else 0
    return shared + (2 * m.in_features if c != 2 else 0)


def activation_bytes(cfg: RunConfig, shape: ModelShape, attention: str) -> int:
    b, s = cfg.training.micro_batch_size, cfg.training.max_length
    tokens = b * s
    padded = b > 1  # several sequences of different lengths get a padding mask
    per_layer = layer_activation_bytes_per_token(cfg, shape, attention, s, padded) * tokens
    c = DTYPE_BYTES[cfg.model.dtype]
    stream = 4 if KBIT_FP32_UPCAST and cfg.is_quantized else c
    shared = tokens * (24 + 2 * c * shape.head_dim + 4 * shape.hidden_size)  # ids/labels/mask, RoPE cos/sin, final norm
    if padded and attention in ("sdpa", "eager"):
        shared += b * s * s  # the boolean 4-D attention mask, built once
    if cfg.memory.gradient_checkpointing:
        # Each decoder layer keeps its input; one layer is recomputed at a time in backward.
        return int(shape.num_layers * stream * shape.hidden_size * tokens + per_layer + shared)
    return int(shape.num_layers * per_layer + shared)


def logits_bytes(cfg: RunConfig, shape: ModelShape) -> int:
    """TRL's fused LM head: scores tiles of (4096 tokens x 32768 vocab) and never holds the full logits.

    It saves the gathered last hidden states (16-bit), ~10 fp32 numbers per token, one tile buffer, and in
    backward an fp32 gradient of the hidden states (plus its 16-bit cast). A trainable lm_head (full
    fine-tune) adds an fp32 gradient of the head.
    """
    c = DTYPE_BYTES[cfg.model.dtype]
    h, v = shape.hidden_size, shape.vocab_size
    tokens = cfg.training.micro_batch_size * cfg.training.max_length
    tile = min(tokens, TRL_TOKEN_TILE) * min(v, TRL_VOCAB_TILE) * c
    total = tokens * (2 * c * h + 4 * h + 40) + tile
    if cfg.lora.adapter == "none":
        total += 4 * v * h
    return total


def full_logits_bytes(tokens: int, vocab: int, compute_bytes: int = 2) -> int:
    """Peak of a plain transformers loss (no fused head): 16-bit logits kept by the output, their fp32
    upcast's log-softmax, and in backward the fp32 gradients of both (transformers ForCausalLMLoss)."""
    return tokens * vocab * (compute_bytes + 12)


# ---------------------------------------------------------------------------------------------
# The whole estimate


def allocator_overhead_bytes(persistent: int, per_step: int) -> int:
    """reserved - allocated of torch's caching allocator: a little on tensors that live the whole run,
    more on the per-step tensors that are freed and re-allocated in other sizes (fragmentation)."""
    return max(ALLOCATOR_MIN_BYTES, int(ALLOCATOR_STATIC_FRACTION * persistent + ALLOCATOR_DYNAMIC_FRACTION * per_step))


def estimate_memory(cfg: RunConfig, shape: ModelShape, *, flash_available: bool = False) -> MemoryEstimate:
    """Peak memory of one training step on each GPU of the run described by `cfg`.

    `flash_available`: whether attention='auto' would get FlashAttention-2 (GPU cc>=8.0 and flash-attn
    installed); without it 'auto' is sized as SDPA, which is never smaller.
    """
    notes: list[str] = list(shape.notes)
    c = DTYPE_BYTES[cfg.model.dtype]
    dist = cfg.distributed
    n = cfg.world_size if dist.strategy != "single" else 1
    shard = n if dist.strategy == "fsdp" else 1
    if dist.strategy == "fsdp" and dist.fsdp_sharding == "hybrid_shard":
        shard = dist.num_processes  # shards within a node, replicates across nodes
    attention = attention_kind(cfg, flash_available)

    weights, constants = weight_bytes(cfg, shape)
    root = (shape.embedding_params + shape.lm_head_params) * (4 if KBIT_FP32_UPCAST and cfg.is_quantized else c)
    layer = (weights + constants - root) // max(shape.num_layers, 1)  # one decoder layer, unsharded
    params = trainable_params(cfg, shape)
    is_lora = cfg.lora.adapter == "lora"
    lora = trainable_dtype_bytes(cfg) * params if is_lora else 0
    gradients = params * trainable_dtype_bytes(cfg)
    optimizer = optimizer_bytes(cfg, shape, params)
    activations = activation_bytes(cfg, shape, attention)
    logits = logits_bytes(cfg, shape)

    temporaries = 0
    if cfg.quantization.load_in in ("4bit", "8bit"):
        # Each quantized matmul dequantizes its weight to the compute dtype, one layer at a time.
        temporaries += c * shape.largest_linear
    if attention == "eager":
        temporaries += 2 * c * shape.num_heads * cfg.training.max_length**2 * cfg.training.micro_batch_size

    cpu_offload = 0
    if dist.strategy == "fsdp":
        sharded_states = weights + constants + lora + optimizer
        grad_div = shard
        param_div = shard if dist.fsdp_sharding != "shard_grad_op" else 1
        weights, constants, lora = ceil(weights / param_div), ceil(constants / param_div), ceil(lora / param_div)
        gradients, optimizer = ceil(gradients / grad_div), ceil(optimizer / grad_div)
        if param_div > 1:
            # Two decoder layers unsharded at a time (the current one and the prefetched next), and the
            # root unit (embeddings, lm_head, final norm) stays gathered through forward and backward.
            # (With CPU offload the local shard is on the CPU too, so the whole unit is gathered.)
            remote = 1.0 if dist.cpu_offload else 1 - 1 / param_div
            temporaries += 2 * int(layer * remote) + int(root * remote)
            if not is_lora:
                temporaries += int(gradients * grad_div / max(shape.num_layers, 1))  # one layer's unsharded grads
        if dist.cpu_offload:
            cpu_offload = ceil(sharded_states / shard) + gradients
            weights = constants = lora = gradients = optimizer = 0
            notes.append(
                f"FSDP CPU offload keeps parameters, gradients and optimizer states in CPU RAM "
                f"(~{cpu_offload / GiB:.1f} GiB per process); only the gathered layers are on the GPU"
            )
        notes.append(f"FSDP {dist.fsdp_sharding}: states divided by {shard}; gathered layers count as temporaries")
    elif dist.strategy == "ddp":
        temporaries += gradients  # DDP's gradient buckets hold a second copy of the gradients
        notes.append("DDP keeps a full replica per GPU plus a bucket copy of the gradients")

    paged = cfg.training.optimizer.startswith("paged_")
    step_temp = 0
    if cfg.training.optimizer in ("adamw_torch",) and not (dist.strategy == "fsdp" and dist.cpu_offload):
        # The foreach AdamW step allocates a parameter-sized temporary (sqrt of the second moment).
        step_temp = optimizer // 2
    tracked_optimizer = 0 if paged else optimizer
    static = weights + constants + lora + tracked_optimizer
    step_phase = static + gradients + step_temp
    train_phase = static + gradients + activations + logits + temporaries
    if step_phase > train_phase:
        temporaries += step_phase - train_phase
        notes.append("the optimizer step is the peak: its temporaries exceed the activations")
    allocated = static + gradients + activations + logits + temporaries
    overhead = allocator_overhead_bytes(static + gradients, activations + logits + temporaries)
    reserved = allocated + overhead
    total = reserved + CUDA_CONTEXT_BYTES + (optimizer if paged else 0)

    components = {
        "weights": weights,
        "quant_constants": constants,
        "lora": lora,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": activations,
        "logits": logits,
        "temporaries": temporaries,
        "allocator_overhead": overhead,
        "cuda_context": CUDA_CONTEXT_BYTES,
    }
    if paged:
        notes.append(
            "paged optimizer states live in CUDA unified memory: outside torch's allocator (not in "
            "max_memory_reserved), shown by nvidia-smi, and moved to CPU RAM when the GPU runs out"
        )
    notes += _assumption_notes(cfg, attention, flash_available)
    return MemoryEstimate(
        components=components,
        allocated_peak=allocated,
        reserved_peak=reserved,
        total=total,
        num_gpus=n,
        notes=notes,
        cpu_offload_bytes=cpu_offload,
    )


def _assumption_notes(cfg: RunConfig, attention: str, flash_available: bool) -> list[str]:
    notes = [
        f"every sequence padded to max_length={cfg.training.max_length} (the worst micro-batch)",
        "gradient accumulation adds no memory: gradients are counted in full either way",
    ]
    if cfg.memory.attention == "auto" and not flash_available:
        notes.append("attention=auto sized as SDPA (FlashAttention-2 not known to be available)")
    if attention == "eager":
        notes.append("eager attention stores the full attention matrix: memory grows with max_length squared")
    if cfg.lora.adapter == "none" and cfg.model.dtype != "float32":
        notes.append(
            f"full fine-tune in {cfg.model.dtype}: weights, gradients and AdamW states all in {cfg.model.dtype} "
            "(no fp32 master copy)"
        )
    return notes
