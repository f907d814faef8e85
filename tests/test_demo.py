"""The README's first command on the real demo model (SmolLM2-135M-Instruct, 4-bit NF4 + double quant, CPU).

Slow (a few minutes on two CPU cores): it trains the demo preset to the end, then checks that the
adapter loads back onto the base and moves the greedy answers to held-out questions towards the facts
it taught.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from finetune_app.config import load_config
from finetune_app.data import demo_heldout_questions
from finetune_app.events import read_events

ROOT = Path(__file__).parent.parent
PRESET = ROOT / "presets" / "demo-smollm2-135m.yaml"


def keyword_hits(model, tokenizer, questions) -> tuple[int, list[str]]:
    from finetune_app.inference import greedy_answer

    answers = [greedy_answer(model, tokenizer, q["question"], max_new_tokens=24) for q in questions]
    hits = sum(q["keyword"].lower() in a.lower() for q, a in zip(questions, answers, strict=True))
    return hits, answers


@pytest.mark.slow
def test_demo_preset_teaches_the_heldout_facts(tmp_path):
    run_dir = tmp_path / "demo-run"
    result = subprocess.run(
        [sys.executable, "launcher.py", "--preset", str(PRESET), "--run-dir", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = read_events(run_dir)
    assert events[-1]["event"] == "end" and events[-1]["status"] == "completed"
    losses = [e["loss"] for e in events if e["event"] == "log"]
    assert len(losses) >= 10
    assert sum(losses[-3:]) / 3 < losses[0] / 3, losses  # the loss fell

    from finetune_app.inference import load_for_inference

    cfg = load_config(run_dir / "config.yaml")
    questions = demo_heldout_questions()
    base, tokenizer = load_for_inference(cfg)
    base_hits, base_answers = keyword_hits(base, tokenizer, questions)
    del base
    tuned, tokenizer = load_for_inference(cfg, run_dir / "adapter")
    tuned_hits, tuned_answers = keyword_hits(tuned, tokenizer, questions)
    report = "\n".join(
        f"{q['question']!r}: base={b!r} tuned={t!r}"
        for q, b, t in zip(questions, base_answers, tuned_answers, strict=True)
    )
    assert tuned_hits >= len(questions) // 2, report
    assert tuned_hits >= base_hits + len(questions) // 3, report
