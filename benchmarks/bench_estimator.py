"""Time one memory estimate once the model shape is cached (target: well under 5 ms). Not a test.

python benchmarks/bench_estimator.py
"""

from __future__ import annotations

import time

from finetune_app.config import DEMO_MODEL, build_config
from finetune_app.memory.advice import fit_to_gpu, largest_max_length
from finetune_app.memory.estimator import GiB, estimate_memory
from finetune_app.memory.shape import load_model_shape


def best_of(fn, repeat: int = 200) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    shape = load_model_shape("meta-llama/Llama-3.1-8B-Instruct")
    load_model_shape(DEMO_MODEL)
    cfg = build_config({}, ["lora.target_modules=all-linear", "training.max_length=2048"])
    print(f"estimate_memory:        {best_of(lambda: estimate_memory(cfg, shape)) * 1e3:.3f} ms")
    print(f"load_model_shape (hit): {best_of(lambda: load_model_shape(DEMO_MODEL)) * 1e6:.1f} us")
    print(f"largest_max_length:     {best_of(lambda: largest_max_length(cfg, shape, 24 * GiB), 10) * 1e3:.1f} ms")
    heavy = build_config({}, ["training.micro_batch_size=8", "memory.gradient_checkpointing=false"])
    print(f"fit_to_gpu (16 GiB):    {best_of(lambda: fit_to_gpu(heavy, shape, 16 * GiB), 10) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
