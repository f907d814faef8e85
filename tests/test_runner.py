"""The headless run on a tiny random Llama: events, adapter, refusal to overwrite, stop and resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune_app.config import build_config, load_config
from finetune_app.events import read_events
from finetune_app.runner import RunError, last_checkpoint, prepare_run_dir, run_training

ROOT = Path(__file__).parent.parent


@pytest.fixture()
def chat_file(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": f"what is {i}?"}, {"role": "assistant", "content": f"it is {i}."}]}
        for i in range(24)
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def tiny_config(model_dir, data_path, **training):
    values = {
        "max_steps": 4,
        "micro_batch_size": 2,
        "max_length": 48,
        "save_steps": 2,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        **training,
    }
    return build_config(
        {
            "model": {"name_or_path": str(model_dir), "dtype": "float32"},
            "data": {"path": str(data_path)},
            "training": values,
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
        }
    )


def test_qlora_run_writes_events_checkpoints_and_a_loadable_adapter(tiny_model_dir, chat_file, tmp_path):
    cfg = tiny_config(tiny_model_dir, chat_file)
    result = run_training(cfg, tmp_path / "run", log=lambda *_: None)
    assert result.status == "completed"
    events = read_events(tmp_path / "run")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert "train_begin" in kinds and "checkpoint" in kinds
    logs = [e for e in events if e["event"] == "log"]
    assert [e["step"] for e in logs] == [1, 2, 3, 4]
    assert all(e["loss"] > 0 and e["tokens_per_second"] > 0 and "memory" in e for e in logs)
    assert events[-1]["status"] == "completed"
    assert load_config(tmp_path / "run" / "config.yaml") == cfg
    # The adapter loads back onto the base with PEFT and changes its output.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "run" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    ids = torch.tensor([[5, 6, 7, 8]])
    before = base(ids).logits
    tuned = PeftModel.from_pretrained(base, str(adapter))
    assert not torch.allclose(tuned(ids).logits, before)


def test_existing_run_dir_is_never_overwritten(tiny_model_dir, chat_file, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text('{"event": "start"}\n')
    cfg = tiny_config(tiny_model_dir, chat_file)
    with pytest.raises(RunError, match="already holds a run; pass --resume"):
        prepare_run_dir(run_dir, cfg, resume=False)
    assert (run_dir / "events.jsonl").read_text() == '{"event": "start"}\n'
    with pytest.raises(RunError, match="no checkpoint yet"):
        prepare_run_dir(run_dir, cfg, resume=True)


def _train_command(preset, run_dir, *overrides):
    return [sys.executable, "-m", "finetune_app", "train", str(preset), *overrides, "--run-dir", str(run_dir)]


def _wait_for(predicate, timeout=120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_sigint_stops_with_a_checkpoint_and_resume_continues(tiny_model_dir, chat_file, tmp_path):
    from finetune_app.config import dump_yaml

    preset = tmp_path / "tiny.yaml"
    preset.write_text(dump_yaml(tiny_config(tiny_model_dir, chat_file, max_steps=400, save_steps=1000)))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        _train_command(preset, run_dir), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert _wait_for(lambda: any(e["event"] == "log" and e["step"] >= 2 for e in read_events(run_dir)))
        child.send_signal(signal.SIGINT)
        output, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, output
    end = read_events(run_dir)[-1]
    assert end["event"] == "end" and end["status"] == "stopped"
    stopped_at = end["step"]
    assert 2 <= stopped_at < 400
    checkpoint = last_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == f"checkpoint-{stopped_at}"
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()

    resumed = subprocess.run(
        _train_command(preset, run_dir, f"training.max_steps={stopped_at + 2}") + ["--resume"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    events = read_events(run_dir)
    begins = [e for e in events if e["event"] == "train_begin"]
    assert begins[-1]["step"] == stopped_at  # continued, not restarted
    assert events[-1]["event"] == "end" and events[-1]["status"] == "completed"
    assert events[-1]["step"] == stopped_at + 2


def test_cli_rejects_a_bad_preset_before_loading_anything(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("lora:\n  r: -1\n  colour: red\ntraining:\n  optimizer: sgdx\n")
    # From tmp_path: output.dir=runs would be created here if anything got past validation.
    result = subprocess.run(
        [sys.executable, "-m", "finetune_app", "train", str(preset)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for expected in ("lora.r", "lora.colour: unknown key", "training.optimizer", "adamw_torch"):
        assert expected in result.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_help_lists_the_commands():
    result = subprocess.run(
        [sys.executable, "-m", "finetune_app", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    for command in ("train", "estimate", "gpus", "export", "gui"):
        assert command in result.stdout
    launcher = subprocess.run(
        [sys.executable, "launcher.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert launcher.returncode == 0 and "--preset" in launcher.stdout
