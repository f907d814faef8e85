"""TrainerCallbacks: the event log (loss, tokens/s, memory, ETA), terminal progress, and clean stop."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from transformers import TrainerCallback

from .events import EventLog


class EventCallback(TrainerCallback):
    """Turns the Trainer's logs into events and draws a progress bar from the same numbers."""

    def __init__(self, events: EventLog, *, on_cuda: bool):
        self.events = events
        self.on_cuda = on_cuda
        self.started = 0.0
        self.first_step = 0
        self.last_tokens = 0
        self.last_time = 0.0
        self.progress = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.last_time = time.time()
        self.first_step = state.global_step
        self.last_tokens = state.num_input_tokens_seen
        if state.is_world_process_zero:
            self.events.emit(
                "train_begin", total_steps=state.max_steps, step=state.global_step, num_processes=args.world_size
            )
            self.progress = TerminalProgress(state.max_steps, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "eval_loss" in logs:
            self.events.emit("eval", step=state.global_step, eval_loss=logs["eval_loss"])
            return
        if "loss" not in logs:
            return
        now = time.time()
        tokens = state.num_input_tokens_seen
        rate = (tokens - self.last_tokens) / max(now - self.last_time, 1e-9)
        self.last_tokens, self.last_time = tokens, now
        record = self.events.emit(
            "log",
            step=state.global_step,
            total_steps=state.max_steps,
            epoch=logs.get("epoch"),
            loss=logs["loss"],
            learning_rate=logs.get("learning_rate"),
            grad_norm=logs.get("grad_norm"),
            tokens_per_second=round(rate * args.world_size, 1),
            tokens_seen=tokens,
            eta_seconds=self._eta(state, now),
            memory=measure_memory(self.on_cuda),
        )
        if self.progress:
            self.progress.update(record)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            path = f"{args.output_dir}/checkpoint-{state.global_step}"
            self.events.emit("checkpoint", step=state.global_step, path=path)

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress:
            self.progress.close()

    def _eta(self, state, now: float) -> float | None:
        done = state.global_step - self.first_step
        if done <= 0 or state.max_steps <= 0:
            return None
        return round((now - self.started) / done * (state.max_steps - state.global_step), 1)


class StopOnSignal(TrainerCallback):
    """SIGINT / SIGTERM ask the Trainer to save a checkpoint at the end of the current step and stop."""

    def __init__(self):
        self.requested = False

    def request(self, signum=None, frame=None) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C means now
        self.requested = True
        print("\nStop requested: finishing this step, saving a checkpoint and the adapter ...", file=sys.stderr)

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.request) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


def measure_memory(on_cuda: bool) -> dict[str, Any]:
    """Peak memory as the device reports it: torch's allocator and NVML on GPU, process RSS on CPU."""
    if not on_cuda:
        import psutil

        return {"host_rss": psutil.Process().memory_info().rss}
    import torch

    device = torch.cuda.current_device()
    figures = {
        "allocated_peak": torch.cuda.max_memory_allocated(device),
        "reserved_peak": torch.cuda.max_memory_reserved(device),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        figures["nvml_used"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    except Exception:  # NVML is optional: the torch figures are still right
        pass
    return figures


class TerminalProgress:
    """A rich progress bar (step, loss, tokens/s, ETA) when attached to a terminal, plain lines otherwise."""

    def __init__(self, total: int, completed: int):
        self.total = total
        self.bar = None
        if sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("train", total=total, completed=completed, info="")
            self.bar.start()

    def update(self, record: dict[str, Any]) -> None:
        info = f"loss {record['loss']:.4f}  {record['tokens_per_second']:.0f} tok/s"
        if self.bar is not None:
            self.bar.update(self.task, completed=record["step"], info=info)
            return
        eta = record.get("eta_seconds")
        eta_text = f"  eta {eta:.0f}s" if eta is not None else ""
        print(f"step {record['step']}/{self.total}  {info}{eta_text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
