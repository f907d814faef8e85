from types import SimpleNamespace

import pytest
import yaml

from finetune_app.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    build_config,
    dump_yaml,
    field_docs,
    load_config,
)


def test_every_field_has_a_description():
    docs = field_docs()
    assert len(docs) > 50
    missing = [key for key, text in docs.items() if not text.strip()]
    assert missing == []
    for name, field in RunConfig.model_fields.items():
        assert field.description, name


def test_yaml_round_trip_is_byte_stable(tmp_path):
    cfg = build_config({"lora": {"r": 64, "target_modules": ["q_proj", "v_proj"]}, "training": {"learning_rate": 3e-5}})
    first = dump_yaml(cfg)
    path = tmp_path / "p.yaml"
    path.write_text(first)
    second = dump_yaml(load_config(path))
    assert first == second
    assert load_config(path) == cfg


def test_dotted_overrides_are_typed():
    cfg = build_config(
        {},
        [
            "training.learning_rate=1e-4",
            "lora.r=32",
            "memory.gradient_checkpointing=false",
            "lora.target_modules=q_proj,v_proj",
            "export.push_to_hub=null",
        ],
    )
    assert cfg.training.learning_rate == pytest.approx(1e-4)
    assert cfg.lora.r == 32
    assert cfg.memory.gradient_checkpointing is False
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.export.push_to_hub is None


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.nope=1", "unknown field 'nope' in section 'training'"),
        ("nosection.x=1", "unknown override key"),
        ("training=1", "unknown override key"),
        ("learning_rate", "must look like section.field=value"),
    ],
)
def test_bad_overrides_name_the_valid_keys(override, expected):
    with pytest.raises(ConfigError, match=expected):
        apply_overrides({}, [override])


def test_invalid_config_lists_every_problem_with_allowed_values():
    with pytest.raises(ConfigError) as info:
        build_config(
            {"lora": {"r": 0, "bogus": 1}, "quantization": {"load_in": "3bit"}, "training": {"optimizer": "adam"}}
        )
    text = str(info.value)
    assert "4 problem(s)" in text
    assert "lora.r" in text and "greater than or equal to 1" in text
    assert "lora.bogus: unknown key; allowed here: adapter, r, alpha" in text
    assert "quantization.load_in" in text and "'4bit', '8bit' or 'none'" in text
    assert "training.optimizer" in text and "paged_adamw_8bit" in text


@pytest.mark.parametrize(
    "data, message",
    [
        ({"lora": {"adapter": "none"}}, "needs an adapter"),
        ({"quantization": {"load_in": "8bit"}}, "double_quant applies to 4-bit only"),
        (
            {"quantization": {"load_in": "none", "double_quant": False, "quant_type": "fp4"}},
            "fp4 applies to 4-bit only",
        ),
        ({"distributed": {"strategy": "fsdp", "num_processes": 1}}, "fsdp needs at least 2 processes"),
        ({"distributed": {"strategy": "single", "num_processes": 2}}, "needs distributed.strategy=ddp or fsdp"),
        ({"distributed": {"cpu_offload": True}}, "cpu_offload needs distributed.strategy=fsdp"),
        (
            {
                "distributed": {"strategy": "fsdp", "num_processes": 2},
                "quantization": {"load_in": "8bit", "double_quant": False},
            },
            "cannot be sharded by FSDP",
        ),
        (
            {"distributed": {"strategy": "fsdp", "num_processes": 2}, "quantization": {"quant_storage": "uint8"}},
            "silent NaN",
        ),
        ({"distributed": {"num_nodes": 2, "strategy": "ddp"}}, "rdzv_endpoint"),
        ({"export": {"push_to_hub": "me/x", "push_what": "merged"}}, "needs export.merge=true"),
        (
            {
                "lora": {"adapter": "none"},
                "quantization": {"load_in": "none", "double_quant": False},
                "model": {"dtype": "float16"},
            },
            "fp16 gradient scaler",
        ),
        ({"data": {"eval_path": "e.jsonl", "eval_fraction": 0.1}}, "not both"),
        ({"distributed": {"num_nodes": 2, "rdzv_endpoint": "h:1"}}, "num_nodes>1 needs distributed.strategy"),
    ],
)
def test_cross_field_rules(data, message):
    with pytest.raises(ConfigError, match=message):
        build_config(data)


def test_full_finetune_without_quantization_is_allowed():
    cfg = build_config({"lora": {"adapter": "none"}, "quantization": {"load_in": "none", "double_quant": False}})
    assert not cfg.is_quantized


def test_bf16_refused_on_a_gpu_without_bf16():
    t4 = SimpleNamespace(name="Tesla T4", compute_capability=(7, 5), bf16=False)
    with pytest.raises(ConfigError, match=r"GPU 0 \(Tesla T4, compute capability 7.5.*set model.dtype=float16"):
        build_config({}, gpus=[t4])
    assert build_config({"model": {"dtype": "float16"}}, gpus=[t4]).model.dtype == "float16"


def test_quant_storage_follows_dtype_under_fsdp():
    single = build_config({})
    fsdp = build_config({"distributed": {"strategy": "fsdp", "num_processes": 2}})
    assert single.effective_quant_storage == "uint8"
    assert fsdp.effective_quant_storage == "bfloat16"


def test_preset_must_be_a_mapping(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)
    path.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="preset not found"):
        load_config(tmp_path / "missing.yaml")


def test_dump_is_plain_yaml():
    assert yaml.safe_load(dump_yaml(RunConfig()))["quantization"]["load_in"] == "4bit"
