"""A stand-in for `python -m finetune_app train CONFIG --run-dir RUN` that writes the runner's events.

Used by the job-control tests: it logs one step every FAKE_STEP_SECONDS (default 0.05), saves a fake adapter
at the end, and on SIGINT writes a checkpoint + adapter and an "end" event with status "stopped", like the
real runner. FAKE_IGNORE_SIGINT=1 makes it ignore SIGINT so the SIGTERM/SIGKILL escalation can be tested.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml


def main() -> int:
    config_path, run_dir = Path(sys.argv[1]), Path(sys.argv[sys.argv.index("--run-dir") + 1])
    cfg = yaml.safe_load(config_path.read_text())
    total = cfg["training"]["max_steps"] if cfg["training"]["max_steps"] > 0 else 5
    step_seconds = float(os.environ.get("FAKE_STEP_SECONDS", "0.05"))
    events = (run_dir / "events.jsonl").open("a", encoding="utf-8")

    def emit(**event):
        events.write(json.dumps({"time": time.time(), **event}) + "\n")
        events.flush()

    def save_adapter() -> str:
        adapter = run_dir / "adapter"
        adapter.mkdir(exist_ok=True)
        (adapter / "adapter_config.json").write_text("{}")
        return str(adapter)

    stopping = {"flag": False}

    def on_sigint(signum, frame):
        stopping["flag"] = True

    if os.environ.get("FAKE_IGNORE_SIGINT") == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, on_sigint)
    print("fake trainer starting", flush=True)
    emit(event="start", run_dir=str(run_dir), config=cfg, total_steps=total, estimate={"total": 123}, device="cpu")
    for step in range(1, total + 1):
        time.sleep(step_seconds)
        emit(
            event="log",
            step=step,
            total_steps=total,
            epoch=step / total,
            loss=2.0 / step,
            learning_rate=1e-4,
            tokens_per_second=100.0,
            eta_seconds=(total - step) * step_seconds,
        )
        print(f"step {step}/{total}", flush=True)
        if stopping["flag"]:
            emit(event="checkpoint", step=step, path=str(run_dir / "checkpoints" / f"checkpoint-{step}"))
            emit(event="end", status="stopped", adapter_path=save_adapter(), train_loss=2.0 / step, runtime_seconds=1.0)
            return 0
    emit(event="eval", step=total, eval_loss=1.5)
    emit(event="end", status="completed", adapter_path=save_adapter(), train_loss=1.0, runtime_seconds=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
