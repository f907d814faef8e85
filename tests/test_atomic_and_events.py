import pytest

from finetune_app.atomic import atomic_dir, atomic_write_text
from finetune_app.events import EventLog, measured_peak, read_events


def test_atomic_dir_replaces_only_when_complete(tmp_path):
    final = tmp_path / "adapter"
    final.mkdir()
    (final / "weights").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "weights").write_text("half")
            raise RuntimeError("crash mid-write")
    assert (final / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]  # no temporary left behind
    with atomic_dir(final) as tmp:
        (tmp / "weights").write_text("new")
    assert (final / "weights").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_atomic_write_text(tmp_path):
    path = tmp_path / "sub" / "config.yaml"
    atomic_write_text(path, "a: 1\n")
    assert path.read_text() == "a: 1\n"


def test_event_log_appends_and_reader_skips_a_torn_line(tmp_path):
    log = EventLog(tmp_path)
    log.emit("start", run_dir=tmp_path)
    log.emit("log", step=1, loss=2.0, memory={"reserved_peak": 10, "allocated_peak": 8})
    log.emit("log", step=2, loss=1.5, memory={"reserved_peak": 12, "allocated_peak": 7})
    with open(tmp_path / "events.jsonl", "a") as handle:
        handle.write('{"event": "log", "st')  # a writer killed mid-line
    events = read_events(tmp_path)
    assert [e["event"] for e in events] == ["start", "log", "log"]
    assert events[0]["run_dir"] == str(tmp_path)
    assert all("time" in e for e in events)
    assert measured_peak(events) == {"reserved_peak": 12, "allocated_peak": 8}
    assert read_events(tmp_path / "missing") == []
