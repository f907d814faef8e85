"""Start a DDP/FSDP run through `accelerate launch`, or write the commands for a multi-node run.

`python -m finetune_app train PRESET` with distributed.num_processes > 1 ends up here. The run directory
is prepared once (config.yaml written, an existing run refused), an accelerate config file and the exact
command are written to RUN/launch/, and `accelerate launch` starts one `finetune_app train` per GPU.
Each of those sees LOCAL_RANK (so cli.py runs the training instead of launching again) and
FINETUNE_APP_LAUNCHED=1 (so the runner accepts the prepared run directory); only rank 0 writes events
and files. With num_nodes > 1 nothing is started: one script per node and a SLURM batch file are
written, to be run on the machines themselves.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from .atomic import atomic_write_text
from .config import RunConfig
from .distributed import LAUNCHED_ENV, fsdp_options

LAUNCH_DIR = "launch"
ACCELERATE_CONFIG_FILE = "accelerate_config.yaml"
COMMAND_FILE = "command.txt"
SLURM_FILE = "slurm.sbatch"
DEFAULT_PORT = 29500
_HOST = re.compile(r"^\[?[A-Za-z0-9.:_-]+\]?$")  # a hostname, IPv4 or [IPv6] address
MIXED_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}


class LaunchError(ValueError):
    """A distributed setting that cannot be launched; the message says which field to fix."""


def rendezvous(cfg: RunConfig) -> tuple[str, int]:
    """(host, port) of node 0: distributed.rdzv_endpoint, or this machine for a single node."""
    endpoint = cfg.distributed.rdzv_endpoint
    if not endpoint:
        return "127.0.0.1", DEFAULT_PORT
    host, sep, port = endpoint.rpartition(":")
    if not sep or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"distributed.rdzv_endpoint={endpoint!r} must be host:port of node 0, e.g. 10.0.0.1:29500")
    return host.strip("[]"), int(port)


def accelerate_config(cfg: RunConfig, *, machine_rank: int = 0, port: int | None = None) -> dict[str, Any]:
    """The accelerate config file for this run (what `accelerate config` would have asked for)."""
    dist = cfg.distributed
    host, configured_port = rendezvous(cfg)
    port = port or configured_port
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "FSDP" if dist.strategy == "fsdp" else "MULTI_GPU",
        "downcast_bf16": "no",
        "mixed_precision": MIXED_PRECISION[cfg.model.dtype],
        "num_machines": dist.num_nodes,
        # accelerate counts processes over all machines
        "num_processes": cfg.world_size,
        "machine_rank": machine_rank,
        "main_process_ip": host,
        "main_process_port": port,
        "rdzv_backend": "static",
        "same_network": True,
        "gpu_ids": ",".join(str(i) for i in dist.gpu_ids) if dist.gpu_ids else "all",
        "use_cpu": False,
    }
    if dist.strategy == "fsdp":
        config["fsdp_config"] = _accelerate_fsdp_keys(fsdp_options(cfg, wrapped_layer_classes(cfg)))
        if dist.fsdp_sharding == "hybrid_shard":
            config["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": dist.num_nodes,
                "parallelism_config_dp_shard_size": dist.num_processes,
            }
    return config


def _accelerate_fsdp_keys(options: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments.fsdp_config keys -> the fsdp_* keys of accelerate's config file."""
    renamed = {"cpu_offload": "fsdp_offload_params", "version": "fsdp_version"}
    out = {}
    for key, value in options.items():
        if key == "transformer_layer_cls_to_wrap":
            value = ",".join(value)
        out[renamed.get(key, f"fsdp_{key}")] = value
    return out


def wrapped_layer_classes(cfg: RunConfig) -> list[str] | None:
    """The decoder-layer classes FSDP wraps (the model's `_no_split_modules`), read from config.json only.

    None when the model's config cannot be read here (e.g. a Hub id offline): accelerate then reads the
    same `_no_split_modules` from the loaded model on each rank.
    """
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        from .model_source import resolve_model

        resolved = resolve_model(cfg.model, log=lambda *_: None)
        config = AutoConfig.from_pretrained(
            resolved.path, revision=resolved.revision, trust_remote_code=cfg.model.trust_remote_code
        )
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
        return list(model_class._no_split_modules or []) or None
    except Exception:  # informative only: the ranks still wrap by the model's own list
        return None


def train_command(
    cfg: RunConfig,
    run_dir: Path,
    *,
    resume: bool,
    config_file: Path,
    machine_rank: int | None = None,
    python: str | None = None,
) -> list[str]:
    """`python -m accelerate.commands.launch ... -m finetune_app train RUN/config.yaml --run-dir RUN`."""
    command = [python or sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
    if machine_rank is not None:
        command += ["--machine_rank", str(machine_rank)]
    command += ["-m", "finetune_app", "train", str(run_dir / "config.yaml"), "--run-dir", str(run_dir)]
    if resume:
        command.append("--resume")
    return command


def write_launch_folder(cfg: RunConfig, run_dir: Path, *, resume: bool) -> Path:
    """Write RUN/launch/ (accelerate config, exact command; per-node scripts when num_nodes > 1)."""
    run_dir = Path(run_dir).resolve()
    folder = run_dir / LAUNCH_DIR
    config_file = folder / ACCELERATE_CONFIG_FILE
    # One machine, no endpoint given: a free local port, so two runs on one machine do not collide.
    port = _free_port() if cfg.distributed.num_nodes == 1 and not cfg.distributed.rdzv_endpoint else None
    atomic_write_text(config_file, yaml.safe_dump(accelerate_config(cfg, port=port), sort_keys=False))
    command = train_command(cfg, run_dir, resume=resume, config_file=config_file)
    atomic_write_text(folder / COMMAND_FILE, f"{LAUNCHED_ENV}=1 {shlex.join(command)}\n")
    if cfg.distributed.num_nodes > 1:
        _write_multi_node_scripts(cfg, run_dir, folder, resume=resume)
    return folder


def _write_multi_node_scripts(cfg: RunConfig, run_dir: Path, folder: Path, *, resume: bool) -> None:
    for rank in range(cfg.distributed.num_nodes):
        script = folder / f"node-{rank}.sh"
        atomic_write_text(script, _node_script(cfg, run_dir, rank, resume=resume))
        script.chmod(0o755)
    atomic_write_text(folder / SLURM_FILE, _slurm_script(cfg, run_dir, resume=resume))


def _node_script(cfg: RunConfig, run_dir: Path, rank: int, *, resume: bool) -> str:
    host, port = rendezvous(cfg)
    command = train_command(
        cfg,
        run_dir,
        resume=resume,
        config_file=run_dir / LAUNCH_DIR / ACCELERATE_CONFIG_FILE,
        machine_rank=rank,
        python="python",
    )
    return (
        "#!/usr/bin/env bash\n"
        f"# Node {rank} of {cfg.distributed.num_nodes} ({cfg.distributed.num_processes} GPUs): run this on that "
        "machine, in the same\n"
        f"# Python environment. Node 0 must be reachable at {host}:{port}, and the run directory and the\n"
        "# model must be at the same paths on every node (a shared filesystem).\n"
        "set -euo pipefail\n"
        f"export {LAUNCHED_ENV}=1\n"
        f"exec {shlex.join(command)}\n"
    )


def _slurm_script(cfg: RunConfig, run_dir: Path, *, resume: bool) -> str:
    """One srun task per node; each passes its SLURM_NODEID as accelerate's machine rank."""
    dist = cfg.distributed
    _, port = rendezvous(cfg)
    resume_flag = " --resume" if resume else ""
    return (
        "#!/usr/bin/env bash\n"
        f"#SBATCH --job-name=finetune-{run_dir.name}\n"
        f"#SBATCH --nodes={dist.num_nodes}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --gpus-per-node={dist.num_processes}\n"
        f"#SBATCH --output={run_dir / LAUNCH_DIR}/slurm-%j.out\n"
        "set -euo pipefail\n"
        f"export {LAUNCHED_ENV}=1\n"
        f"export RUN_DIR={shlex.quote(str(run_dir))}\n"
        "# The first node of the allocation is the rendezvous host (instead of distributed.rdzv_endpoint).\n"
        'export MAIN_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        "srun --ntasks-per-node=1 bash -c 'exec python -m accelerate.commands.launch "
        f'--config_file "$RUN_DIR/{LAUNCH_DIR}/{ACCELERATE_CONFIG_FILE}" --machine_rank "$SLURM_NODEID" '
        f'--main_process_ip "$MAIN_HOST" --main_process_port {port} '
        f'-m finetune_app train "$RUN_DIR/config.yaml" --run-dir "$RUN_DIR"{resume_flag}\'\n'
    )


def launch_distributed(cfg: RunConfig, run_dir: Path, *, resume: bool = False, log=print) -> int:
    """Prepare the run dir, write RUN/launch/, and run accelerate launch (one node) -> exit code."""
    from .runner import RunError, prepare_run_dir

    run_dir = Path(run_dir).resolve()
    try:
        rendezvous(cfg)
        prepare_run_dir(run_dir, cfg, resume=resume)
        _fetch_model_once(cfg, log)
    except (LaunchError, RunError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, LaunchError) else 1
    folder = write_launch_folder(cfg, run_dir, resume=resume)
    if cfg.distributed.num_nodes > 1:
        log(_multi_node_instructions(cfg, folder))
        return 0
    command = train_command(cfg, run_dir, resume=resume, config_file=folder / ACCELERATE_CONFIG_FILE)
    log(f"Starting {cfg.world_size} processes ({cfg.distributed.strategy}): {shlex.join(command)}")
    return run_child(command, {**os.environ, LAUNCHED_ENV: "1"}, run_dir)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fetch_model_once(cfg: RunConfig, log) -> None:
    """Resolve (convert/download) the model here, so the ranks do not all do it at the same time."""
    from .model_source import resolve_model

    resolve_model(cfg.model, log=log)


def run_child(command: list[str], env: dict[str, str], run_dir: Path) -> int:
    """Run the launcher; SIGINT/SIGTERM are passed on so every rank saves a checkpoint and stops."""
    # Our own session, so a Ctrl-C to the terminal's process group reaches the ranks once, through us
    # and the agent, not twice; and a long agent shutdown timeout, so torchrun does not SIGKILL ranks
    # that are still writing their checkpoint and adapter (its default is 30 s).
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "900", **env}
    child = subprocess.Popen(command, env=env, start_new_session=True)
    forwarded: list[int] = []

    def forward(signum, frame):
        if child.poll() is None:
            forwarded.append(signum)
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code != 0 and forwarded and _ended_cleanly(run_dir):
        # torchrun's agent exits non-zero whenever it is signalled, even after the ranks stopped properly.
        return 0
    if code != 0:
        _record_failure(run_dir, code)
    return code


def _ended_cleanly(run_dir: Path) -> bool:
    from .events import read_events

    events = read_events(run_dir)
    return bool(events) and events[-1]["event"] == "end"


def _record_failure(run_dir: Path, code: int) -> None:
    """A rank other than 0 can die without writing anything: make the failure visible in the event log."""
    from .events import EventLog, read_events

    events = read_events(run_dir)
    if events and events[-1]["event"] in ("end", "error"):
        return
    EventLog(run_dir).emit(
        "error", message=f"distributed launch exited with code {code}; see the terminal output of the ranks"
    )


def _multi_node_instructions(cfg: RunConfig, folder: Path) -> str:
    nodes = cfg.distributed.num_nodes
    host, port = rendezvous(cfg)
    return (
        f"Multi-node run ({nodes} nodes x {cfg.distributed.num_processes} GPUs, rendezvous {host}:{port}): "
        f"nothing was started.\n"
        f"  On each node N, from this project folder:  bash {folder}/node-N.sh   (N = 0 .. {nodes - 1})\n"
        f"  Or on a SLURM cluster:                    sbatch {folder / SLURM_FILE}\n"
        f"  Accelerate config: {folder / ACCELERATE_CONFIG_FILE}"
    )
