"""Time the demo preset on this machine, and compare CPU compute dtypes side by side in one run.

    python benchmarks/bench_demo.py            # full demo run (fp32) + 6-step fp32 vs bf16 comparison
    python benchmarks/bench_demo.py --quick    # only the 6-step comparison

Prints seconds per optimizer step for model.dtype=float32 and bfloat16 (4-bit NF4 + double quant either
way) and their ratio, then the wall time of the whole demo preset. Absolute times depend on the machine
and its load; the ratio is what the preset's choice of float32 rests on.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from finetune_app.config import load_config  # noqa: E402
from finetune_app.events import read_events  # noqa: E402
from finetune_app.runner import run_training  # noqa: E402

PRESET = ROOT / "presets" / "demo-smollm2-135m.yaml"


def seconds_per_step(dtype: str, steps: int) -> float:
    cfg = load_config(PRESET, [f"model.dtype={dtype}", f"training.max_steps={steps}", "training.logging_steps=1"])
    with tempfile.TemporaryDirectory() as tmp:
        run_training(cfg, Path(tmp) / "run", log=lambda *_: None)
        logs = [e for e in read_events(Path(tmp) / "run") if e["event"] == "log"]
    # Skip the first step (warm-up: allocations, kernel selection).
    return (logs[-1]["time"] - logs[0]["time"]) / (len(logs) - 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    fp32 = seconds_per_step("float32", 6)
    bf16 = seconds_per_step("bfloat16", 6)
    print(f"s/step float32 {fp32:.2f}   bfloat16 {bf16:.2f}   bf16/fp32 = {bf16 / fp32:.2f}")
    if args.quick:
        return
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        run_training(load_config(PRESET), Path(tmp) / "run", log=lambda *_: None)
        events = read_events(Path(tmp) / "run")
    steps = events[-1]["step"]
    print(f"demo preset: {steps} steps, {time.time() - started:.0f} s wall (model load included)")


if __name__ == "__main__":
    main()
