"""Export: adapter save, QLoRA merge with its logit check, memory/disk refusal, atomic folders, CLI errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from finetune_app import export as ex
from finetune_app.config import build_config, dump_yaml

GIB = 1024**3


# ---------------------------------------------------------------------------------------------
# A run directory as the runner leaves it (used by test_hub.py and test_no_token_leak.py too)


def make_run_dir(root: Path, base_dir: Path, *, seed: int = 0, config: dict | None = None) -> Path:
    """RUN/config.yaml + events.jsonl + adapter/ with non-zero LoRA B weights, so merging changes logits."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = Path(root) / "run"
    (run / "adapter").mkdir(parents=True)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(seed)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            param.data = torch.randn(param.shape, generator=generator) * 0.05
    peft_model.save_pretrained(str(run / "adapter"))
    tokenizer.save_pretrained(str(run / "adapter"))
    data = {"model": {"name_or_path": str(base_dir)}, "lora": {"r": 8, "alpha": 16}, "output": {"run_name": "tiny-run"}}
    for section, values in (config or {}).items():
        data.setdefault(section, {}).update(values)
    cfg = build_config(data)
    (run / "config.yaml").write_text(dump_yaml(cfg), encoding="utf-8")
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in fake_events(run)), encoding="utf-8")
    return run


def fake_events(run: Path) -> list[dict]:
    estimate = {"weights": 3 * GIB // 2, "lora": GIB // 10, "activations": GIB, "total": 3 * GIB}
    events = [
        {
            "event": "start",
            "time": 1.0,
            "run_dir": str(run),
            "total_steps": 4,
            "estimate": estimate,
            "device": "NVIDIA test GPU",
        }
    ]
    for step in range(1, 5):
        memory = {"allocated_peak": int(2.0 * GIB) + step, "reserved_peak": int(2.5 * GIB) + step}
        events.append(
            {
                "event": "log",
                "time": 1.0 + step,
                "step": step,
                "total_steps": 4,
                "loss": 3.0 / step,
                "learning_rate": 2e-4,
                "memory": memory,
            }
        )
    events.append({"event": "eval", "time": 6.0, "step": 4, "eval_loss": 1.1})
    events.append(
        {
            "event": "end",
            "time": 7.0,
            "status": "completed",
            "adapter_path": str(run / "adapter"),
            "train_loss": 1.2,
            "runtime_seconds": 90.0,
        }
    )
    return events


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir) -> Path:
    return make_run_dir(tmp_path_factory.mktemp("export"), tiny_model_dir)


def export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune_app export")
    ex.add_export_arguments(parser)
    return parser


def cli(*argv: str) -> int:
    return ex.run_export(export_parser().parse_args([str(a) for a in argv]))


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def logits_of(model, tokenizer, text: str = "The capital of France is"):
    import torch

    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).logits.float()


# ---------------------------------------------------------------------------------------------
# Adapter export


def test_adapter_export_has_weights_tokenizer_config_card_and_curve(run_dir):
    folder = ex.export_adapter(run_dir, rebuild=True)
    assert folder == run_dir / "exports" / "adapter"
    assert (folder / "adapter_model.safetensors").read_bytes() == (
        run_dir / "adapter" / "adapter_model.safetensors"
    ).read_bytes()
    assert (folder / "config.yaml").read_text() == (run_dir / "config.yaml").read_text()
    for name in ("tokenizer.json", "tokenizer_config.json", "adapter_config.json", "finetune_app_export.json"):
        assert (folder / name).is_file(), name
    assert (folder / "training_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    card = (folder / "README.md").read_text()
    assert "library_name: peft" in card and "PeftModel.from_pretrained" in card
    assert "![Training loss](training_loss.png)" in card
    assert "QLoRA" in card and "NF4 + double quantization" in card
    assert "| `lora.r` | `8` |" in card and "| `training.learning_rate` | `0.0002` |" in card
    assert "| total | 3.00 |" in card  # the estimate from the start event
    assert "reserved_peak: 2.50 GiB" in card  # max of the logged measurements
    leftovers = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_adapter_export_is_reused_unless_rebuilt_or_adapter_changed(run_dir):
    folder = ex.export_adapter(run_dir, rebuild=True)
    marker = (folder / ex.EXPORT_MARKER).read_bytes()
    (folder / "README.md").write_text("edited")
    assert ex.export_adapter(run_dir) == folder
    assert (folder / "README.md").read_text() == "edited"  # reused, not rebuilt
    ex.export_adapter(run_dir, rebuild=True)
    assert (folder / "README.md").read_text() != "edited"
    assert ex.reusable_export(folder, "adapter", None, "0" * 64) is False
    assert json.loads(marker)["adapter_sha256"] == ex.adapter_fingerprint(run_dir / "adapter")


def test_failed_export_leaves_previous_export_untouched(run_dir, monkeypatch):
    folder = ex.export_adapter(run_dir, rebuild=True)
    before = tree_bytes(folder)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(ex, "_write_marker", disk_full)  # the very last write of an export
    with pytest.raises(OSError):
        ex.export_adapter(run_dir, rebuild=True)
    assert tree_bytes(folder) == before
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".adapter.")]  # no temp or old copies


def test_killed_export_never_leaves_a_complete_looking_folder(tmp_path, run_dir):
    import subprocess
    import sys

    output = tmp_path / "out"
    script = (
        "import os, sys\n"
        "from finetune_app import export as ex\n"
        "ex._write_marker = lambda *a, **k: os._exit(9)\n"  # the process dies just before finishing
        f"ex.export_adapter({str(run_dir)!r}, output={str(output)!r})\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 9, result.stderr
    assert not output.exists()
    partial = [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert partial and not (partial[0] / ex.EXPORT_MARKER).exists()  # hidden, unfinished, unmarked


def test_output_folder_that_is_not_an_export_is_never_replaced(run_dir, tmp_path):
    precious = tmp_path / "my-stuff"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(ex.ExportError, match="not a finetune_app export"):
        ex.export_adapter(run_dir, output=precious)
    assert (precious / "thesis.tex").read_text() == "years of work"


# ---------------------------------------------------------------------------------------------
# Merge


def test_fp32_merge_matches_base_plus_adapter_and_loads_with_plain_transformers(run_dir, tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    output = tmp_path / "merged"
    folder = ex.merge_adapter(run_dir, dtype="fp32", output=output, max_shard_size="100KB")
    assert len(list(folder.glob("model-*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").is_file()

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    merged = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert merged.dtype == torch.float32
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    base_logits = logits_of(base, tokenizer)
    unmerged = PeftModel.from_pretrained(base, str(run_dir / "adapter")).eval()
    expected = logits_of(unmerged, tokenizer)
    got = logits_of(merged, tokenizer)
    scale = expected.abs().max()
    assert float((got - expected).abs().max() / scale) <= ex.MERGE_TOLERANCE["float32"]
    # The adapter really changes the model, so the check above could fail for a wrong merge.
    assert float((base_logits - expected).abs().max() / scale) > 5 * ex.MERGE_TOLERANCE["bfloat16"]

    check = json.loads((folder / "merge_check.json").read_text())
    assert check["passed"] and check["dtype"] == "float32" and check["relative_diff"] <= check["tolerance"]
    card = (folder / "README.md").read_text()
    assert "## Merge check" in card and "AutoModelForCausalLM.from_pretrained" in card
    assert "library_name: transformers" in card


def test_bf16_merge_records_its_check_and_saves_bf16(run_dir, tmp_path):
    folder = ex.merge_adapter(run_dir, dtype="bf16", output=tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert "quantization_config" not in config
    check = json.loads((folder / "merge_check.json").read_text())
    assert check["dtype"] == "bfloat16" and 0 < check["relative_diff"] <= ex.MERGE_TOLERANCE["bfloat16"]
    assert f"{check['relative_diff']:.3g}" in (folder / "README.md").read_text()


def test_merge_plan_counts_bytes_from_params_and_dtype():
    plan = ex.MergePlan("bfloat16", base_params=8_000_000_000, adapter_params=40_000_000)
    assert plan.weights_bytes == 16_000_000_000
    assert plan.memory_bytes > plan.weights_bytes + 40_000_000 * 4
    assert plan.disk_bytes >= plan.weights_bytes
    assert ex.MergePlan("float32", 8_000_000_000, 0).weights_bytes == 32_000_000_000


def test_merge_device_prefers_a_gpu_with_room_then_cpu():
    plan = ex.MergePlan("bfloat16", 1_000_000_000, 0)  # ~2 GB of weights
    need = plan.memory_bytes
    assert ex.choose_merge_device(plan, ram_available=need, disk_free=10**12, gpu_free=[need - 1, need + 1]) == "cuda:1"
    assert ex.choose_merge_device(plan, ram_available=need, disk_free=10**12, gpu_free=[need - 1]) == "cpu"
    assert ex.choose_merge_device(plan, ram_available=need, disk_free=10**12, gpu_free=[]) == "cpu"


def test_merge_refuses_when_memory_or_disk_is_short():
    plan = ex.MergePlan("bfloat16", 8_000_000_000, 0)
    with pytest.raises(ex.ExportError, match=r"will not fit in memory: it needs ~16\.\d\d GiB.*RAM 8\.00 GiB"):
        ex.choose_merge_device(plan, ram_available=8 * GIB, disk_free=10**12, gpu_free=[4 * GIB])
    with pytest.raises(ex.ExportError, match="will not fit on disk"):
        ex.choose_merge_device(plan, ram_available=10**12, disk_free=10 * GIB, gpu_free=[])


def test_param_count_from_safetensors_headers_matches_the_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert ex.safetensors_param_count(tiny_model_dir) == model.num_parameters()


def test_merge_refuses_a_quantized_model(tiny_model_dir, run_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), quantization_config=quant)
    model = PeftModel.from_pretrained(base, str(run_dir / "adapter"))
    with pytest.raises(ex.ExportError, match="refusing to merge into a quantized model"):
        ex.refuse_quantized_model(model)
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    ex.refuse_quantized_model(PeftModel.from_pretrained(plain, str(run_dir / "adapter")))  # no error


def test_merge_refuses_a_pre_quantized_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "bitsandbytes"}}))
    with pytest.raises(ex.ExportError, match="pre-quantized"):
        ex.refuse_quantized_checkpoint(str(tmp_path))


def test_export_after_training_saves_adapter_and_merge(tmp_path, tiny_model_dir):
    run = make_run_dir(tmp_path, tiny_model_dir, config={"export": {"merge": True, "merge_dtype": "float32"}})
    from finetune_app.config import load_config

    messages: list[str] = []
    result = ex.export_after_training(load_config(run / "config.yaml"), run, progress=messages.append)
    assert result.ok, result.problems
    assert result.adapter_dir == run / "exports" / "adapter" and result.merged_dir == run / "exports" / "merged-fp32"
    assert result.merge_check["passed"] and result.repo_url is None
    assert any(m.startswith("Merge plan:") for m in messages) and any("Merge check:" in m for m in messages)
    assert "merged_dir=" in str(result)


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_exports_and_reports_errors_without_traceback(run_dir, tmp_path, capsys):
    assert cli(run_dir, "--adapter", "--output", tmp_path / "a") == 0
    assert (tmp_path / "a" / "adapter_model.safetensors").is_file()

    assert cli(tmp_path / "nope", "--adapter") == 1
    err = capsys.readouterr().err
    assert "run directory not found" in err and "Traceback" not in err

    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    assert cli(unfinished, "--merge") == 1
    err = capsys.readouterr().err
    assert "no final adapter yet" in err and "Traceback" not in err

    assert cli(run_dir, "--adapter", "--push", "not a repo") == 1
    assert "must look like namespace/name" in capsys.readouterr().err


def test_cli_requires_adapter_or_merge():
    with pytest.raises(SystemExit):
        export_parser().parse_args(["run"])
    args = export_parser().parse_args(["run", "--merge", "--dtype", "fp16", "--push", "a/b", "--public"])
    assert args.merge and args.dtype == "fp16" and args.private is False


# ---------------------------------------------------------------------------------------------
# The real demo model


@pytest.mark.slow
def test_demo_model_merge_matches_base_plus_adapter(tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune_app.config import DEMO_MODEL
    from finetune_app.demo_model import ensure_demo_model

    demo = ensure_demo_model()
    run = make_run_dir(tmp_path, demo, config={"model": {"name_or_path": DEMO_MODEL}})
    for dtype, name in (("fp32", "float32"), ("bf16", "bfloat16")):
        folder = ex.merge_adapter(run, dtype=dtype)
        check = json.loads((folder / "merge_check.json").read_text())
        assert check["passed"] and check["relative_diff"] <= ex.MERGE_TOLERANCE[name]
    tokenizer = AutoTokenizer.from_pretrained(str(run / "exports" / "merged-fp32"))
    merged = AutoModelForCausalLM.from_pretrained(str(run / "exports" / "merged-fp32")).eval()
    base = AutoModelForCausalLM.from_pretrained(str(demo), dtype=torch.float32)
    unmerged = PeftModel.from_pretrained(base, str(run / "adapter")).eval()
    expected, got = logits_of(unmerged, tokenizer), logits_of(merged, tokenizer)
    assert float((got - expected).abs().max() / expected.abs().max()) <= ex.MERGE_TOLERANCE["float32"]
    card = (run / "exports" / "merged-bf16" / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
