"""launch.py: the generated accelerate config, the exact command, multi-node scripts, exit codes and Stop."""

import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from finetune_app.config import build_config
from finetune_app.events import read_events
from finetune_app.launch import (
    LaunchError,
    accelerate_config,
    launch_distributed,
    rendezvous,
    run_child,
    write_launch_folder,
)


def _cfg(model_dir, **distributed):
    return build_config(
        {
            "model": {"name_or_path": str(model_dir), "dtype": "bfloat16"},
            "distributed": {"strategy": "fsdp", "num_processes": 2, **distributed},
        }
    )


def _accelerate_reads(path):
    """accelerate's own loader for config files: what `accelerate launch --config_file` will see."""
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(str(path))


def test_single_node_fsdp_config_and_command(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, fsdp_sharding="shard_grad_op", cpu_offload=True, gpu_ids=[2, 3])
    run_dir = tmp_path / "run"
    folder = write_launch_folder(cfg, run_dir, resume=True)

    written = yaml.safe_load((folder / "accelerate_config.yaml").read_text())
    assert written["distributed_type"] == "FSDP" and written["num_processes"] == 2 and written["num_machines"] == 1
    assert written["mixed_precision"] == "bf16" and written["gpu_ids"] == "2,3"
    fsdp = written["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_offload_params"] is True
    assert fsdp["fsdp_reshard_after_forward"] is False  # shard_grad_op keeps parameters gathered
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"  # from the model's config.json
    assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    parsed = _accelerate_reads(folder / "accelerate_config.yaml")
    assert parsed.distributed_type == "FSDP" and parsed.num_processes == 2
    assert parsed.fsdp_config["fsdp_offload_params"] is True

    command = (folder / "command.txt").read_text().strip()
    words = shlex.split(command)
    assert words[0] == "FINETUNE_APP_LAUNCHED=1" and words[1] == sys.executable
    assert words[2:5] == ["-m", "accelerate.commands.launch", "--config_file"]
    assert words[5] == str(folder / "accelerate_config.yaml")
    tail = ["-m", "finetune_app", "train", str(run_dir / "config.yaml"), "--run-dir", str(run_dir), "--resume"]
    assert words[6:] == tail
    assert not list(folder.glob("node-*.sh"))


def test_ddp_config_uses_multi_gpu_and_float32_means_no_mixed_precision(tiny_model_dir):
    cfg = build_config(
        {
            "model": {"name_or_path": str(tiny_model_dir), "dtype": "float32"},
            "distributed": {"strategy": "ddp", "num_processes": 4},
        }
    )
    written = accelerate_config(cfg)
    assert written["distributed_type"] == "MULTI_GPU" and written["num_processes"] == 4
    assert written["mixed_precision"] == "no" and written["gpu_ids"] == "all"
    assert "fsdp_config" not in written


def test_multi_node_writes_per_node_scripts_and_slurm_and_runs_nothing(tiny_model_dir, tmp_path, capsys):
    cfg = _cfg(tiny_model_dir, num_nodes=3, rdzv_endpoint="10.1.2.3:29555", fsdp_sharding="hybrid_shard")
    run_dir = tmp_path / "run"
    assert launch_distributed(cfg, run_dir) == 0
    folder = run_dir / "launch"
    written = yaml.safe_load((folder / "accelerate_config.yaml").read_text())
    # accelerate counts processes over all machines
    assert written["num_processes"] == 6 and written["num_machines"] == 3
    assert (written["main_process_ip"], written["main_process_port"]) == ("10.1.2.3", 29555)
    assert written["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 3,
        "parallelism_config_dp_shard_size": 2,
    }
    for rank in range(3):
        script = folder / f"node-{rank}.sh"
        assert os.access(script, os.X_OK)
        words = shlex.split(script.read_text().splitlines()[-1])
        assert words[0] == "exec" and "accelerate.commands.launch" in words
        assert words[words.index("--machine_rank") + 1] == str(rank)
        assert "export FINETUNE_APP_LAUNCHED=1" in script.read_text()
        assert "10.1.2.3:29555" in script.read_text()
    assert not (folder / "node-3.sh").exists()
    slurm = (folder / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=3" in slurm and "#SBATCH --gpus-per-node=2" in slurm
    assert "srun" in slurm and '--machine_rank "$SLURM_NODEID"' in slurm and "--main_process_port 29555" in slurm
    subprocess.run(["bash", "-n", str(folder / "slurm.sbatch")], check=True)  # valid shell
    out = capsys.readouterr().out
    assert "nothing was started" in out and "node-N.sh" in out and "sbatch" in out
    assert not (run_dir / "events.jsonl").exists()  # no training happened
    assert (run_dir / "config.yaml").is_file()


@pytest.mark.parametrize("endpoint", ["10.0.0.1", "10.0.0.1:port", ":29500", "a b:1", "host:70000"])
def test_bad_rendezvous_endpoint_is_refused_with_the_field_name(tiny_model_dir, endpoint):
    cfg = _cfg(tiny_model_dir, num_nodes=2, rdzv_endpoint=endpoint)
    with pytest.raises(LaunchError, match="distributed.rdzv_endpoint"):
        rendezvous(cfg)


def test_launch_refuses_an_existing_run_before_starting_anything(tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text('{"event": "start"}\n')
    assert launch_distributed(_cfg(tiny_model_dir), run_dir) == 1
    assert "already holds a run" in capsys.readouterr().err
    assert not (run_dir / "launch").exists()
    assert (run_dir / "events.jsonl").read_text() == '{"event": "start"}\n'


def test_a_failed_launch_is_recorded_in_the_event_log(tmp_path):
    code = run_child([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ), tmp_path)
    assert code == 3
    events = read_events(tmp_path)
    assert events[-1]["event"] == "error" and "code 3" in events[-1]["message"]


def test_sigterm_is_forwarded_to_the_launched_processes(tmp_path):
    ready, stopped = tmp_path / "ready", tmp_path / "stopped"
    child = (
        "import pathlib, signal, sys, time\n"
        f"def stop(signum, frame):\n    pathlib.Path({str(stopped)!r}).write_text(str(signum)); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(60)\n"
    )

    def send_when_ready():
        deadline = time.time() + 30
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send_when_ready, daemon=True).start()
    code = run_child([sys.executable, "-c", child], dict(os.environ), tmp_path)
    assert code == 0  # the child stopped cleanly: the parent did not die of the signal itself
    assert stopped.read_text() == str(int(signal.SIGTERM))
