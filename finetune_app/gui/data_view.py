"""Dataset preview for the Configure tab: the first examples rendered exactly as the model will see them.

The tokenizer comes from the selected model (loaded once per model, no weights); the rows go through
data.load_training_data and data.preview_bundle, the same code the training run uses.
"""

from __future__ import annotations

import html
import shutil
from functools import lru_cache
from pathlib import Path

from finetune_app.config import RunConfig
from finetune_app.gui.jobs import app_home

UPLOAD_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")


@lru_cache(maxsize=4)
def _tokenizer(path: str, revision: str | None, trust_remote_code: bool):
    from finetune_app.runner import load_tokenizer as load_base_tokenizer

    return load_base_tokenizer(path, revision, trust_remote_code)


def load_tokenizer(cfg: RunConfig):
    from finetune_app.model_source import resolve_model

    resolved = resolve_model(cfg.model, log=lambda _message: None)
    return _tokenizer(resolved.path, resolved.revision, cfg.model.trust_remote_code)


def preview_html(cfg: RunConfig, n: int = 3) -> str:
    """HTML of the first n training examples; tokens that carry the loss are highlighted. Errors become text."""
    from finetune_app.data import DataError, load_training_data, preview_bundle

    try:
        tokenizer = load_tokenizer(cfg)
        bundle = load_training_data(cfg.data, tokenizer, seed=cfg.training.seed)
        examples = preview_bundle(bundle, tokenizer, n=n, max_length=cfg.training.max_length)
    except DataError as exc:
        return _message_html("The data cannot be used", str(exc))
    except Exception as exc:  # a model without tokenizer, no network for a Hub id, ...
        return _message_html("Preview failed", f"{type(exc).__name__}: {exc}")
    loss_text = {
        "assistant_only": "only the assistant's replies are trained (highlighted)",
        "completion_only": "only the completions are trained (highlighted)",
        "all": "every token is trained (highlighted)",
    }.get(bundle.loss, bundle.loss)
    head = (
        f"<div class='preview-head'>Detected format: <b id='data-format'>{html.escape(bundle.format)}</b> · "
        f"{len(bundle.train)} training rows"
        + (f" · {len(bundle.eval)} eval rows" if bundle.eval is not None else "")
        + f" · {loss_text}</div>"
    )
    notes = "".join(f"<div class='preview-note'>{html.escape(note)}</div>" for note in bundle.notes)
    items = []
    for example in examples:
        body = "".join(
            f"<span class='{'tok-train' if trained else 'tok-ctx'}'>{html.escape(text)}</span>"
            for text, trained in example.segments
        )
        info = f"row {example.row} · {example.num_tokens} tokens, {example.num_trained_tokens} trained"
        if example.truncated:
            info += f" · truncated to max_length={cfg.training.max_length}"
        items.append(f"<div class='preview-item'><div class='preview-info'>{info}</div><pre>{body}</pre></div>")
    return f"<div id='data-preview'>{head}{notes}{''.join(items)}</div>"


def _message_html(title: str, text: str) -> str:
    return (
        f"<div id='data-preview' class='preview-error'><b>{html.escape(title)}</b><pre>{html.escape(text)}</pre></div>"
    )


def keep_upload(temp_path: str) -> Path:
    """Copy an uploaded file out of gradio's temporary cache into $FINETUNE_APP_HOME/uploads (runs read it later)."""
    source = Path(temp_path)
    if source.suffix.lower() not in UPLOAD_SUFFIXES:
        raise ValueError(f"{source.name}: unsupported file type; upload a {', '.join(UPLOAD_SUFFIXES)} file")
    target_dir = app_home() / "uploads"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / source.name
    counter = 1
    while target.exists() and target.read_bytes() != source.read_bytes():
        target = target_dir / f"{source.stem}-{counter}{source.suffix}"
        counter += 1
    shutil.copyfile(source, target)
    return target
