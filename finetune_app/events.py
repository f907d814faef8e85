"""The run's append-only JSONL event log: written by the runner, read by the GUI, export and tests."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


class EventLog:
    """Appends one JSON object per line; each write is flushed so followers see it at once."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / EVENTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        line = json.dumps(record, default=_jsonable) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        return record


def read_events(run_dir: Path | str) -> list[dict[str, Any]]:
    """All complete events of a run (a half-written last line is skipped)."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def measured_peak(events: list[dict[str, Any]]) -> dict[str, int]:
    """Largest measured memory figures over the run's log events (bytes)."""
    peak: dict[str, int] = {}
    for event in events:
        for key, value in (event.get("memory") or {}).items():
            if isinstance(value, (int, float)):
                peak[key] = max(peak.get(key, 0), int(value))
    return peak


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return str(value)
