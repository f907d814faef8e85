"""Row formats of training data: detection, per-row validation and normalisation to TRL's dataset types.

What each format becomes (the dataset types TRL's SFTTrainer understands):

    format             columns                               becomes
    messages           messages: [{role, content}]           messages (conversational language modeling)
    sharegpt           conversations: [{from, value}]        messages
    alpaca             instruction, output (+input, system)  conversational prompt/completion:
                                                             prompt=[system?, user], completion=[assistant]
    prompt_completion  prompt, completion (strings)          plain prompt/completion (raw text, no chat template)
                       prompt, completion (message lists)    conversational prompt/completion
    text               text                                  text

Alpaca rows are instructions to a chat model, so they go through the tokenizer's chat template; as a
prompt/completion pair their loss mask needs no `{% generation %}` markers. Plain prompt/completion strings
are left as the user wrote them: that format is how one trains on exact text (base models, custom prompts).
This module is pure: it imports neither torch nor the HF libraries.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

FORMATS = ("messages", "sharegpt", "alpaca", "prompt_completion", "text")
CHAT_FORMATS = ("messages", "sharegpt")
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
REQUIRED_COLUMNS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}


class DataError(Exception):
    """Training data that cannot be used; the message names the file, the rows and how to fix them."""


# ---------------------------------------------------------------------------------------------
# Detection


def chat_column(columns: list[str]) -> str | None:
    """Chat datasets name their list of turns 'messages' or 'conversations'; either works for both formats."""
    for name in ("messages", "conversations"):
        if name in columns:
            return name
    return None


def detect_format(columns: list[str], first_row: dict[str, Any] | None) -> str | None:
    """The format the columns (and, for chats, the keys of the first turn) look like; None if none fits."""
    column = chat_column(columns)
    if column is not None:
        turns = _decode_turns(first_row[column])[0] if first_row else None
        first_turn = turns[0] if turns and isinstance(turns[0], dict) else {}
        if "from" in first_turn or "value" in first_turn:
            return "sharegpt"
        if "role" in first_turn or "content" in first_turn:
            return "messages"
        return "messages" if column == "messages" else "sharegpt"
    for fmt in ("alpaca", "prompt_completion", "text"):
        if all(name in columns for name in REQUIRED_COLUMNS[fmt]):
            return fmt
    return None


def resolve_format(columns: list[str], first_row: dict[str, Any] | None, requested: str, source: str) -> str:
    """`requested` ('auto' or a format) checked against the columns; raises DataError naming what is missing."""
    if requested == "auto":
        fmt = detect_format(columns, first_row)
        if fmt is None:
            raise DataError(
                f"{source}: cannot tell the data format from its columns ({', '.join(columns) or 'none'}). "
                f"Expected one of: {_expected_columns()}. Rename the columns or set data.format."
            )
        return fmt
    needed = REQUIRED_COLUMNS[requested]
    if requested in CHAT_FORMATS:
        ok = chat_column(columns) is not None
        needed = ("messages or conversations",)
    else:
        ok = all(name in columns for name in needed)
    if not ok:
        raise DataError(
            f"{source}: data.format={requested} needs column(s) {', '.join(needed)}, but the data has "
            f"{', '.join(columns) or 'no columns'}. Set data.format=auto or pick the format that matches: "
            f"{_expected_columns()}."
        )
    return requested


def _expected_columns() -> str:
    return "; ".join(f"{fmt} ({', '.join(cols)})" for fmt, cols in REQUIRED_COLUMNS.items())


# ---------------------------------------------------------------------------------------------
# Per-row checks: each returns a list of problems (empty = row is fine) and never raises.


def _decode_turns(value: Any) -> tuple[Any, str | None]:
    """Chat turns, decoded from a JSON string when they come from a CSV cell."""
    if isinstance(value, str):
        try:
            return json.loads(value), None
        except json.JSONDecodeError as exc:
            return None, f"is a string but not valid JSON ({exc.msg} at character {exc.pos})"
    return value, None


def _check_text(value: Any, name: str, *, allow_empty: bool = False) -> list[str]:
    if value is None:
        return [f"'{name}' is missing or null"]
    if not isinstance(value, str):
        return [f"'{name}' must be a string, got {type(value).__name__} {_short(value)}"]
    if not allow_empty and not value.strip():
        return [f"'{name}' is empty"]
    return []


def _check_turns(value: Any, column: str, role_key: str, content_key: str, roles: dict[str, str]) -> list[str]:
    """Shared by messages and sharegpt: a list of turns with a known role, string content and an assistant turn."""
    turns, decode_problem = _decode_turns(value)
    if decode_problem:
        return [f"'{column}' {decode_problem}"]
    if turns is None:
        return [f"'{column}' is missing or null"]
    if not isinstance(turns, list) or not turns:
        return [f"'{column}' must be a non-empty list of turns, got {_short(turns)}"]
    problems = []
    for i, turn in enumerate(turns):
        where = f"{column}[{i}]"
        if not isinstance(turn, dict):
            problems.append(f"{where} must be an object with '{role_key}' and '{content_key}', got {_short(turn)}")
            continue
        role = turn.get(role_key)
        if role is None:
            problems.append(f"{where} has no '{role_key}'")
            continue
        if role not in roles:
            problems.append(f"{where}.{role_key} is {role!r}; allowed: {', '.join(roles)}")
            continue
        problems += [
            f"{where}: {p}" for p in _check_text(turn.get(content_key), content_key, allow_empty=role == "system")
        ]
    if problems:
        return problems
    mapped = [roles[turn[role_key]] for turn in turns]
    if "assistant" not in mapped:
        return [f"'{column}' has no assistant turn: nothing to learn from this row"]
    if mapped[-1] != "assistant":
        return [f"'{column}' ends with a {mapped[-1]} turn after the last assistant turn; remove it or add the reply"]
    return []


def check_messages(row: dict[str, Any], column: str = "messages") -> list[str]:
    return _check_turns(row.get(column), column, "role", "content", {role: role for role in ROLES})


def check_sharegpt(row: dict[str, Any], column: str = "conversations") -> list[str]:
    return _check_turns(row.get(column), column, "from", "value", SHAREGPT_ROLES)


def check_alpaca(row: dict[str, Any]) -> list[str]:
    problems = _check_text(row.get("instruction"), "instruction") + _check_text(row.get("output"), "output")
    for optional in ("input", "system"):
        if row.get(optional) is not None:
            problems += _check_text(row[optional], optional, allow_empty=True)
    return problems


def check_prompt_completion(row: dict[str, Any]) -> list[str]:
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, list) or isinstance(completion, list):
        problems = []
        for name, value in (("prompt", prompt), ("completion", completion)):
            if not isinstance(value, list) or not value:
                problems.append(f"'{name}' must be a non-empty list of messages like the other column")
            else:
                problems += _check_turns_loosely(value, name)
        if not problems and completion[-1].get("role") != "assistant":
            problems.append("'completion' must end with an assistant message")
        return problems
    return _check_text(prompt, "prompt") + _check_text(completion, "completion")


def _check_turns_loosely(turns: list[Any], column: str) -> list[str]:
    """Turn checks for half a conversation (a prompt has no assistant turn, a completion maybe no user turn)."""
    problems = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ROLES:
            role = turn.get("role") if isinstance(turn, dict) else None
            problems.append(f"{column}[{i}].role is {role!r}; allowed: {', '.join(ROLES)}")
            continue
        problems += [f"{column}[{i}]: {p}" for p in _check_text(turn.get("content"), "content")]
    return problems


def check_text(row: dict[str, Any]) -> list[str]:
    return _check_text(row.get("text"), "text")


# ---------------------------------------------------------------------------------------------
# Normalisation: one row of a checked dataset -> the columns TRL expects.


def normalise_messages(row: dict[str, Any], column: str = "messages") -> dict[str, Any]:
    turns, _ = _decode_turns(row[column])
    return {"messages": [{"role": turn["role"], "content": turn["content"]} for turn in turns]}


def normalise_sharegpt(row: dict[str, Any], column: str = "conversations") -> dict[str, Any]:
    turns, _ = _decode_turns(row[column])
    return {"messages": [{"role": SHAREGPT_ROLES[turn["from"]], "content": turn["value"]} for turn in turns]}


def normalise_alpaca(row: dict[str, Any]) -> dict[str, Any]:
    user = row["instruction"]
    if row.get("input"):
        user = user + "\n\n" + row["input"]
    prompt = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    prompt.append({"role": "user", "content": user})
    return {"prompt": prompt, "completion": [{"role": "assistant", "content": row["output"]}]}


def normalise_prompt_completion(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row["prompt"], list):
        keep = ("role", "content")
        return {
            "prompt": [{k: turn[k] for k in keep} for turn in row["prompt"]],
            "completion": [{k: turn[k] for k in keep} for turn in row["completion"]],
        }
    return {"prompt": row["prompt"], "completion": row["completion"]}


def normalise_text(row: dict[str, Any]) -> dict[str, Any]:
    return {"text": row["text"]}


def row_functions(fmt: str, columns: list[str]) -> tuple[Callable[[dict], list[str]], Callable[[dict], dict]]:
    """(check, normalise) for a format; chat formats read whichever of messages/conversations exists."""
    if fmt == "messages":
        column = chat_column(columns) or "messages"
        return (lambda row: check_messages(row, column)), (lambda row: normalise_messages(row, column))
    if fmt == "sharegpt":
        column = chat_column(columns) or "conversations"
        return (lambda row: check_sharegpt(row, column)), (lambda row: normalise_sharegpt(row, column))
    return {
        "alpaca": (check_alpaca, normalise_alpaca),
        "prompt_completion": (check_prompt_completion, normalise_prompt_completion),
        "text": (check_text, normalise_text),
    }[fmt]


def last_turn_prompt_completion(row: dict[str, Any]) -> dict[str, Any]:
    """A checked chat as conversational prompt/completion: everything before the last assistant turn is the prompt."""
    messages = row["messages"]
    return {"prompt": messages[:-1], "completion": messages[-1:]}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
