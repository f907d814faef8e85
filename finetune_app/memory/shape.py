"""A model's shape from its config.json alone: no weights, no torch.

The memory estimator needs sizes (hidden, layers, heads, vocab, ...) and the list of linear layers that
bitsandbytes quantizes and PEFT can adapt. Both are read from the config the way transformers builds
the model, so LoRA targets resolve to exactly the modules PEFT would pick.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..config import DEMO_MODEL

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "demo" / "config.json"

# Families whose decoder layers look like Llama's (q/k/v/o + gate/up/down SwiGLU or GeGLU).
LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "granite", "olmo2"}
PHI3_LIKE = {"phi3"}
MOE = {"mixtral", "qwen2_moe", "qwen3_moe"}
SUPPORTED = LLAMA_LIKE | PHI3_LIKE | MOE
QK_NORM = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2"}
FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}  # pre/post attention and feed-forward norms
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text"}
QKV_BIAS = {"qwen2", "qwen2_moe"}
# MoE families for which PEFT's 'all-linear' also adapts the router and the fused experts.
PEFT_MOE_EXPERTS = {"mixtral", "qwen3_moe"}


# Published config.json sizes of the models our presets use, so their estimates work offline and
# without a Hub login (gated models). Used only when no revision is pinned.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.1-8B-Instruct": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        torch_dtype="bfloat16",
    ),
    "meta-llama/Llama-3.1-70B-Instruct": dict(
        model_type="llama",
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        torch_dtype="bfloat16",
    ),
    "mistralai/Mistral-7B-Instruct-v0.3": dict(
        model_type="mistral",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=32768,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        torch_dtype="bfloat16",
    ),
    "Qwen/Qwen2.5-7B-Instruct": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        torch_dtype="bfloat16",
    ),
}


class ShapeError(ValueError):
    """The model's config cannot be read or describes an architecture we cannot size."""


@dataclass(frozen=True)
class LinearModule:
    """One kind of nn.Linear: `path` is a full module name with {i} for the layer index."""

    path: str
    in_features: int
    out_features: int
    count: int  # instances in the whole model
    bias: bool = False
    is_output: bool = False  # the lm_head: never quantized, never in 'all-linear'
    # "linear" = a real nn.Linear (bitsandbytes quantizes it); "router" = an MoE router (not quantized);
    # "experts" = fused 3-D expert weights that PEFT adapts only under 'all-linear', with one LoRA of
    # rank r * rank_factor spanning all experts.
    kind: str = "linear"
    rank_factor: int = 1

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))

    @property
    def quantized(self) -> bool:
        return self.kind == "linear" and not self.is_output

    def lora_params(self, rank: int) -> int:
        return self.count * rank * self.rank_factor * (self.in_features + self.out_features)


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None = None
    num_experts: int = 0  # 0 = dense MLP
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    qk_norm: bool = False
    norms_per_layer: int = 2
    torch_dtype: str | None = None
    source: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)

    # --- derived sizes -------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        per_layer = self.norms_per_layer * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return self.num_layers * per_layer + self.hidden_size

    @property
    def expert_params(self) -> int:
        """Routed experts (3-D fused parameters in transformers 5, not nn.Linear) plus the router."""
        if not self.is_moe:
            return 0
        per_layer = self.num_experts * 3 * self.hidden_size * self.expert_intermediate_size
        per_layer += self.num_experts * self.hidden_size
        return self.num_layers * per_layer

    def linear_modules(self) -> tuple[LinearModule, ...]:
        return _linear_modules(self)

    @property
    def decoder_linear_params(self) -> int:
        """Parameters of the nn.Linear layers of the decoder blocks (what bitsandbytes quantizes)."""
        return sum(m.params for m in self.linear_modules() if m.quantized)

    @property
    def total_params(self) -> int:
        return (
            self.embedding_params
            + self.lm_head_params
            + self.norm_params
            + self.expert_params
            + self.decoder_linear_params
        )

    @property
    def largest_linear(self) -> int:
        """Elements of the biggest decoder weight matrix (the dequantization temporary of 4-bit)."""
        sizes = [m.in_features * m.out_features for m in self.linear_modules() if m.quantized]
        if self.is_moe:
            sizes.append(2 * self.hidden_size * self.expert_intermediate_size * self.num_experts)
        return max(sizes)


def _linear_modules(shape: ModelShape) -> tuple[LinearModule, ...]:
    h, n = shape.hidden_size, shape.num_layers
    L = n
    p = "model.layers.{i}"
    bias = shape.model_type in QKV_BIAS
    out: list[LinearModule] = []
    if shape.model_type in PHI3_LIKE:
        out.append(LinearModule(f"{p}.self_attn.qkv_proj", h, shape.q_dim + 2 * shape.kv_dim, n))
    else:
        out += [
            LinearModule(f"{p}.self_attn.q_proj", h, shape.q_dim, n, bias),
            LinearModule(f"{p}.self_attn.k_proj", h, shape.kv_dim, n, bias),
            LinearModule(f"{p}.self_attn.v_proj", h, shape.kv_dim, n, bias),
        ]
    out.append(LinearModule(f"{p}.self_attn.o_proj", shape.q_dim, h, n))
    inter = shape.intermediate_size
    if shape.model_type in PHI3_LIKE:
        out += [
            LinearModule(f"{p}.mlp.gate_up_proj", h, 2 * inter, L),
            LinearModule(f"{p}.mlp.down_proj", inter, h, L),
        ]
    elif not shape.is_moe:
        out += [
            LinearModule(f"{p}.mlp.gate_proj", h, inter, L),
            LinearModule(f"{p}.mlp.up_proj", h, inter, L),
            LinearModule(f"{p}.mlp.down_proj", inter, h, L),
        ]
    elif shape.shared_expert_intermediate_size:
        s = shape.shared_expert_intermediate_size
        out += [
            LinearModule(f"{p}.mlp.shared_expert.gate_proj", h, s, L),
            LinearModule(f"{p}.mlp.shared_expert.up_proj", h, s, L),
            LinearModule(f"{p}.mlp.shared_expert.down_proj", s, h, L),
            LinearModule(f"{p}.mlp.shared_expert_gate", h, 1, L),
        ]
    if shape.is_moe and shape.model_type in PEFT_MOE_EXPERTS:
        e, ei = shape.num_experts, shape.expert_intermediate_size
        out += [
            LinearModule(f"{p}.mlp.gate", h, e, L, kind="router"),
            LinearModule(f"{p}.mlp.experts.gate_up_proj", h, 2 * ei, L, kind="experts", rank_factor=2 * e),
            LinearModule(f"{p}.mlp.experts.down_proj", ei, h, L, kind="experts", rank_factor=e),
        ]
    out.append(LinearModule("lm_head", h, shape.vocab_size, 1, is_output=True))
    return tuple(out)


def resolve_lora_targets(shape: ModelShape, targets: list[str] | str) -> tuple[LinearModule, ...]:
    """The linear modules PEFT adapts for `target_modules`, matched the way PEFT matches them.

    'all-linear' = every nn.Linear except the output layer; a list matches module names exactly or by
    '.'-separated suffix. Names that match nothing are an error, as in PEFT.
    """
    modules = shape.linear_modules()
    if targets == "all-linear":
        return tuple(m for m in modules if not m.is_output)
    if isinstance(targets, str):
        targets = [targets]
    chosen: dict[str, LinearModule] = {}
    unmatched = []
    for key in targets:
        hits = [hit for m in modules if m.kind != "experts" and (hit := _match(m, key)) is not None]
        if not hits:
            unmatched.append(key)
        for hit in hits:
            old = chosen.get(hit.path)
            chosen[hit.path] = hit if old is None or hit.count > old.count else old
    if not chosen:  # PEFT, too, only fails when no target matches anything
        names = sorted({m.name for m in modules if m.kind != "experts"})
        raise ShapeError(
            f"lora.target_modules {unmatched} match no linear layer of this {shape.model_type} model; "
            f"its linear layers are: {', '.join(names)} (or use 'all-linear')"
        )
    return tuple(chosen.values())


def _match(module: LinearModule, key: str) -> LinearModule | None:
    """PEFT's rule: a module is targeted when its full name equals the key or ends with '.' + key."""
    if "{i}" not in module.path:
        return module if module.path == key or module.path.endswith("." + key) else None
    if not any(ch.isdigit() for ch in key):
        name = module.path.replace("{i}", "0")
        return module if name == key or name.endswith("." + key) else None
    # A key naming a layer index ('layers.3.self_attn.q_proj') adapts only the layers it names.
    hits = 0
    for i in range(module.count):
        name = module.path.replace("{i}", str(i))
        hits += name == key or name.endswith("." + key)
    return replace(module, count=hits) if hits else None


def lora_params(shape: ModelShape, targets: list[str] | str, rank: int) -> int:
    """Trainable LoRA parameters: r * (in + out) per adapted linear."""
    return sum(m.lora_params(rank) for m in resolve_lora_targets(shape, targets))


# --- reading configs ------------------------------------------------------------------------


def shape_from_config(config: dict[str, Any], source: str = "") -> ModelShape:
    """Build a ModelShape from the dict of a config.json."""
    cfg = config
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = {
            **cfg["text_config"],
            "tie_word_embeddings": cfg.get("tie_word_embeddings", cfg["text_config"].get("tie_word_embeddings")),
        }
    model_type = str(cfg.get("model_type", config.get("model_type", ""))).lower()
    if model_type not in SUPPORTED:
        raise ShapeError(
            f"{source or 'this model'} has model_type {model_type!r}, which the memory estimator does not know; "
            f"supported: {', '.join(sorted(SUPPORTED))}"
        )
    try:
        h = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
    except KeyError as exc:
        raise ShapeError(f"{source or 'config.json'} lacks {exc.args[0]!r}; is it a causal language model?") from None
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    num_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0) if model_type in MOE else 0
    inter = int(cfg.get("intermediate_size") or 4 * h)
    expert_inter = int(cfg.get("moe_intermediate_size") or inter) if num_experts else 0
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = model_type in TIED_BY_DEFAULT
    notes = []
    if cfg is not config:
        notes.append("multimodal config: only the text decoder is counted (the vision tower is not)")
    if model_type in ("qwen2_moe", "qwen3_moe") and (
        cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1
    ):
        notes.append("some layers of this MoE model are dense; all are counted as MoE")
    return ModelShape(
        model_type=model_type,
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=bool(tied),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        num_experts=num_experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if num_experts else 0,
        expert_intermediate_size=expert_inter,
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0) if num_experts else 0,
        qk_norm=model_type in QK_NORM,
        norms_per_layer=4 if model_type in FOUR_NORMS else 2,
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype"),
        source=source,
        notes=tuple(notes),
    )


def load_model_shape(name_or_path: str, revision: str | None = None) -> ModelShape:
    """Shape of a model from the demo sentinel, a local folder/config.json, a .gguf file or a Hub id."""
    return _load_cached(str(name_or_path), revision)


@lru_cache(maxsize=64)
def _load_cached(name_or_path: str, revision: str | None) -> ModelShape:
    if name_or_path == DEMO_MODEL:
        return shape_from_config(_read_json(DEMO_CONFIG), source=name_or_path)
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ShapeError(f"GGUF file not found: {path}")
        return shape_from_gguf(path)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ShapeError(f"{path} has no config.json; point model.name_or_path at a Hugging Face model folder")
        return shape_from_config(_read_json(config_file), source=str(path))
    if path.is_file() and path.name.endswith(".json"):
        return shape_from_config(_read_json(path), source=str(path))
    if revision is None and name_or_path in KNOWN_CONFIGS:
        return shape_from_config(KNOWN_CONFIGS[name_or_path], source=name_or_path)
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ShapeError(f"model path not found: {name_or_path}")
    return shape_from_config(_read_json(_download_config(name_or_path, revision)), source=name_or_path)


def _download_config(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover - a declared dependency
        raise ShapeError("huggingface_hub is needed to read a Hub model's config.json") from None
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision))
    except Exception as exc:  # network, gated repo, missing repo: all end here with the reason
        raise ShapeError(
            f"could not fetch config.json of {repo_id!r} from the Hugging Face Hub "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Check the id, your network "
            "and `huggingface-cli login` for gated models, or give a local folder."
        ) from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ShapeError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ShapeError(f"{path} does not hold a JSON object")
    return data


# GGUF architecture names -> transformers model_type.
_GGUF_ARCH = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
}


def shape_from_gguf(path: Path) -> ModelShape:
    """Read the sizes from a GGUF file's metadata (no tensors are loaded)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ShapeError("reading a .gguf needs the `gguf` package (pip install gguf)") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:
        raise ShapeError(f"cannot read GGUF metadata of {path}: {exc}") from None

    def value(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        if f is None:
            return default
        if f.types and f.types[0].name == "ARRAY":
            return len(f.data)
        part = f.parts[f.data[0]]
        if f.types and f.types[0].name == "STRING":
            return bytes(part).decode("utf-8")
        return part.tolist()[0]

    arch = value("general.architecture")
    if arch not in _GGUF_ARCH:
        raise ShapeError(f"{path.name}: GGUF architecture {arch!r} is not supported by the memory estimator")
    a = arch
    config: dict[str, Any] = {
        "model_type": _GGUF_ARCH[arch],
        "hidden_size": value(f"{a}.embedding_length"),
        "intermediate_size": value(f"{a}.feed_forward_length"),
        "num_hidden_layers": value(f"{a}.block_count"),
        "num_attention_heads": value(f"{a}.attention.head_count"),
        "num_key_value_heads": value(f"{a}.attention.head_count_kv"),
        "head_dim": value(f"{a}.attention.key_length"),
        "max_position_embeddings": value(f"{a}.context_length"),
        "vocab_size": value(f"{a}.vocab_size") or value("tokenizer.ggml.tokens"),
        "num_experts": value(f"{a}.expert_count"),
        "num_experts_per_tok": value(f"{a}.expert_used_count"),
        "moe_intermediate_size": value(f"{a}.expert_feed_forward_length"),
        "shared_expert_intermediate_size": value(f"{a}.expert_shared_feed_forward_length"),
    }
    # A GGUF without a separate output tensor reuses the token embedding (tied).
    config["tie_word_embeddings"] = not any(t.name == "output.weight" for t in reader.tensors)
    return shape_from_config({k: v for k, v in config.items() if v is not None}, source=str(path))
