"""Training data: load it, check every row, normalise it for TRL's SFTTrainer, and preview what the model sees.

`load_training_data` returns a `DataBundle`: datasets in the shape SFTTrainer takes (see data_formats for what
each row format becomes), which tokens carry the loss, and the chat template to set on the tokenizer.

Loss on assistant tokens only needs a chat template with `{% generation %}` markers. `training_chat_template`
finds one (the model's own, TRL's patched copy of a known template, or a ChatML copy with markers). When there
is none, chats are trained as prompt/completion on their last assistant turn instead, and the bundle says so.

datasets and trl are imported inside the functions that use them, so importing this module stays cheap.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from finetune_app.config import DataSection
from finetune_app.data_formats import (
    CHAT_FORMATS,
    DataError,
    last_turn_prompt_completion,
    resolve_format,
    row_functions,
)

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "DataBundle",
    "DataError",
    "PreviewExample",
    "demo_heldout_questions",
    "load_rows",
    "load_training_data",
    "preview_bundle",
    "preview_examples",
    "training_chat_template",
]

BUILTIN_DIR = Path(__file__).parent / "builtin_data"
BUILTIN_PREFIX = "builtin:"
FILE_LOADERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# Look like local files the user meant, not Hub ids, so they get "unsupported type" rather than "not on the Hub".
OTHER_FILE_SUFFIXES = {".txt", ".tsv", ".xlsx", ".xls", ".arrow", ".pkl", ".pickle", ".zip", ".gz", ".xml", ".md"}
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
MAX_PROBLEMS = 10

Loss = Literal["assistant_only", "completion_only", "all"]


@dataclass
class DataBundle:
    train: Dataset
    eval: Dataset | None
    format: str  # the detected (or requested) row format of the source data
    loss: Loss  # which tokens count: "assistant_only" needs `chat_template` set on the tokenizer
    chat_template: str | None  # set on the tokenizer before training (None = keep the tokenizer's own)
    notes: list[str] = field(default_factory=list)  # things the user should know, shown in the GUI and logs


# ---------------------------------------------------------------------------------------------
# Loading


def load_rows(path: str, subset: str | None = None, split: str | None = "train") -> tuple[Dataset, str]:
    """The raw rows of a file, builtin dataset, local dataset folder or Hub dataset, and a name for messages.

    With split=None a Hub dataset's "validation" (else "test") split is used: that is for eval data.
    """
    import datasets

    if path.startswith(BUILTIN_PREFIX):
        return _load_file(_builtin_file(path)), path
    local = Path(path).expanduser()
    suffix = local.suffix.lower()
    if suffix in FILE_LOADERS:
        if not local.is_file():
            raise DataError(f"data file not found: {local} (check data.path / data.eval_path)")
        return _load_file(local), str(local)
    if local.is_file() or suffix in OTHER_FILE_SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type '{suffix or '(none)'}'; use .json, .jsonl, .csv or .parquet"
            + ("" if local.is_file() else " (and the file does not exist)")
        )
    if not local.is_dir() and not HUB_ID.match(path):
        raise DataError(f"data path {path!r} is neither an existing file or folder nor a Hub dataset id (org/name)")
    name = f"{path}" + (f" [{subset}]" if subset else "")
    try:
        loaded = datasets.load_dataset(str(local) if local.is_dir() else path, subset, split=split)
    except Exception as exc:  # unknown id, split or subset, offline, no access: all reported the same way
        raise DataError(
            f"could not load the dataset {name} (split {split or 'validation/test'}): {exc}. Check the id, subset "
            "and split; a private dataset needs `hf auth login` or HF_TOKEN; offline, use a local file instead."
        ) from None
    if split is None:
        for candidate in ("validation", "test"):
            if candidate in loaded:
                return loaded[candidate], f"{name} split {candidate}"
        raise DataError(f"{name} has no 'validation' or 'test' split (it has {', '.join(loaded)}); use eval_fraction")
    return loaded, f"{name} split {split}"


def _builtin_file(path: str) -> Path:
    name = path[len(BUILTIN_PREFIX) :]
    file = BUILTIN_DIR / f"{name}.jsonl"
    if not name or not file.is_file():
        known = sorted(p.stem for p in BUILTIN_DIR.glob("*.jsonl") if not p.stem.endswith("-heldout"))
        raise DataError(f"unknown builtin dataset {path!r}; available: {', '.join(BUILTIN_PREFIX + k for k in known)}")
    return file


def _load_file(path: Path) -> Dataset:
    import datasets

    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty: it needs rows of training data")
    loader = FILE_LOADERS[path.suffix.lower()]
    kwargs: dict[str, Any] = {}
    if loader == "csv":
        # Read every cell as text: pandas would turn an answer like "42" into an int and an empty column into floats.
        kwargs["features"] = datasets.Features({name: datasets.Value("string") for name in _csv_header(path)})
    try:
        return datasets.load_dataset(loader, data_files=str(path), split="train", **kwargs)
    except Exception as exc:  # the loaders raise many types; the scan below finds the line that broke
        detail = _find_bad_json_line(path) if loader == "json" else None
        raise DataError(f"{path}: cannot be read as {path.suffix.lstrip('.')}: {detail or exc}") from None


def _csv_header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), None)
    if not header:
        raise DataError(f"{path}: the CSV file is empty; its first line must name the columns")
    return header


def _find_bad_json_line(path: Path) -> str | None:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        json.loads(text)
        return None  # one valid JSON document: the problem is elsewhere
    except json.JSONDecodeError:
        pass
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as exc:
            return f"line {number} is not valid JSON ({exc.msg} at column {exc.colno})"
    return None


# ---------------------------------------------------------------------------------------------
# Checking and normalising


def normalise(rows: Dataset, fmt: str, source: str) -> Dataset:
    """Check every row (reporting up to MAX_PROBLEMS, with 1-based row numbers) and convert to TRL columns."""
    check, convert = row_functions(fmt, rows.column_names)
    problems, total = [], 0
    for index, row in enumerate(_rows_to_check(rows, source)):
        for problem in check(row):
            total += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(f"  - {_row_name(source, index)}: {problem}")
    if total:
        more = f" (showing the first {MAX_PROBLEMS})" if total > len(problems) else ""
        raise DataError(f"{source}: {total} problem(s) in {fmt} rows{more}:\n" + "\n".join(problems))
    return rows.map(convert, remove_columns=rows.column_names, desc=f"Normalising {fmt} rows")


def _rows_to_check(rows: Dataset, source: str) -> Any:
    """The rows as the checks should see them.

    When values of one JSON field mix types, datasets stores them as JSON text and reads the string "4" back as
    the number 4; such a file (it always has a bad row) is checked as parsed by the json module instead.
    """
    path = Path(source)
    if path.suffix not in (".json", ".jsonl") or not path.is_file() or not _has_json_feature(rows.features):
        return rows
    text = path.read_text(encoding="utf-8")
    try:
        parsed = json.loads(text)  # a JSON array
    except json.JSONDecodeError:
        parsed = [json.loads(line) for line in text.splitlines() if line.strip()]  # JSON lines
    return parsed[: len(rows)]


def _has_json_feature(feature: Any) -> bool:
    from datasets import Json

    if isinstance(feature, Json):
        return True
    if isinstance(feature, dict):
        return any(_has_json_feature(value) for value in feature.values())
    if isinstance(feature, list | tuple):
        return any(_has_json_feature(value) for value in feature)
    inner = getattr(feature, "feature", None)  # List / Sequence / LargeList
    return inner is not None and _has_json_feature(inner)


def _row_name(source: str, index: int) -> str:
    if source.endswith(".jsonl"):
        return f"row {index + 1} (line {index + 1})"
    if source.endswith(".csv"):
        return f"row {index + 1} (line {index + 2}, after the header)"
    return f"row {index + 1}"


def load_training_data(data_cfg: DataSection, tokenizer: Any, seed: int) -> DataBundle:
    """Load, check and normalise the training (and eval) data, and decide which tokens carry the loss."""
    notes: list[str] = []
    rows, source = load_rows(data_cfg.path, data_cfg.subset, data_cfg.split)
    if len(rows) == 0:
        raise DataError(f"{source} has no rows")
    if data_cfg.max_samples is not None:
        if data_cfg.max_samples < len(rows):
            rows = rows.select(range(data_cfg.max_samples))
        else:
            notes.append(f"data.max_samples={data_cfg.max_samples} but {source} has only {len(rows)} rows: using all")
    fmt = resolve_format(rows.column_names, rows[0], data_cfg.format, source)
    train = normalise(rows, fmt, source)
    eval_rows = _load_eval(data_cfg, fmt) if data_cfg.eval_path else None

    rendered_with_template = fmt in CHAT_FORMATS or fmt == "alpaca" or isinstance(train[0].get("prompt"), list)
    if rendered_with_template and not tokenizer.chat_template:
        raise DataError(
            f"{fmt} data is rendered with the model's chat template, but this tokenizer has none. Use a "
            "chat/instruct model, or convert the data to format text or prompt_completion (plain strings)."
        )

    loss: Loss = "completion_only" if data_cfg.completion_only_loss else "all"
    chat_template = None
    if fmt == "text" and data_cfg.completion_only_loss:
        loss = "all"
        notes.append("text rows have no prompt/completion split: the loss covers every token")
    if fmt in CHAT_FORMATS and data_cfg.completion_only_loss:
        chat_template = training_chat_template(tokenizer)
        if chat_template is not None and _assistant_mask_works(tokenizer, chat_template, train[0]["messages"]):
            loss = "assistant_only"
        else:
            chat_template = None
            notes.append(_last_turn_warning(train))
            train = train.map(last_turn_prompt_completion, remove_columns=["messages"])
            if eval_rows is not None:
                eval_rows = eval_rows.map(last_turn_prompt_completion, remove_columns=["messages"])

    if data_cfg.eval_fraction > 0:
        train, eval_rows = _split(train, data_cfg.eval_fraction, seed)
    return DataBundle(train=train, eval=eval_rows, format=fmt, loss=loss, chat_template=chat_template, notes=notes)


def _load_eval(data_cfg: DataSection, fmt: str) -> Dataset:
    """eval_path rows in the training format (a Hub dataset gives its validation or test split)."""
    same = data_cfg.eval_path == data_cfg.path
    rows, source = load_rows(data_cfg.eval_path, data_cfg.subset if same else None, None)
    if len(rows) == 0:
        raise DataError(f"{source} has no rows")
    eval_fmt = resolve_format(rows.column_names, rows[0], data_cfg.format, source)
    if eval_fmt != fmt:
        raise DataError(f"{source} is in {eval_fmt} format but the training data is {fmt}; use one format for both")
    return normalise(rows, fmt, source)


def _last_turn_warning(train: Dataset) -> str:
    multi = sum(1 for messages in train["messages"] if sum(turn["role"] == "assistant" for turn in messages) > 1)
    lost = f"; earlier assistant turns in {multi} multi-turn row(s) are context only, not learned." if multi else "."
    return (
        "WARNING: the model's chat template has no {% generation %} markers and is not one this app can patch, "
        "so assistant-only loss is not possible. Each chat is trained as a prompt/completion pair on its LAST "
        f"assistant turn{lost} To learn every turn, set data.completion_only_loss=false (loss on all tokens) or "
        "use a model whose chat template has generation markers."
    )


def _split(train: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    n_eval = max(1, round(len(train) * fraction))
    if n_eval >= len(train):
        raise DataError(
            f"data.eval_fraction={fraction} of {len(train)} rows leaves nothing to train on; lower it or add rows"
        )
    parts = train.train_test_split(test_size=n_eval, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


# ---------------------------------------------------------------------------------------------
# Chat templates with {% generation %} markers


def chatml_training_template(default_system: str | None) -> str:
    """ChatML with the assistant reply and its <|im_end|> inside {% generation %} markers.

    `default_system` reproduces templates (like SmolLM2's) that add a system turn when the chat has none.
    """
    default = (
        "{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\n' + "
        + json.dumps(default_system, ensure_ascii=False)
        + " + '<|im_end|>\\n' }}{% endif %}"
        if default_system is not None
        else ""
    )
    return (
        "{% for message in messages %}" + default + "{% if message['role'] == 'assistant' %}"
        "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
        "{{ '\\n' }}{% else %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


_PROBES = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": " Bye \n"},
        {"role": "assistant", "content": "\nBye. "},
    ],
]


def training_chat_template(tokenizer: Any) -> str | None:
    """A chat template that marks assistant replies with {% generation %}, rendering exactly like the model's own.

    The model's template if it has markers, TRL's patched copy if TRL knows it, a ChatML copy with markers if the
    template renders plain ChatML (keeping its default system prompt), else None.
    """
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        return None
    if has_generation_markers(template):
        return template
    try:
        patched = get_training_chat_template(tokenizer)
    except ValueError:  # TRL raises for templates it has no patched copy of
        patched = None
    if patched:
        return patched
    return _chatml_copy(tokenizer, template)


def _chatml_copy(tokenizer: Any, template: str) -> str | None:
    def render(messages: list[dict], chat_template: str, **kwargs: Any) -> str | None:
        try:
            return tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False, **kwargs)
        except Exception:  # a template may reject our probe (e.g. it demands alternating roles): not ChatML then
            return None

    alone = render([{"role": "user", "content": "Hi"}], template)
    if alone is None or "<|im_start|>" not in alone:
        return None
    default_system = None
    match = re.match(r"<\|im_start\|>system\n(.*?)<\|im_end\|>\n<\|im_start\|>user\n", alone, re.DOTALL)
    if match:
        default_system = match.group(1)
    candidate = chatml_training_template(default_system)
    for probe in _PROBES:
        for kwargs in ({}, {"add_generation_prompt": True}):
            messages = probe[:-1] if kwargs else probe
            if render(messages, template, **kwargs) != render(messages, candidate, **kwargs):
                return None
    return candidate


def _assistant_mask_works(tokenizer: Any, chat_template: str, messages: list[dict]) -> bool:
    out = tokenizer.apply_chat_template(
        messages, chat_template=chat_template, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return 1 in out.get("assistant_masks", [])


# ---------------------------------------------------------------------------------------------
# Preview


@dataclass
class PreviewExample:
    row: int  # 1-based row of bundle.train
    text: str  # the decoded tokens, exactly the sequence the model is trained on
    segments: list[tuple[str, bool]]  # consecutive pieces of `text`; True = counts for the loss
    num_tokens: int
    num_trained_tokens: int
    truncated: bool


def preview_examples(
    data_cfg: DataSection, tokenizer: Any, n: int = 3, max_length: int | None = None, seed: int = 0
) -> list[PreviewExample]:
    """The first n training examples as the model will see them, with the loss-carrying parts marked."""
    return preview_bundle(load_training_data(data_cfg, tokenizer, seed), tokenizer, n, max_length)


def preview_bundle(
    bundle: DataBundle, tokenizer: Any, n: int = 3, max_length: int | None = None
) -> list[PreviewExample]:
    out = []
    for index in range(min(n, len(bundle.train))):
        input_ids, labels = tokenize_like_sft(bundle.train[index], tokenizer, bundle)
        truncated = max_length is not None and len(input_ids) > max_length
        if truncated:
            input_ids, labels = input_ids[:max_length], labels[:max_length]
        out.append(
            PreviewExample(
                row=index + 1,
                text=tokenizer.decode(input_ids),
                segments=_segments(tokenizer, input_ids, labels),
                num_tokens=len(input_ids),
                num_trained_tokens=sum(label != -100 for label in labels),
                truncated=truncated,
            )
        )
    return out


def tokenize_like_sft(example: dict[str, Any], tokenizer: Any, bundle: DataBundle) -> tuple[list[int], list[int]]:
    """(input_ids, labels) for one bundle row, made with the same tokenizer calls as TRL 1.x SFTTrainer.

    tests/test_data.py checks that this matches SFTTrainer's own prepared dataset for every format.
    """
    template = bundle.chat_template
    if "messages" in example:
        out = tokenizer.apply_chat_template(
            example["messages"],
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=bundle.loss == "assistant_only",
        )
        ids = list(out["input_ids"])
        mask = out.get("assistant_masks") if bundle.loss == "assistant_only" else None
        return ids, ids if mask is None else [t if m else -100 for t, m in zip(ids, mask, strict=True)]
    if "prompt" in example:
        if isinstance(example["prompt"], list):
            prompt_ids = tokenizer.apply_chat_template(
                example["prompt"], chat_template=template, tokenize=True, return_dict=True, add_generation_prompt=True
            )["input_ids"]
            ids = tokenizer.apply_chat_template(
                example["prompt"] + example["completion"], chat_template=template, tokenize=True, return_dict=True
            )["input_ids"]
        else:
            completion = _with_eos(example["completion"], tokenizer)
            prompt_ids = tokenizer(text=example["prompt"])["input_ids"]
            ids = tokenizer(text=example["prompt"] + completion)["input_ids"]
        ids = list(ids)
        start = _common_prefix(prompt_ids, ids) if bundle.loss == "completion_only" else 0
        return ids, [-100] * start + ids[start:]
    ids = list(tokenizer(text=_with_eos(example["text"], tokenizer))["input_ids"])
    return ids, ids


def _with_eos(text: str, tokenizer: Any) -> str:
    eos = tokenizer.eos_token
    return text if not eos or text.endswith(eos) else text + eos


def _common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def _segments(tokenizer: Any, input_ids: list[int], labels: list[int]) -> list[tuple[str, bool]]:
    """Runs of trained / untrained tokens, decoded."""
    runs: list[tuple[list[int], bool]] = []
    for token, label in zip(input_ids, labels, strict=True):
        trained = label != -100
        if runs and runs[-1][1] == trained:
            runs[-1][0].append(token)
        else:
            runs.append(([token], trained))
    return [(tokenizer.decode(tokens), trained) for tokens, trained in runs]


# ---------------------------------------------------------------------------------------------
# Demo dataset


def demo_heldout_questions() -> list[dict[str, str]]:
    """Questions about the demo facts phrased unlike any training row, each with the keyword a right answer has."""
    path = BUILTIN_DIR / "demo-facts-heldout.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"question": row["question"], "keyword": row["keyword"]} for row in rows]
