import pytest

from finetune_app.attention import choose_attention
from finetune_app.config import build_config
from finetune_app.translate import model_load_kwargs, to_bnb_config, to_lora_config, to_sft_config


def test_bnb_4bit_nf4_double_quant():
    import torch

    bnb = to_bnb_config(build_config({"model": {"dtype": "bfloat16"}}))
    assert bnb.load_in_4bit and not bnb.load_in_8bit
    assert bnb.bnb_4bit_quant_type == "nf4"
    assert bnb.bnb_4bit_use_double_quant is True
    assert bnb.bnb_4bit_compute_dtype == torch.bfloat16
    assert bnb.bnb_4bit_quant_storage == torch.uint8


def test_bnb_fp4_without_double_quant_and_8bit_and_none():
    fp4 = to_bnb_config(build_config({"quantization": {"quant_type": "fp4", "double_quant": False}}))
    assert fp4.bnb_4bit_quant_type == "fp4" and fp4.bnb_4bit_use_double_quant is False
    eight = to_bnb_config(build_config({"quantization": {"load_in": "8bit", "double_quant": False}}))
    assert eight.load_in_8bit and not eight.load_in_4bit
    assert to_bnb_config(build_config({"quantization": {"load_in": "none", "double_quant": False}})) is None


def test_fsdp_stores_4bit_in_the_compute_dtype():
    import torch

    cfg = build_config({"distributed": {"strategy": "fsdp", "num_processes": 2}, "model": {"dtype": "bfloat16"}})
    assert to_bnb_config(cfg).bnb_4bit_quant_storage == torch.bfloat16


def test_lora_config_fields():
    lora = to_lora_config(
        build_config(
            {"lora": {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"], "use_rslora": True}}
        )
    )
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.use_rslora) == (8, 16, 0.1, True)
    assert set(lora.target_modules) == {"q_proj", "v_proj"}
    assert lora.task_type == "CAUSAL_LM"
    assert to_lora_config(build_config({"lora": {"target_modules": "all-linear"}})).target_modules == "all-linear"
    full = build_config({"lora": {"adapter": "none"}, "quantization": {"load_in": "none", "double_quant": False}})
    assert to_lora_config(full) is None


def test_sft_config_mirrors_training_section(tmp_path):
    cfg = build_config(
        {
            "training": {
                "micro_batch_size": 3,
                "gradient_accumulation_steps": 5,
                "max_length": 77,
                "learning_rate": 1e-4,
                "optimizer": "paged_adamw_8bit",
                "lr_scheduler": "linear",
                "warmup_ratio": 0.1,
                "max_steps": 12,
                "seed": 7,
                "save_steps": 4,
            },
            "memory": {"gradient_checkpointing": True},
            "data": {"packing": True},
            "model": {"dtype": "float32"},
        }
    )
    args = to_sft_config(cfg, tmp_path, on_cuda=False, loss="assistant_only", has_eval=True)
    assert args.per_device_train_batch_size == 3
    assert args.gradient_accumulation_steps == 5
    assert args.max_length == 77
    assert args.learning_rate == pytest.approx(1e-4)
    assert args.optim == "paged_adamw_8bit"
    assert args.max_steps == 12 and args.seed == 7 and args.save_steps == 4
    assert args.packing is True
    assert args.packing_strategy == "wrapped"  # padding-free "bfd" packing needs FlashAttention
    flash = to_sft_config(cfg, tmp_path, on_cuda=True, loss="all", has_eval=False, attention="flash_attention_2")
    assert flash.packing_strategy == "bfd"
    assert args.assistant_only_loss is True
    assert args.eval_strategy == "steps" and args.eval_steps == 4
    assert args.bf16 is False and args.fp16 is False
    assert args.output_dir == str(tmp_path / "checkpoints")
    assert args.get_warmup_steps(100) == 10
    completion = to_sft_config(cfg, tmp_path, on_cuda=False, loss="completion_only", has_eval=False)
    assert completion.completion_only_loss is True and completion.assistant_only_loss is False
    assert completion.eval_strategy == "no"


def test_model_load_kwargs_put_the_model_on_one_gpu_only_for_single():
    single = model_load_kwargs(build_config({}), "sdpa", on_cuda=True)
    assert single["device_map"] == {"": 0}
    assert "quantization_config" in single
    ddp = model_load_kwargs(
        build_config({"distributed": {"strategy": "ddp", "num_processes": 2}}), "sdpa", on_cuda=True
    )
    assert "device_map" not in ddp
    assert "device_map" not in model_load_kwargs(build_config({}), "sdpa", on_cuda=False)


@pytest.mark.parametrize(
    "requested, kwargs, expected, reason",
    [
        (
            "auto",
            dict(on_cuda=False, flash_installed=True, gpu_supports_flash=True, dtype="bfloat16"),
            "sdpa",
            "on CPU",
        ),
        (
            "flash_attention_2",
            dict(on_cuda=True, flash_installed=False, gpu_supports_flash=True, dtype="bfloat16"),
            "sdpa",
            "not installed",
        ),
        (
            "flash_attention_2",
            dict(on_cuda=True, flash_installed=True, gpu_supports_flash=False, dtype="float16"),
            "sdpa",
            "Ampere",
        ),
        ("auto", dict(on_cuda=True, flash_installed=True, gpu_supports_flash=True, dtype="float32"), "sdpa", "float32"),
        (
            "auto",
            dict(on_cuda=True, flash_installed=True, gpu_supports_flash=True, dtype="bfloat16"),
            "flash_attention_2",
            None,
        ),
        ("eager", dict(on_cuda=True, flash_installed=True, gpu_supports_flash=True, dtype="bfloat16"), "eager", None),
    ],
)
def test_attention_fallback_says_why(requested, kwargs, expected, reason):
    choice = choose_attention(requested, **kwargs)
    assert choice.implementation == expected
    if reason is None:
        assert choice.reason is None
    else:
        assert reason in choice.reason
