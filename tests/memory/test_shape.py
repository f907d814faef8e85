"""Model shapes from config.json, and LoRA target resolution checked against real PEFT on tiny models."""

from __future__ import annotations

import json

import pytest

from finetune_app.config import DEMO_MODEL
from finetune_app.memory.shape import (
    ShapeError,
    load_model_shape,
    lora_params,
    resolve_lora_targets,
    shape_from_config,
)

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
ARCHS = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 24},
    "gemma": {"head_dim": 24},
    "gemma2": {"head_dim": 24},
    "phi3": {},
    "mistral": {},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 48,
        "shared_expert_intermediate_size": 80,
    },
}


def _tiny_model(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **TINY, **ARCHS[model_type])
    return config, AutoModelForCausalLM.from_config(config)


def test_demo_model_shape():
    shape = load_model_shape(DEMO_MODEL)
    assert (shape.hidden_size, shape.num_layers, shape.num_heads, shape.num_kv_heads) == (576, 30, 9, 3)
    assert (shape.head_dim, shape.intermediate_size, shape.vocab_size) == (64, 1536, 49152)
    assert shape.tie_word_embeddings and shape.lm_head_params == 0
    # SmolLM2-135M has 134.5M parameters.
    assert shape.total_params == 134_515_008


def test_local_folder_with_only_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **TINY}))
    shape = load_model_shape(str(tmp_path))
    assert shape.hidden_size == 64 and shape.kv_dim == 32


def test_missing_things_are_clear_errors(tmp_path):
    with pytest.raises(ShapeError, match="no config.json"):
        load_model_shape(str(tmp_path))
    with pytest.raises(ShapeError, match="not found"):
        load_model_shape(str(tmp_path / "nope.gguf"))
    with pytest.raises(ShapeError, match="does not know"):
        shape_from_config({"model_type": "bert", **TINY})


def test_gemma3_text_config_nesting():
    config = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", **TINY, "head_dim": 32}}
    shape = shape_from_config(config)
    assert shape.model_type == "gemma3_text" and shape.head_dim == 32 and shape.qk_norm
    assert shape.norms_per_layer == 4 and shape.tie_word_embeddings
    assert any("vision" in note for note in shape.notes)


@pytest.mark.parametrize("model_type", sorted(ARCHS))
def test_parameter_count_matches_transformers(model_type):
    config, model = _tiny_model(model_type)
    shape = shape_from_config(config.to_dict())
    assert shape.total_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", sorted(ARCHS))
@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["o_proj", "down_proj"]])
def test_lora_params_match_peft(model_type, targets):
    from peft import LoraConfig, get_peft_model

    config, model = _tiny_model(model_type)
    shape = shape_from_config(config.to_dict())
    try:
        peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=targets, task_type="CAUSAL_LM"))
    except ValueError:  # PEFT found none of the targets: so must we
        with pytest.raises(ShapeError, match="match no linear layer"):
            lora_params(shape, targets, 8)
        return
    trainable, _ = peft_model.get_nb_trainable_parameters()
    assert lora_params(shape, targets, 8) == trainable


def test_unknown_targets_are_an_error():
    shape = shape_from_config({"model_type": "llama", **TINY})
    with pytest.raises(ShapeError, match="q_proj"):
        resolve_lora_targets(shape, ["query_key_value"])


def test_layer_specific_target_counts_one_layer():
    shape = shape_from_config({"model_type": "llama", **TINY})
    (module,) = resolve_lora_targets(shape, ["layers.1.self_attn.q_proj"])
    assert module.count == 1


def test_gguf_metadata(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(256)
    writer.add_vocab_size(128)
    import numpy as np

    writer.add_tensor("token_embd.weight", np.zeros((128, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shape = load_model_shape(str(path))
    assert (shape.hidden_size, shape.num_layers, shape.num_kv_heads, shape.vocab_size) == (64, 2, 2, 128)
    assert shape.tie_word_embeddings  # no output.weight tensor
