import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from finetune_app.config import RunConfig
from finetune_app.gui.jobs import EventTail, JobError, JobManager, new_run_dir, summarize_events

FAKE = Path(__file__).with_name("fake_train.py")


def fake_command(config_path: Path, run_dir: Path) -> list[str]:
    return [sys.executable, str(FAKE), str(config_path), "--run-dir", str(run_dir)]


def make_manager(tmp_path: Path, **kwargs) -> JobManager:
    return JobManager(state_dir=tmp_path / "state", command=fake_command, **kwargs)


def config(max_steps: int = 3) -> RunConfig:
    return RunConfig.model_validate({"training": {"max_steps": max_steps}})


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_run_is_followed_to_completion(tmp_path):
    manager = make_manager(tmp_path)
    job = manager.start(config(max_steps=3), tmp_path / "run")
    assert manager.active_file.is_file()
    assert json.loads(manager.active_file.read_text())["pid"] == job.pid
    wait_for(lambda: job.state() == "completed")
    progress = job.refresh()
    assert [step for step, _ in progress.losses] == [1, 2, 3]
    assert progress.eval_losses == [(3, 1.5)]
    assert progress.fraction == 1.0
    assert Path(progress.adapter_path, "adapter_config.json").is_file()
    assert "fake trainer starting" in job.log_tail()
    assert (tmp_path / "run" / "config.yaml").read_text().count("max_steps: 3") == 1
    assert manager.current() is job
    assert not manager.active_file.exists()  # a finished job no longer blocks new ones


def test_second_job_is_refused_while_one_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.5")
    manager = make_manager(tmp_path)
    first = manager.start(config(max_steps=100), tmp_path / "run1")
    with pytest.raises(JobError, match="already in progress"):
        manager.start(config(), tmp_path / "run2")
    assert not (tmp_path / "run2").exists()
    wait_for(lambda: first.refresh().losses)
    manager.stop()
    wait_for(lambda: first.state() == "stopped")
    second = manager.start(config(max_steps=1), tmp_path / "run2")
    wait_for(lambda: second.state() == "completed")


def test_stop_sends_sigint_and_the_run_saves_its_adapter(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.2")
    manager = make_manager(tmp_path)
    job = manager.start(config(max_steps=1000), tmp_path / "run")
    wait_for(lambda: job.refresh().losses)
    assert "stopping" in manager.stop()
    assert job.state() in ("stopping", "stopped")
    wait_for(lambda: job.state() == "stopped")
    assert job.exit_code == 0  # it ended by itself after SIGINT, no escalation needed
    assert job.progress.checkpoints
    assert Path(job.progress.adapter_path, "adapter_config.json").is_file()
    assert manager.stop() == "no training run is in progress"


def test_stop_escalates_when_the_run_ignores_sigint(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.2")
    monkeypatch.setenv("FAKE_IGNORE_SIGINT", "1")
    manager = make_manager(tmp_path, stop_timeout=0.5, term_timeout=5)
    job = manager.start(config(max_steps=1000), tmp_path / "run")
    wait_for(lambda: job.refresh().losses)
    manager.stop()
    wait_for(lambda: not job.alive())
    assert job.exit_code == -signal.SIGTERM
    assert job.state() == "stopped"
    assert job.progress.adapter_path is None  # nothing saved: the GUI must say so


def test_new_manager_reattaches_to_the_running_job(tmp_path, monkeypatch):
    # A second manager over the same state dir is what a restarted GUI sees.
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.2")
    first = make_manager(tmp_path)
    job = first.start(config(max_steps=1000), tmp_path / "run")
    wait_for(lambda: job.refresh().losses)
    restarted = make_manager(tmp_path)
    found = restarted.current()
    assert found is not None and found.process is None
    assert (found.pid, found.run_dir) == (job.pid, job.run_dir)
    assert found.state() == "running"
    assert found.refresh().losses  # it reads the events written before it attached
    with pytest.raises(JobError):
        restarted.start(config(), tmp_path / "other")
    restarted.stop()
    wait_for(lambda: found.state() == "stopped")  # the child is a zombie of `first` until reaped: still "dead"
    assert job.state() == "stopped"


def test_stale_active_file_is_ignored(tmp_path):
    manager = make_manager(tmp_path)
    manager.state_dir.mkdir(parents=True)
    # A pid that is certainly ours but whose command line does not name the run dir: pid reuse.
    manager.active_file.write_text(json.dumps({"pid": os.getpid(), "run_dir": str(tmp_path / "gone"), "started": 0}))
    assert manager.running() is None
    assert not manager.active_file.exists()
    job = manager.start(config(max_steps=1), tmp_path / "run")
    wait_for(lambda: job.state() == "completed")


def test_crash_without_end_event_is_failed(tmp_path):
    def crashing(config_path, run_dir):
        return [sys.executable, "-c", "import sys; print('boom: bad dataset', file=sys.stderr); sys.exit(3)"]

    manager = JobManager(state_dir=tmp_path / "state", command=crashing)
    job = manager.start(config(), tmp_path / "run")
    wait_for(lambda: not job.alive())
    assert job.state() == "failed"
    assert job.exit_code == 3
    assert "boom: bad dataset" in job.log_tail()


def test_refuses_a_non_empty_run_dir(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.jsonl").write_text("{}\n")
    with pytest.raises(JobError, match="not empty"):
        make_manager(tmp_path).start(config(), tmp_path / "run")
    assert (tmp_path / "run" / "events.jsonl").read_text() == "{}\n"


def test_event_tail_reads_only_complete_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.poll() == []  # no file yet
    with path.open("w") as handle:
        handle.write('{"event": "log", "step": 1, "loss": 2.5}\n{"event": "log", "st')
    assert [e["step"] for e in tail.poll()] == [1]
    with path.open("a") as handle:
        handle.write('ep": 2, "loss": 1.5}\nnot json\n')
    assert [e["step"] for e in tail.poll()] == [2]
    assert len(tail.events) == 2


def test_summarize_events():
    events = [
        {"event": "start", "total_steps": 4, "estimate": {"total": 10}},
        {"event": "log", "step": 1, "loss": 3.0, "memory": {"allocated_peak": 5, "reserved_peak": 7}},
        {"event": "log", "step": 2, "loss": 2.0, "tokens_per_second": 50.0, "memory": {"allocated_peak": 4}},
        {"event": "eval", "step": 2, "eval_loss": 2.2},
        {"event": "error", "message": "CUDA out of memory"},
    ]
    progress = summarize_events(events)
    assert progress.losses == [(1, 3.0), (2, 2.0)]
    assert progress.fraction == 0.5
    assert progress.peak_memory == {"allocated_peak": 5, "reserved_peak": 7}
    assert progress.tokens_per_second == 50.0
    assert progress.status == "error" and "out of memory" in progress.error


def test_new_run_dir_uses_run_name_or_a_timestamp():
    named = RunConfig.model_validate({"output": {"dir": "out", "run_name": "mine"}})
    assert new_run_dir(named) == Path("out/mine")
    assert new_run_dir(RunConfig()).name.startswith("gui-demo-smollm2-135m-instruct-")
