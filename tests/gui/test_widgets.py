import typing

import pytest

from finetune_app.config import ConfigError, RunConfig, build_config, dump_yaml
from finetune_app.gui.widgets import (
    config_to_values,
    dependent_updates,
    field_specs,
    from_widget_value,
    make_widget,
    override_args,
    try_config,
    values_to_config,
)

CUSTOM = {
    "model": {"name_or_path": "org/model", "revision": "v2", "dtype": "float16", "trust_remote_code": True},
    "quantization": {"load_in": "none", "double_quant": False, "quant_storage": "bfloat16"},
    "lora": {"r": 64, "alpha": 16, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"], "use_rslora": True},
    "data": {"path": "data.jsonl", "format": "alpaca", "eval_fraction": 0.1, "max_samples": 500, "packing": True},
    "training": {
        "micro_batch_size": 2,
        "max_steps": 30,
        "learning_rate": 1e-5,
        "save_total_limit": None,
        "eval_steps": 10,
        "optimizer": "paged_adamw_8bit",
    },
    "memory": {"attention": "eager", "gradient_checkpointing": False},
    "distributed": {"strategy": "fsdp", "num_processes": 2, "gpu_ids": [0, 3], "cpu_offload": True},
    "export": {"merge": True, "push_to_hub": "me/model", "push_what": "merged"},
    "output": {"dir": "elsewhere", "run_name": "exp-1"},
}


def test_every_config_field_gets_exactly_one_widget():
    keys = [spec.key for spec in field_specs()]
    expected = [
        f"{section}.{name}"
        for section, field in RunConfig.model_fields.items()
        for name in field.annotation.model_fields
    ]
    assert keys == expected
    for spec in field_specs():
        assert spec.description, f"{spec.key} has no help text"


def test_widget_kind_follows_the_annotation():
    specs = {spec.key: spec for spec in field_specs()}
    for spec in specs.values():
        annotation = RunConfig.model_fields[spec.section].annotation.model_fields[spec.name].annotation
        if annotation is bool:
            assert spec.kind == "checkbox"
        if typing.get_origin(annotation) is typing.Literal:
            assert spec.kind == "dropdown" and spec.choices == typing.get_args(annotation)
    assert specs["quantization.quant_storage"].choices == ("bfloat16", "float16", "float32", "uint8", "auto")
    assert (specs["lora.r"].kind, specs["lora.r"].minimum, specs["lora.r"].maximum) == ("int", 1, 1024)
    assert (specs["lora.dropout"].kind, specs["lora.dropout"].maximum) == ("float", 1.0)
    assert specs["lora.target_modules"].kind == "list" and specs["lora.target_modules"].choices == ("all-linear",)
    assert specs["distributed.gpu_ids"].item_type is int and specs["distributed.gpu_ids"].optional
    assert specs["training.eval_steps"].optional and specs["model.revision"].optional


@pytest.mark.parametrize("data", [{}, CUSTOM], ids=["defaults", "custom"])
def test_widget_values_round_trip_to_the_same_config(data):
    cfg = build_config(data)
    specs = field_specs()
    values = config_to_values(cfg, specs)
    assert values_to_config(specs, values) == cfg
    assert dump_yaml(values_to_config(specs, values)) == dump_yaml(cfg)


def test_widget_text_is_parsed_like_a_user_types_it():
    specs = {spec.key: spec for spec in field_specs()}
    assert from_widget_value(specs["lora.target_modules"], " q_proj ,v_proj, ") == ["q_proj", "v_proj"]
    assert from_widget_value(specs["lora.target_modules"], "all-linear") == "all-linear"
    assert from_widget_value(specs["distributed.gpu_ids"], "0, 1") == [0, 1]
    assert from_widget_value(specs["distributed.gpu_ids"], "") is None
    assert from_widget_value(specs["model.revision"], "  ") is None
    assert from_widget_value(specs["training.eval_steps"], None) is None
    assert from_widget_value(specs["lora.r"], 8.0) == 8 and isinstance(from_widget_value(specs["lora.r"], 8.0), int)


def test_invalid_values_give_the_formatted_config_error():
    specs = field_specs()
    values = config_to_values(RunConfig(), specs)
    values[[s.key for s in specs].index("lora.r")] = 0
    values[[s.key for s in specs].index("distributed.gpu_ids")] = "0, x"
    cfg, error = try_config(specs, values)
    assert cfg is None
    assert "lora.r" in error and "distributed.gpu_ids" in error and "problem(s)" in error
    with pytest.raises(ConfigError):
        values_to_config(specs, values)


def test_turning_4bit_off_stays_valid_thanks_to_dependent_fields():
    specs = field_specs()
    keys = [s.key for s in specs]
    values = config_to_values(RunConfig(), specs)
    values[keys.index("quantization.load_in")] = "none"
    assert try_config(specs, values)[0] is None  # double_quant=True is only valid with 4-bit
    for key, value in dependent_updates("none").items():
        values[keys.index(key)] = value
    cfg, error = try_config(specs, values)
    assert error == "" and cfg.quantization.load_in == "none"
    for key, value in dependent_updates("4bit").items():
        values[keys.index(key)] = value
    values[keys.index("quantization.load_in")] = "4bit"
    assert try_config(specs, values)[0] == RunConfig()


def test_override_args_reproduce_the_config_on_the_command_line():
    base = RunConfig()
    cfg = build_config(CUSTOM)
    args = override_args(cfg, base)
    assert "lora.r=64" in args and "lora.target_modules=q_proj,v_proj" in args
    assert "distributed.gpu_ids=[0,3]" in args and "training.save_total_limit=null" in args
    assert build_config(base.model_dump(mode="json"), args) == cfg
    assert override_args(base, base) == []


def test_make_widget_builds_gradio_components_with_help_text_and_bounds():
    import gradio as gr

    specs = {spec.key: spec for spec in field_specs()}
    rank = make_widget(specs["lora.r"], 16)
    assert isinstance(rank, gr.Number) and (rank.minimum, rank.maximum, rank.precision) == (1, 1024, 0)
    assert "LoRA rank" in rank.info and rank.elem_id == "field-lora-r"
    load_in = make_widget(specs["quantization.load_in"], "4bit")
    assert isinstance(load_in, gr.Dropdown) and [c[1] for c in load_in.choices] == ["4bit", "8bit", "none"]
    assert isinstance(make_widget(specs["memory.gradient_checkpointing"], True), gr.Checkbox)
    targets = make_widget(specs["lora.target_modules"], ["q_proj", "k_proj"])
    assert isinstance(targets, gr.Textbox) and targets.value == "q_proj, k_proj"


def test_optional_numbers_are_textboxes_where_empty_means_not_set():
    import gradio as gr

    specs = {spec.key: spec for spec in field_specs()}
    eval_steps = specs["training.eval_steps"]
    assert isinstance(make_widget(eval_steps, None), gr.Textbox)
    assert from_widget_value(eval_steps, "") is None
    assert from_widget_value(eval_steps, " 50 ") == 50
    values = config_to_values(RunConfig(), list(specs.values()))
    values[list(specs).index("training.eval_steps")] = "often"
    assert "training.eval_steps" in try_config(list(specs.values()), values)[1]
