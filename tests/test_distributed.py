"""DDP and FSDP + QLoRA on 2 CPU processes (gloo), launched the real way: `python -m finetune_app train`.

accelerate only enables FSDP for GPU processes; tests/cpu_fsdp/sitecustomize.py (put on the ranks'
PYTHONPATH) lets it use FSDP across CPU processes too. Everything else is the product's code path:
launch.py -> accelerate launch -> torchrun -> runner -> TRL/PEFT/bitsandbytes/FSDP2.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from finetune_app.config import build_config
from finetune_app.distributed import (
    check_adapter_saved,
    fsdp_options,
    local_parameter_summary,
    rank_placement,
    sft_distributed_args,
)
from finetune_app.events import read_events

TESTS = Path(__file__).parent


def _cfg(**distributed):
    return build_config({"distributed": distributed, "model": {"dtype": "float32"}})


# --------------------------------------------------------------------------------------------
# What each rank passes to the HF libraries


def test_fsdp_arguments_become_accelerates_fsdp2_plugin(tmp_path):
    from accelerate.utils import FullyShardedDataParallelPlugin

    from finetune_app.translate import to_sft_config

    cfg = _cfg(strategy="fsdp", num_processes=2, fsdp_sharding="shard_grad_op", cpu_offload=True)
    args = to_sft_config(
        cfg, tmp_path, on_cuda=False, loss="completion_only", has_eval=False, extra=sft_distributed_args(cfg)
    )
    plugin_args = args.fsdp_plugin_args
    assert plugin_args["fsdp_version"] == 2
    assert plugin_args["reshard_after_forward"] is False  # shard_grad_op
    assert plugin_args["cpu_offload"] is True
    assert plugin_args["state_dict_type"] == "FULL_STATE_DICT"  # the saved adapter is whole
    # Activation checkpointing stays the HF flag (FSDP's own wrapper made PEFT save an empty adapter).
    assert plugin_args["activation_checkpointing"] is False
    assert args.activation_checkpointing is True
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False


def test_full_shard_reshards_and_layer_classes_are_passed_on():
    options = fsdp_options(_cfg(strategy="fsdp", num_processes=2), ["LlamaDecoderLayer"])
    assert options["reshard_after_forward"] is True and options["cpu_offload"] is False
    assert options["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]


def test_hybrid_shard_uses_a_replicate_by_shard_mesh():
    cfg = _cfg(strategy="fsdp", num_processes=4, num_nodes=2, rdzv_endpoint="h:1", fsdp_sharding="hybrid_shard")
    mesh = sft_distributed_args(cfg)["parallelism_config"]
    assert (mesh.dp_replicate_size, mesh.dp_shard_size) == (2, 4)


def test_single_and_ddp_need_no_extra_trainer_arguments():
    assert sft_distributed_args(_cfg()) == {}
    assert sft_distributed_args(_cfg(strategy="ddp", num_processes=2)) == {}


def test_each_rank_loads_onto_its_own_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_placement(_cfg(strategy="ddp", num_processes=2), on_cuda=True) == {"device_map": {"": 1}}
    assert rank_placement(_cfg(strategy="fsdp", num_processes=2), on_cuda=True) == {"device_map": {"": 1}}
    assert rank_placement(_cfg(strategy="ddp", num_processes=2), on_cuda=False) == {}
    assert rank_placement(_cfg(), on_cuda=True) == {}  # single: translate.model_load_kwargs places it


def test_an_empty_adapter_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({}, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(RuntimeError, match="holds no weights"):
        check_adapter_saved(tmp_path)
    save_file({"a": torch.zeros(2)}, str(tmp_path / "adapter_model.safetensors"))
    check_adapter_saved(tmp_path)


def test_parameter_summary_of_an_unsharded_model_is_whole():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model[0].requires_grad_(False)
    summary = local_parameter_summary(model)
    assert summary["base_numel"] == summary["base_local_numel"] == 15
    assert summary["trainable_numel"] == summary["trainable_local_numel"] == 8
    assert summary["base_local_bytes"] == 15 * 4


@pytest.mark.parametrize(
    "distributed, message",
    [
        ({"strategy": "fsdp", "num_processes": 2, "fsdp_sharding": "hybrid_shard"}, "hybrid_shard needs"),
        ({"strategy": "ddp", "num_processes": 2, "gpu_ids": [0]}, "gpu_ids lists 1 GPUs"),
    ],
)
def test_refusals_not_covered_in_test_config(distributed, message):
    from finetune_app.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        build_config({"distributed": distributed})


# --------------------------------------------------------------------------------------------
# Two real processes


def _write_data(path: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"what is {i}?"}, {"role": "assistant", "content": f"it is {i}."}]}
        for i in range(32)
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


def _preset(tmp_path: Path, model_dir: Path, **distributed) -> Path:
    data = {
        "model": {"name_or_path": str(model_dir), "dtype": "float32"},
        # 4-bit base; under FSDP quant_storage 'auto' = float32 so the packed weights can be sharded.
        "data": {"path": str(_write_data(tmp_path / "chat.jsonl"))},
        "training": {
            "max_steps": 2,
            "micro_batch_size": 2,
            "max_length": 48,
            "save_steps": 2,
            "learning_rate": 1e-3,
            "lr_scheduler": "constant",
            "warmup_ratio": 0.0,
            "logging_steps": 1,
        },
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
        "distributed": distributed,
    }
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _train(preset: Path, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS / "cpu_fsdp"), os.environ.get("PYTHONPATH", "")]),
        "FINETUNE_APP_TEST_CPU_FSDP": "1",
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "finetune_app", "train", str(preset), *overrides, "--run-dir", str(run_dir)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def _losses(run_dir: Path) -> list[float]:
    return [event["loss"] for event in read_events(run_dir) if event["event"] == "log"]


@pytest.fixture(scope="module")
def single_process_reference(tiny_model_dir, tmp_path_factory):
    """One process, micro batch 4 = the same 4 sequences per step as 2 ranks x micro batch 2."""
    tmp_path = tmp_path_factory.mktemp("single")
    run_dir = tmp_path / "run"
    _train(_preset(tmp_path, tiny_model_dir), run_dir, "training.micro_batch_size=4")
    return _losses(run_dir)


def _assert_matches_reference(losses, reference):
    # Same seed, same 4 sequences per step, token-weighted loss over all ranks: the first loss (before any
    # update) is the same computation split in two, so only float summation order differs (~1e-6). The
    # second one also checks that the sharded/reduced gradients produced the same update; 1e-3 relative
    # allows for the different reduction order and the bf16 LoRA weights TRL uses for QLoRA.
    assert len(losses) == len(reference) == 2
    assert losses[0] == pytest.approx(reference[0], rel=1e-4)
    assert losses[1] == pytest.approx(reference[1], rel=1e-3)


def _assert_adapter_loads_on_one_process(model_dir: Path, adapter: Path):
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as handle:
        keys = list(handle.keys())
        # whole, unsharded LoRA matrices: lora_A is r x in_features
        shape = handle.get_tensor(next(k for k in keys if k.endswith("q_proj.lora_A.weight"))).shape
    assert keys and all("lora_" in key for key in keys)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert tuple(shape) == (4, base.config.hidden_size)
    ids = torch.tensor([[5, 6, 7, 8]])
    before = base(ids).logits
    tuned = PeftModel.from_pretrained(base, str(adapter))
    assert not torch.allclose(tuned(ids).logits, before)  # the trained B matrices are not zero any more


def test_fsdp_qlora_shards_the_4bit_base_matches_one_process_and_saves_a_whole_adapter(
    tiny_model_dir, tmp_path, single_process_reference
):
    run_dir = tmp_path / "run"
    preset = _preset(tmp_path, tiny_model_dir, strategy="fsdp", num_processes=2)
    _train(preset, run_dir)

    events = read_events(run_dir)
    kinds = [event["event"] for event in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and events[-1]["status"] == "completed"
    assert kinds.count("start") == 1  # only rank 0 writes events
    (shards,) = [event for event in events if event["event"] == "shards"]
    assert shards["strategy"] == "fsdp" and [r["rank"] for r in shards["ranks"]] == [0, 1]
    full = shards["ranks"][0]["base_numel"]
    local = [r["base_local_numel"] for r in shards["ranks"]]
    assert sum(local) == full  # the packed 4-bit base is split between the ranks, nothing duplicated
    assert all(0.4 * full <= n <= 0.6 * full for n in local)
    assert all(r["base_local_bytes"] == 4 * r["base_local_numel"] for r in shards["ranks"])  # float32 storage

    _assert_matches_reference(_losses(run_dir), single_process_reference)
    _assert_adapter_loads_on_one_process(tiny_model_dir, run_dir / "adapter")
    written = yaml.safe_load((run_dir / "launch" / "accelerate_config.yaml").read_text())
    assert written["distributed_type"] == "FSDP"
    assert not (run_dir / ".unused").exists()


def test_ddp_keeps_a_full_copy_per_rank_and_matches_one_process(tiny_model_dir, tmp_path, single_process_reference):
    run_dir = tmp_path / "run"
    preset = _preset(tmp_path, tiny_model_dir, strategy="ddp", num_processes=2)
    _train(preset, run_dir)

    events = read_events(run_dir)
    assert events[-1]["event"] == "end" and events[-1]["status"] == "completed"
    (shards,) = [event for event in events if event["event"] == "shards"]
    assert shards["strategy"] == "ddp"
    assert all(r["base_local_numel"] == r["base_numel"] for r in shards["ranks"])
    _assert_matches_reference(_losses(run_dir), single_process_reference)
    _assert_adapter_loads_on_one_process(tiny_model_dir, run_dir / "adapter")


def test_stop_reaches_every_rank_which_agree_on_the_step_and_save(tiny_model_dir, tmp_path):
    import signal
    import time

    run_dir = tmp_path / "run"
    preset = _preset(tmp_path, tiny_model_dir, strategy="ddp", num_processes=2)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "finetune_app",
        "train",
        str(preset),
        "training.max_steps=200",
        "training.save_steps=500",
        "--run-dir",
        str(run_dir),
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not any(e["event"] == "log" for e in read_events(run_dir)):
        time.sleep(0.5)
    process.send_signal(signal.SIGINT)  # what the GUI's Stop does
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-5000:]
    events = read_events(run_dir)
    assert events[-1]["event"] == "end" and events[-1]["status"] == "stopped"
    step = events[-1]["step"]
    assert 0 < step < 200
    assert (run_dir / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
