"""Try it: answer a prompt with the base model and with the fine-tuned adapter, side by side.

Inference runs in the GUI process (training never does). The base model is loaded once per adapter, lazily,
on the first question, the way the run trained it (finetune_app.inference); the same weights answer twice,
once with the adapter disabled. torch and the HF libraries are imported inside functions only, so the GUI
starts without them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_app.config import ConfigError, RunConfig, load_config


class ChatError(RuntimeError):
    """The adapter or its base model cannot be loaded; the message says what to do."""


@dataclass
class LoadedPair:
    adapter_dir: Path
    model: Any  # a PeftModel: disable_adapter() gives the base model's answers
    tokenizer: Any


_lock = threading.Lock()
_loaded: LoadedPair | None = None


def adapter_config(adapter_dir: Path) -> RunConfig:
    """The RunConfig the adapter was trained with (the runner saves it next to the weights)."""
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ChatError(f"{adapter_dir} is not a LoRA adapter folder (no adapter_config.json); train a run first")
    for candidate in (adapter_dir / "config.yaml", adapter_dir.parent / "config.yaml"):
        if candidate.is_file():
            try:
                return load_config(candidate)
            except ConfigError as exc:
                raise ChatError(f"cannot read the run's settings: {exc}") from None
    raise ChatError(f"{adapter_dir} has no config.yaml next to it: which base model it belongs to is unknown")


def load_pair(adapter_dir: Path) -> LoadedPair:
    """Base model + adapter, loaded as the run trained them; asking again with the same adapter reuses them."""
    global _loaded
    adapter_dir = Path(adapter_dir).resolve()
    with _lock:
        if _loaded is not None and _loaded.adapter_dir == adapter_dir:
            return _loaded
        _loaded = None  # free the previous pair before loading another
        cfg = adapter_config(adapter_dir)
        from finetune_app.inference import load_for_inference

        try:
            model, tokenizer = load_for_inference(cfg, adapter_dir)
        except Exception as exc:  # missing base, bad adapter, out of memory: the user needs the reason
            raise ChatError(f"could not load {cfg.model.name_or_path} with the adapter: {exc}") from exc
        _loaded = LoadedPair(adapter_dir, model, tokenizer)
        return _loaded


def answer_both(adapter_dir: Path, prompt: str, max_new_tokens: int = 128) -> tuple[str, str]:
    """(base model's answer, fine-tuned model's answer) to one user prompt, both greedy."""
    from finetune_app.inference import greedy_answer

    if not prompt.strip():
        raise ChatError("type a question first")
    pair = load_pair(adapter_dir)
    with _lock:
        with pair.model.disable_adapter():
            base_answer = greedy_answer(pair.model, pair.tokenizer, prompt, max_new_tokens)
        tuned_answer = greedy_answer(pair.model, pair.tokenizer, prompt, max_new_tokens)
    return base_answer, tuned_answer


def find_adapters(runs_dir: Path) -> list[str]:
    """Adapter folders of finished or stopped runs under runs_dir, newest first."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    found = [p for p in runs_dir.glob("*/adapter") if (p / "adapter_config.json").is_file()]
    found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [str(p) for p in found]
