"""Training jobs launched from the GUI: start, follow, stop and re-attach. No gradio here.

Training never runs in the GUI process: `JobManager.start` writes the resolved config into a fresh run directory
and launches the headless command (`python -m finetune_app train CONFIG --run-dir RUN`) in its own session,
with stdout/stderr going to RUN/train.log. The page follows RUN/events.jsonl. The active job is also recorded in
$FINETUNE_APP_HOME/runs/.active_job.json, so a reloaded page, a second tab or a restarted GUI finds it again,
and a second job is refused while one runs. Stop sends SIGINT (the runner saves a checkpoint and the adapter,
then writes an "end" event with status "stopped") and escalates to SIGTERM, then SIGKILL, if the run hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_app.atomic import atomic_write_text
from finetune_app.config import RunConfig, dump_yaml
from finetune_app.events import EVENTS_FILE

ACTIVE_FILE = ".active_job.json"
LOG_FILE = "train.log"


class JobError(RuntimeError):
    """A job cannot be started or controlled; the message says why and what to do."""


def app_home() -> Path:
    """Where the GUI keeps its own state (active job record, uploads)."""
    return Path(os.environ.get("FINETUNE_APP_HOME", "~/.finetune_app")).expanduser()


def default_state_dir() -> Path:
    return app_home() / "runs"


def train_command(config_path: Path, run_dir: Path) -> list[str]:
    """The headless command the GUI runs; the same a user would type."""
    return [sys.executable, "-m", "finetune_app", "train", str(config_path), "--run-dir", str(run_dir)]


# ---------------------------------------------------------------------------------------------
# Reading a run's events (incrementally: a long run's file is never re-read from the start)


class EventTail:
    """Follows an append-only JSON-lines file; only complete lines are parsed."""

    def __init__(self, path: Path):
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        """Read what was appended since the last call; returns the new events."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # the last piece has no newline yet (or is empty)
        new = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from a crashed writer; the rest of the file is still useful
            if isinstance(event, dict):
                new.append(event)
        self.events.extend(new)
        return new


@dataclass
class RunProgress:
    """What the Train tab shows, distilled from the events (pure data)."""

    step: int = 0
    total_steps: int | None = None
    epoch: float | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    learning_rate: float | None = None
    tokens_per_second: float | None = None
    eta_seconds: float | None = None
    peak_memory: dict[str, int] = field(default_factory=dict)  # allocated_peak / reserved_peak / nvml_used
    estimate: dict[str, Any] = field(default_factory=dict)
    device: Any = None
    status: str | None = None  # completed | stopped | error, from the end/error events
    adapter_path: str | None = None
    train_loss: float | None = None
    runtime_seconds: float | None = None
    error: str | None = None
    messages: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        if not self.total_steps:
            return 0.0
        return min(1.0, self.step / self.total_steps)


def summarize_events(events: list[dict[str, Any]]) -> RunProgress:
    progress = RunProgress()
    for event in events:
        apply_event(progress, event)
    return progress


def apply_event(progress: RunProgress, event: dict[str, Any]) -> None:
    kind = event.get("event")
    if kind == "start":
        progress.total_steps = event.get("total_steps") or progress.total_steps
        progress.estimate = event.get("estimate") or {}
        progress.device = event.get("device")
    elif kind == "train_begin":
        progress.total_steps = event.get("total_steps") or progress.total_steps
    elif kind == "log":
        progress.step = event.get("step", progress.step) or progress.step
        progress.total_steps = event.get("total_steps") or progress.total_steps
        progress.epoch = event.get("epoch", progress.epoch)
        if event.get("loss") is not None:
            progress.losses.append((int(event.get("step") or 0), float(event["loss"])))
        for name in ("learning_rate", "tokens_per_second", "eta_seconds"):
            if event.get(name) is not None:
                setattr(progress, name, event[name])
        for name, value in (event.get("memory") or {}).items():
            if isinstance(value, int | float):
                progress.peak_memory[name] = max(int(value), progress.peak_memory.get(name, 0))
    elif kind == "eval" and event.get("eval_loss") is not None:
        progress.eval_losses.append((int(event.get("step") or 0), float(event["eval_loss"])))
    elif kind == "checkpoint" and event.get("path"):
        progress.checkpoints.append(str(event["path"]))
    elif kind == "info" and event.get("message"):
        progress.messages.append(str(event["message"]))
    elif kind == "error":
        progress.status = "error"
        progress.error = str(event.get("message") or "unknown error")
    elif kind == "end":
        progress.status = event.get("status") or "completed"
        progress.adapter_path = event.get("adapter_path")
        progress.train_loss = event.get("train_loss")
        progress.runtime_seconds = event.get("runtime_seconds")
        if progress.status == "completed" and progress.total_steps:
            progress.step = max(progress.step, progress.total_steps)


# ---------------------------------------------------------------------------------------------
# Processes


def pid_alive(pid: int, run_dir: Path | None = None) -> bool:
    """True if the process exists, is not a zombie and (on Linux) is really our training command for run_dir."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process took over the pid
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no /proc (macOS): signal 0 is all we know
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return False
        if run_dir is not None:
            # Guards against pid reuse after a reboot or a long time: the command line names the run dir.
            return str(run_dir) in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return False
    return True


def _signal_group(pid: int, sig: int) -> None:
    # The child leads its own session, so its process group also holds launcher children (accelerate/torchrun).
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class Job:
    run_dir: Path
    pid: int
    started: float
    command: list[str]
    process: subprocess.Popen | None = None  # None when re-attached after a GUI restart
    stop_requested: float | None = None
    exit_code: int | None = None
    tail: EventTail = field(init=False)
    progress: RunProgress = field(init=False)
    _read_lock: threading.Lock = field(init=False, repr=False, compare=False)  # two tabs poll at once

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.tail = EventTail(self.run_dir / EVENTS_FILE)
        self.progress = RunProgress()
        self._read_lock = threading.Lock()

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_FILE

    def alive(self) -> bool:
        if self.process is not None:
            code = self.process.poll()
            if code is not None:
                self.exit_code = code
                return False
            return True
        return pid_alive(self.pid, self.run_dir)

    def refresh(self) -> RunProgress:
        with self._read_lock:
            for event in self.tail.poll():
                apply_event(self.progress, event)
        return self.progress

    def state(self) -> str:
        """running | stopping | completed | stopped | failed.

        A stopped run that wrote no "end" event (killed after the timeout, or stopped while still starting up)
        is "stopped" too, with no adapter_path in its progress.
        """
        self.refresh()
        if self.alive():
            return "stopping" if self.stop_requested else "running"
        self.refresh()  # the last events may have landed between the two reads
        status = self.progress.status
        if status in ("completed", "stopped"):
            return status
        if status is None and self.stop_requested:
            return "stopped"
        return "failed"

    def log_tail(self, max_lines: int = 40, max_bytes: int = 16_000) -> str:
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - max_bytes))
                text = handle.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        lines = text.replace("\r", "\n").splitlines()
        return "\n".join(lines[-max_lines:])

    def record(self) -> dict[str, Any]:
        return {"pid": self.pid, "run_dir": str(self.run_dir), "started": self.started, "command": self.command}


class JobManager:
    """The one place that knows whether a training job is running. Thread-safe: gradio calls it from workers."""

    def __init__(
        self,
        state_dir: Path | None = None,
        command: Callable[[Path, Path], list[str]] = train_command,
        stop_timeout: float = 180.0,
        term_timeout: float = 30.0,
    ):
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.command = command
        self.stop_timeout = stop_timeout  # a checkpoint of a big model can take minutes to write
        self.term_timeout = term_timeout
        self._lock = threading.RLock()
        self._job: Job | None = None

    @property
    def active_file(self) -> Path:
        return self.state_dir / ACTIVE_FILE

    # -- state ---------------------------------------------------------------------------------

    def current(self) -> Job | None:
        """The running job, or the last one this GUI started, or one found in the active-job file."""
        with self._lock:
            if self._job is None:
                self._job = self._reattach()
            if self._job is not None and not self._job.alive():
                self._clear_active(self._job)
            return self._job

    def running(self) -> Job | None:
        job = self.current()
        return job if job is not None and job.alive() else None

    def _reattach(self) -> Job | None:
        try:
            record = json.loads(self.active_file.read_text(encoding="utf-8"))
            job = Job(
                run_dir=Path(record["run_dir"]),
                pid=int(record["pid"]),
                started=float(record.get("started", 0)),
                command=list(record.get("command", [])),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not job.alive():
            self._clear_active(job)
        return job

    def _write_active(self, job: Job) -> None:
        atomic_write_text(self.active_file, json.dumps(job.record(), indent=1))

    def _clear_active(self, job: Job) -> None:
        try:
            record = json.loads(self.active_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if record.get("pid") == job.pid:
            self.active_file.unlink(missing_ok=True)

    # -- control -------------------------------------------------------------------------------

    def start(self, cfg: RunConfig, run_dir: Path) -> Job:
        """Write cfg to run_dir/config.yaml and launch the training command. Refuses if a job runs."""
        with self._lock:
            busy = self.running()
            if busy is not None:
                raise JobError(
                    f"a training run is already in progress ({busy.run_dir}, pid {busy.pid}); "
                    "stop it or wait for it to finish before starting another"
                )
            run_dir = Path(run_dir).resolve()
            if run_dir.exists() and any(run_dir.iterdir()):
                raise JobError(f"run directory {run_dir} already exists and is not empty: choose another run name")
            run_dir.mkdir(parents=True, exist_ok=True)
            config_path = run_dir / "config.yaml"
            atomic_write_text(config_path, dump_yaml(cfg))
            command = self.command(config_path, run_dir)
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            with (run_dir / LOG_FILE).open("ab") as log:
                process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=env,
                )
            job = Job(run_dir=run_dir, pid=process.pid, started=time.time(), command=command, process=process)
            self._job = job
            self._write_active(job)
            return job

    def stop(self) -> str:
        """Ask the running job to stop with a checkpoint; escalates in the background. Returns a message."""
        with self._lock:
            job = self.running()
            if job is None:
                return "no training run is in progress"
            if job.stop_requested is not None:
                return "already stopping: saving a checkpoint and the adapter"
            job.stop_requested = time.time()
            _signal_group(job.pid, signal.SIGINT)
        threading.Thread(target=self._escalate, args=(job,), daemon=True, name="stop-escalation").start()
        return "stopping: the run saves a checkpoint and the adapter, then ends"

    def _escalate(self, job: Job) -> None:
        for sig, timeout in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, self.term_timeout)):
            if _wait_for_exit(job, timeout):
                return
            _signal_group(job.pid, sig)
        _wait_for_exit(job, self.term_timeout)
        with self._lock:
            self._clear_active(job)


def _wait_for_exit(job: Job, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not job.alive():
            return True
        time.sleep(0.2)
    return not job.alive()


def new_run_dir(cfg: RunConfig, now: float | None = None) -> Path:
    """RUN = output.dir / (output.run_name or gui-<model>-<timestamp>)."""
    if cfg.output.run_name:
        name = cfg.output.run_name
    else:
        model = Path(cfg.model.name_or_path.replace(":", "-")).name or "model"
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        name = f"gui-{model}-{stamp}"
    return Path(cfg.output.dir).expanduser() / name


_manager: JobManager | None = None
_manager_lock = threading.Lock()


def get_manager() -> JobManager:
    """The GUI server's single JobManager (shared by every page, tab and reload)."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = JobManager()
        return _manager
