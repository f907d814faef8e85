"""finetune_app.data: loading, format detection, row validation, loss masks, preview and the demo dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from tiny import CHATML_TEMPLATE, make_tokenizer

from finetune_app.config import DataSection
from finetune_app.data import (
    DataError,
    chatml_training_template,
    demo_heldout_questions,
    load_training_data,
    preview_bundle,
    preview_examples,
    tokenize_like_sft,
    training_chat_template,
)

# SmolLM2-135M-Instruct's template: ChatML without generation markers, adding a default system prompt.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Neither ChatML nor known to TRL: no assistant masks can be made for it.
PLAIN_TEMPLATE = (
    "{% for message in messages %}### {{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant: {% endif %}"
)

ROWS = {
    "messages": [
        {"messages": [{"role": "user", "content": "what is up?"}, {"role": "assistant", "content": "the sky."}]},
        {
            "messages": [
                {"role": "system", "content": "be brief."},
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi."},
            ]
        },
    ],
    "sharegpt": [
        {"conversations": [{"from": "human", "value": "what is up?"}, {"from": "gpt", "value": "the sky."}]},
        {
            "conversations": [
                {"from": "system", "value": "be brief."},
                {"from": "user", "value": "hello"},
                {"from": "assistant", "value": "hi."},
            ]
        },
    ],
    "alpaca": [
        {"instruction": "what is up?", "input": "", "output": "the sky."},
        {"instruction": "add", "input": "2 and 2", "output": "4"},
    ],
    "prompt_completion": [
        {"prompt": "what is up? ", "completion": "the sky."},
        {"prompt": "hello ", "completion": "hi."},
    ],
    "text": [{"text": "the quick brown fox"}, {"text": "jumps over the lazy dog"}],
}
FIRST_NORMALISED = {
    "messages": {
        "messages": [{"role": "user", "content": "what is up?"}, {"role": "assistant", "content": "the sky."}]
    },
    "sharegpt": {
        "messages": [{"role": "user", "content": "what is up?"}, {"role": "assistant", "content": "the sky."}]
    },
    "alpaca": {
        "prompt": [{"role": "user", "content": "what is up?"}],
        "completion": [{"role": "assistant", "content": "the sky."}],
    },
    "prompt_completion": {"prompt": "what is up? ", "completion": "the sky."},
    "text": {"text": "the quick brown fox"},
}


def write_rows(path: Path, rows: list[dict]) -> Path:
    """Write rows as .json (array), .jsonl, .csv (nested values as JSON text) or .parquet."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif path.suffix == ".csv":
        import pandas as pd

        flat = [{k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in row.items()} for row in rows]
        pd.DataFrame(flat).to_csv(path, index=False)
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def smol_tokenizer():
    tok = make_tokenizer()
    tok.chat_template = SMOLLM2_TEMPLATE
    return tok


def load(path, tokenizer, seed=0, **fields):
    return load_training_data(DataSection(path=str(path), **fields), tokenizer, seed)


# ---------------------------------------------------------------------------------------------
# Loading and formats


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize("fmt", list(ROWS))
def test_each_format_loads_from_each_file_type(tmp_path, tokenizer, fmt, suffix):
    path = write_rows(tmp_path / f"data{suffix}", ROWS[fmt])
    bundle = load(path, tokenizer)
    assert bundle.format == fmt
    assert len(bundle.train) == 2 and bundle.eval is None
    assert bundle.train[0] == FIRST_NORMALISED[fmt]


def test_alpaca_joins_instruction_and_input_and_keeps_system(tmp_path, tokenizer):
    rows = [{"instruction": "add", "input": "2 and 2", "output": "4", "system": "be exact."}]
    bundle = load(write_rows(tmp_path / "a.jsonl", rows), tokenizer)
    assert bundle.train[0]["prompt"] == [
        {"role": "system", "content": "be exact."},
        {"role": "user", "content": "add\n\n2 and 2"},
    ]
    assert bundle.loss == "completion_only"


def test_conversational_prompt_completion_stays_conversational(tmp_path, tokenizer):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]}]
    bundle = load(write_rows(tmp_path / "pc.jsonl", rows), tokenizer)
    assert bundle.format == "prompt_completion"
    assert bundle.train[0]["completion"] == [{"role": "assistant", "content": "yo"}]


def test_sharegpt_rows_in_a_messages_column_are_detected_by_their_keys(tmp_path, tokenizer):
    rows = [{"messages": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]
    bundle = load(write_rows(tmp_path / "s.jsonl", rows), tokenizer)
    assert bundle.format == "sharegpt"
    assert bundle.train[0]["messages"][1] == {"role": "assistant", "content": "yo"}


def test_format_override_beats_detection(tmp_path, tokenizer):
    rows = [{"prompt": "a ", "completion": "b", "text": "whole text"}]
    path = write_rows(tmp_path / "both.jsonl", rows)
    assert load(path, tokenizer).format == "prompt_completion"
    bundle = load(path, tokenizer, format="text")
    assert bundle.format == "text" and bundle.train[0] == {"text": "whole text"}


def test_format_override_names_missing_columns(tmp_path, tokenizer):
    path = write_rows(tmp_path / "t.jsonl", ROWS["text"])
    with pytest.raises(DataError, match=r"data.format=alpaca needs column\(s\) instruction, output.*has text"):
        load(path, tokenizer, format="alpaca")


def test_unrecognised_columns_are_listed(tmp_path, tokenizer):
    path = write_rows(tmp_path / "q.jsonl", [{"question": "a", "answer": "b"}])
    with pytest.raises(DataError, match=r"cannot tell the data format from its columns \(question, answer\)"):
        load(path, tokenizer)


def test_missing_file(tmp_path, tokenizer):
    with pytest.raises(DataError, match="data file not found: .*nope.jsonl"):
        load(tmp_path / "nope.jsonl", tokenizer)


@pytest.mark.parametrize("name", ["data.txt", "data.tsv"])
def test_unknown_extension(tmp_path, tokenizer, name):
    path = tmp_path / name
    path.write_text("hello\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.t[xs][tv]'; use .json, .jsonl, .csv or .parquet"):
        load(path, tokenizer)


def test_unreachable_hub_dataset(tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="could not load the dataset no-such-org/no-such-data.*HF_TOKEN"):
        load("no-such-org/no-such-data", tokenizer)


def test_unknown_builtin_lists_the_known_ones(tokenizer):
    with pytest.raises(DataError, match="unknown builtin dataset 'builtin:nope'; available: builtin:demo-facts"):
        load("builtin:nope", tokenizer)


def test_broken_json_line_is_named(tmp_path, tokenizer):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "fine"}\n{"text": oops}\n{"text": "fine"}\n')
    with pytest.raises(DataError, match=r"broken.jsonl: cannot be read as jsonl: line 2 is not valid JSON"):
        load(path, tokenizer)


def test_dataset_folder_loads_like_a_hub_repo_with_split(tmp_path, tokenizer):
    # A local folder goes through the same load_dataset(path, subset, split=...) call as a Hub id.
    (tmp_path / "repo").mkdir()
    write_rows(tmp_path / "repo" / "train.jsonl", ROWS["text"])
    write_rows(tmp_path / "repo" / "test.jsonl", [{"text": "held out"}])
    assert load(tmp_path / "repo", tokenizer, split="test").train["text"] == ["held out"]
    with pytest.raises(DataError, match="could not load the dataset .*split validation.*Unknown split"):
        load(tmp_path / "repo", tokenizer, split="validation")
    bundle = load(tmp_path / "repo", tokenizer, eval_path=str(tmp_path / "repo"))
    assert bundle.eval["text"] == ["held out"]


# ---------------------------------------------------------------------------------------------
# Row validation: every message names the file, the 1-based row and the problem.

USER = {"role": "user", "content": "hi"}
ASSISTANT = {"role": "assistant", "content": "yo"}
MALFORMED = [
    ("messages", {"messages": None}, "'messages' is missing or null"),
    ("messages", {"messages": []}, "'messages' must be a non-empty list of turns"),
    (
        "messages",
        {"messages": [{"role": "bot", "content": "hi"}, ASSISTANT]},
        "messages[0].role is 'bot'; allowed: system, user, assistant, tool",
    ),
    ("messages", {"messages": [{"content": "hi"}, ASSISTANT]}, "messages[0] has no 'role'"),
    ("messages", {"messages": [USER, {"role": "assistant", "content": "  "}]}, "messages[1]: 'content' is empty"),
    (
        "messages",
        {"messages": [USER, {"role": "assistant", "content": 5}]},
        "messages[1]: 'content' must be a string, got int",
    ),
    ("messages", {"messages": [USER]}, "'messages' has no assistant turn"),
    (
        "messages",
        {"messages": [USER, ASSISTANT, USER]},
        "'messages' ends with a user turn after the last assistant turn",
    ),
    (
        "sharegpt",
        {"conversations": [{"from": "robot", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
        "conversations[0].from is 'robot'; allowed: system, human, user, gpt",
    ),
    (
        "sharegpt",
        {"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "yo"}]},
        "conversations[0]: 'value' is empty",
    ),
    (
        "sharegpt",
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ["yo"]}]},
        "conversations[1]: 'value' must be a string, got list",
    ),
    ("sharegpt", {"conversations": [{"from": "human", "value": "hi"}]}, "'conversations' has no assistant turn"),
    ("alpaca", {"instruction": "a", "input": "", "output": None}, "'output' is missing or null"),
    ("alpaca", {"instruction": " ", "input": "", "output": "b"}, "'instruction' is empty"),
    ("alpaca", {"instruction": "a", "input": "", "output": 42}, "'output' must be a string, got int"),
    ("alpaca", {"instruction": "a", "input": ["x"], "output": "b"}, "'input' must be a string, got list"),
    ("prompt_completion", {"prompt": "a", "completion": ""}, "'completion' is empty"),
    ("prompt_completion", {"prompt": None, "completion": "b"}, "'prompt' is missing or null"),
    ("prompt_completion", {"prompt": 3.5, "completion": "b"}, "'prompt' must be a string, got float"),
    ("text", {"text": ""}, "'text' is empty"),
    ("text", {"text": None}, "'text' is missing or null"),
    ("text", {"text": {"a": 1}}, "'text' must be a string, got dict"),
]


@pytest.mark.parametrize(("fmt", "bad", "expected"), MALFORMED, ids=[f"{m[0]}-{m[2][:30]}" for m in MALFORMED])
def test_bad_row_is_reported_with_file_row_and_problem(tmp_path, tokenizer, fmt, bad, expected):
    path = write_rows(tmp_path / "bad.jsonl", ROWS[fmt] + [bad])
    with pytest.raises(DataError) as info:
        load(path, tokenizer, format=fmt)
    message = str(info.value)
    assert str(path) in message
    assert f"row 3 (line 3): {expected}" in message
    assert "1 problem(s)" in message


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_mixed_types_in_a_json_field_blame_only_the_bad_row(tmp_path, tokenizer, suffix):
    # datasets reads the string "4" back as the number 4 once a field mixes types; row 2 is fine.
    rows = [
        {"instruction": "a", "output": "b"},
        {"instruction": "a", "output": "4"},
        {"instruction": "a", "output": 42},
    ]
    with pytest.raises(DataError) as info:
        load(write_rows(tmp_path / f"mixed{suffix}", rows), tokenizer)
    assert "1 problem(s)" in str(info.value) and "row 3" in str(info.value) and "got int 42" in str(info.value)


def test_csv_rows_count_from_the_first_data_line(tmp_path, tokenizer):
    path = write_rows(tmp_path / "bad.csv", ROWS["alpaca"] + [{"instruction": "a", "input": "", "output": ""}])
    with pytest.raises(DataError, match=r"bad.csv: 1 problem.*\n  - row 3 \(line 4, after the header\): 'output' is"):
        load(path, tokenizer)


def test_csv_chat_cell_with_bad_json(tmp_path, tokenizer):
    path = tmp_path / "chat.csv"
    path.write_text(
        'messages\n"[{""role"": ""user"", ""content"": ""hi""}, {""role"": ""assistant"", ""content"": ""yo""}]"\n'
        "not json\n"
    )
    with pytest.raises(DataError, match=r"row 2 \(line 3, after the header\): 'messages' is a string but not valid"):
        load(path, tokenizer)


def test_up_to_ten_problems_are_reported_with_the_total(tmp_path, tokenizer):
    rows = ROWS["text"] + [{"text": ""}] * 15
    with pytest.raises(DataError) as info:
        load(write_rows(tmp_path / "many.jsonl", rows), tokenizer)
    message = str(info.value)
    assert "15 problem(s) in text rows (showing the first 10)" in message
    assert "row 3 (line 3)" in message and "row 12 (line 12)" in message
    assert "row 13 " not in message


# ---------------------------------------------------------------------------------------------
# Eval split and max_samples


def test_eval_fraction_is_a_seeded_disjoint_split(tmp_path, tokenizer):
    rows = [{"text": f"row number {i}"} for i in range(20)]
    path = write_rows(tmp_path / "t.jsonl", rows)
    a = load(path, tokenizer, seed=1, eval_fraction=0.25)
    assert (len(a.train), len(a.eval)) == (15, 5)
    assert sorted(list(a.train["text"]) + list(a.eval["text"])) == sorted(r["text"] for r in rows)
    assert list(load(path, tokenizer, seed=1, eval_fraction=0.25).eval["text"]) == list(a.eval["text"])
    assert list(load(path, tokenizer, seed=2, eval_fraction=0.25).eval["text"]) != list(a.eval["text"])


def test_eval_fraction_too_large_for_the_data(tmp_path, tokenizer):
    path = write_rows(tmp_path / "t.jsonl", [{"text": "only row"}])
    with pytest.raises(DataError, match="leaves nothing to train on"):
        load(path, tokenizer, eval_fraction=0.5)


def test_eval_path_must_match_the_training_format(tmp_path, tokenizer):
    train = write_rows(tmp_path / "train.jsonl", ROWS["text"])
    good = write_rows(tmp_path / "eval.jsonl", [{"text": "eval row"}])
    assert load(train, tokenizer, eval_path=str(good)).eval["text"] == ["eval row"]
    other = write_rows(tmp_path / "eval2.jsonl", ROWS["alpaca"])
    with pytest.raises(DataError, match="eval2.jsonl is in alpaca format but the training data is text"):
        load(train, tokenizer, eval_path=str(other))
    with pytest.raises(ValidationError, match="set data.eval_path or data.eval_fraction, not both"):
        load(train, tokenizer, eval_path=str(good), eval_fraction=0.1)


def test_max_samples_keeps_the_first_rows_and_skips_checking_the_rest(tmp_path, tokenizer):
    rows = [{"text": f"row {i}"} for i in range(5)] + [{"text": ""}]
    path = write_rows(tmp_path / "t.jsonl", rows)
    assert load(path, tokenizer, max_samples=3).train["text"] == ["row 0", "row 1", "row 2"]
    bundle = load(write_rows(tmp_path / "ok.jsonl", rows[:5]), tokenizer, max_samples=50)
    assert len(bundle.train) == 5 and "has only 5 rows" in bundle.notes[0]


# ---------------------------------------------------------------------------------------------
# Chat templates and loss masks


def assistant_pieces(tokenizer, template, messages):
    out = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    pieces, current = [], []
    for token, bit in zip(out["input_ids"], out["assistant_masks"], strict=True):
        if bit:
            current.append(token)
        elif current:
            pieces.append(tokenizer.decode(current))
            current = []
    return pieces + ([tokenizer.decode(current)] if current else [])


CHAT = [
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "the quick fox"},
    {"role": "user", "content": "and then?"},
    {"role": "assistant", "content": "the lazy dog"},
]


def test_marked_template_is_used_as_is(tokenizer):
    assert training_chat_template(tokenizer) == CHATML_TEMPLATE
    assert assistant_pieces(tokenizer, CHATML_TEMPLATE, CHAT) == ["the quick fox<|im_end|>", "the lazy dog<|im_end|>"]


def test_smollm2_template_gets_a_marked_chatml_copy_that_renders_the_same(smol_tokenizer):
    template = training_chat_template(smol_tokenizer)
    assert template is not None and "{% generation %}" in template
    for messages in (CHAT, [{"role": "system", "content": "custom"}] + CHAT):
        original = smol_tokenizer.apply_chat_template(messages, tokenize=False)
        assert smol_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False) == original
    assert "named SmolLM" in smol_tokenizer.apply_chat_template(CHAT, chat_template=template, tokenize=False)
    assert assistant_pieces(smol_tokenizer, template, CHAT) == ["the quick fox<|im_end|>", "the lazy dog<|im_end|>"]


def test_chatml_copy_keeps_a_non_ascii_default_system_prompt(tokenizer):
    tok = make_tokenizer()
    tok.chat_template = SMOLLM2_TEMPLATE.replace("You are a helpful AI assistant", 'Tu es «Élise», une "assistante"')
    template = training_chat_template(tok)
    assert template is not None
    assert tok.apply_chat_template(CHAT, chat_template=template, tokenize=False) == tok.apply_chat_template(
        CHAT, tokenize=False
    )


def test_template_known_to_trl_gets_trls_patched_copy():
    from trl.chat_template_utils import qwen2_5_chat_template, qwen2_5_training_chat_template

    tok = make_tokenizer()
    tok.chat_template = qwen2_5_chat_template
    assert training_chat_template(tok) == qwen2_5_training_chat_template


def test_unknown_template_gives_none_and_the_bundle_trains_the_last_turn_with_a_warning(tmp_path):
    tok = make_tokenizer()
    tok.chat_template = PLAIN_TEMPLATE
    assert training_chat_template(tok) is None
    assert chatml_training_template(None) != PLAIN_TEMPLATE
    bundle = load(write_rows(tmp_path / "c.jsonl", [{"messages": CHAT}]), tok)
    assert bundle.loss == "completion_only" and bundle.chat_template is None
    assert bundle.train[0] == {"prompt": CHAT[:3], "completion": CHAT[3:]}
    assert any(
        "WARNING" in note and "LAST assistant turn" in note and "1 multi-turn row" in note for note in bundle.notes
    )


def test_chat_data_needs_a_chat_template(tmp_path):
    tok = make_tokenizer()
    tok.chat_template = None
    with pytest.raises(DataError, match="this tokenizer has none"):
        load(write_rows(tmp_path / "c.jsonl", ROWS["messages"]), tok)
    assert load(write_rows(tmp_path / "t.jsonl", ROWS["text"]), tok).loss == "all"


def test_loss_choice_follows_completion_only_loss(tmp_path, smol_tokenizer):
    chat = write_rows(tmp_path / "c.jsonl", ROWS["messages"])
    assistant_only = load(chat, smol_tokenizer)
    assert assistant_only.loss == "assistant_only" and "{% generation %}" in assistant_only.chat_template
    everything = load(chat, smol_tokenizer, completion_only_loss=False)
    assert everything.loss == "all" and everything.chat_template is None and "messages" in everything.train.column_names
    text = load(write_rows(tmp_path / "t.jsonl", ROWS["text"]), smol_tokenizer)
    assert text.loss == "all" and "every token" in text.notes[0]


# ---------------------------------------------------------------------------------------------
# Preview


def test_preview_shows_the_templated_text_and_marks_the_trained_parts(tmp_path, smol_tokenizer):
    cfg = DataSection(path=str(write_rows(tmp_path / "c.jsonl", [{"messages": CHAT}] + ROWS["messages"])))
    examples = preview_examples(cfg, smol_tokenizer, n=2)
    assert [e.row for e in examples] == [1, 2]
    first = examples[0]
    assert first.text == smol_tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert "".join(text for text, _ in first.segments) == first.text
    assert [text for text, trained in first.segments if trained] == [
        "the quick fox<|im_end|>",
        "the lazy dog<|im_end|>",
    ]
    assert first.num_trained_tokens == len(smol_tokenizer("the quick fox<|im_end|>the lazy dog<|im_end|>")["input_ids"])


def test_preview_of_completion_only_and_truncation(tmp_path, tokenizer):
    cfg = DataSection(path=str(write_rows(tmp_path / "a.jsonl", ROWS["alpaca"])))
    (example,) = preview_examples(cfg, tokenizer, n=1)
    assert [text for text, trained in example.segments if trained] == ["the sky.<|im_end|>\n"]
    (short,) = preview_examples(cfg, tokenizer, n=1, max_length=5)
    assert short.truncated and short.num_tokens == 5 and short.num_trained_tokens == 0


# ---------------------------------------------------------------------------------------------
# SFTTrainer end to end: TRL's own tokenization gives the labels the bundle promises (and the preview shows).

E2E_CASES = {
    "messages-assistant-only": (CHATML_TEMPLATE, "messages", {}, ["the quick fox<|im_end|>", "the lazy dog<|im_end|>"]),
    "messages-smollm2": (SMOLLM2_TEMPLATE, "messages", {}, ["the quick fox<|im_end|>", "the lazy dog<|im_end|>"]),
    # The prompt ends in a space that BPE merges into the completion's first token: TRL trains from that token.
    "messages-fallback-last-turn": (PLAIN_TEMPLATE, "messages", {}, [" the lazy dog\n"]),
    "messages-all-tokens": (CHATML_TEMPLATE, "messages", {"completion_only_loss": False}, None),
    "alpaca": (CHATML_TEMPLATE, "alpaca", {}, ["the sky.<|im_end|>\n"]),
    "prompt-completion": (CHATML_TEMPLATE, "prompt_completion", {}, [" the sky.<|im_end|>"]),
    "text": (CHATML_TEMPLATE, "text", {}, None),
}


@pytest.mark.parametrize("case", list(E2E_CASES))
def test_sft_trainer_masks_labels_as_the_bundle_says(tmp_path, tiny_model_dir, case):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from finetune_app.config import RunConfig
    from finetune_app.translate import to_sft_config

    template, fmt, fields, trained_first = E2E_CASES[case]
    rows = [{"messages": CHAT}] if fmt == "messages" else ROWS[fmt][:1]
    cfg = DataSection(path=str(write_rows(tmp_path / "d.jsonl", rows)), **fields)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = template
    bundle = load_training_data(cfg, tokenizer, seed=0)
    if bundle.chat_template:
        tokenizer.chat_template = bundle.chat_template

    run_cfg = RunConfig(data=cfg, model={"dtype": "float32"}, training={"max_length": 256})
    args = to_sft_config(run_cfg, tmp_path / "out", on_cuda=False, loss=bundle.loss, has_eval=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = SFTTrainer(model=model, args=args, train_dataset=bundle.train, processing_class=tokenizer)
    prepared = trainer.train_dataset[0]

    assert (prepared["input_ids"], prepared["labels"]) == tokenize_like_sft(bundle.train[0], tokenizer, bundle)
    trained = [t for t, label in zip(prepared["input_ids"], prepared["labels"], strict=True) if label != -100]
    if trained_first is None:
        assert prepared["labels"] == prepared["input_ids"]
    else:
        assert tokenizer.decode(trained) == "".join(trained_first)
        assert preview_bundle(bundle, tokenizer, 1)[0].num_trained_tokens == len(trained)


# ---------------------------------------------------------------------------------------------
# Demo dataset


def test_demo_dataset_loads_and_heldout_questions_are_new(smol_tokenizer):
    bundle = load_training_data(DataSection(), smol_tokenizer, seed=0)
    assert bundle.format == "messages" and bundle.loss == "assistant_only"
    assert 60 <= len(bundle.train) <= 90
    questions = {row["messages"][0]["content"] for row in bundle.train}
    answers = {row["messages"][-1]["content"] for row in bundle.train}
    heldout = demo_heldout_questions()
    assert len(heldout) >= 8
    for item in heldout:
        assert item["question"] not in questions
        # Every keyword is taught by the training answers.
        assert any(item["keyword"] in answer for answer in answers), item
    assert len(answers) == len({item["keyword"] for item in heldout})  # one consistent answer per fact


def test_empty_file_is_reported(tmp_path, tokenizer):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match="empty.jsonl is empty"):
        load(path, tokenizer)


def test_importing_the_data_module_stays_cheap():
    import subprocess
    import sys

    code = "import sys, finetune_app.data; print(sorted(m for m in ('torch', 'datasets', 'trl') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
