"""A run started from the page: followed to the end with a loss curve, or stopped with a saved adapter.

The page launches the real headless command (`python -m finetune_app train ...`) on the tiny test model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import open_app

pytestmark = pytest.mark.browser


def tiny_preset(model_dir: Path, data_file: Path, max_steps: int, save_steps: int) -> str:
    return (
        f"model: {{name_or_path: '{model_dir}', dtype: float32}}\n"
        "quantization: {load_in: none, double_quant: false}\n"
        f"data: {{path: '{data_file}'}}\n"
        f"training: {{max_steps: {max_steps}, micro_batch_size: 2, max_length: 64, logging_steps: 1, "
        f"save_steps: {save_steps}}}\n"
    )


@pytest.fixture
def tiny_data(tmp_path) -> Path:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"what is {i} plus {i}?"},
                {"role": "assistant", "content": str(2 * i)},
            ]
        }
        for i in range(16)
    ]
    path = tmp_path / "tiny-data.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def load_preset(page, name: str) -> None:
    page.locator("#preset-pick input").click()
    page.get_by_role("option", name=name, exact=True).click()
    page.locator("#preset-load").click()
    page.locator("#preset-message").get_by_text(f"Loaded preset {name}").wait_for(timeout=10_000)


def start_run(page) -> None:
    page.get_by_role("tab", name="3 · Train").click()
    page.locator("#start-btn").click()
    page.locator("#train-message").get_by_text("Started").wait_for(timeout=20_000)


def run_state(page, state: str, timeout: float) -> None:
    page.locator(f"#run-status[data-state={state}]").wait_for(timeout=timeout)


def only_run_dir(server) -> Path:
    runs = [path for path in (server.root / "runs").iterdir() if path.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_demo_run_from_the_page_reaches_the_end(make_server, page, tiny_model_dir, tiny_data):
    server = make_server({"tiny": tiny_preset(tiny_model_dir, tiny_data, max_steps=3, save_steps=100)})
    open_app(page, server)
    load_preset(page, "tiny")
    assert page.locator("#field-model-name_or_path input, #field-model-name_or_path textarea").input_value() == str(
        tiny_model_dir
    )
    start_run(page)
    run_state(page, "completed", timeout=240_000)

    # The loss curve is drawn: three training points reached the plot.
    page.locator("#loss-plot img").first.wait_for(timeout=10_000)
    assert "3 / 3" in page.locator("#run-stats").inner_text()
    run_dir = only_run_dir(server)
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert str(run_dir / "adapter") in page.locator("#run-status").inner_text()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "log" for e in events) == 3
    assert page.locator("#log-tail textarea").input_value().strip() != ""


def test_stop_from_the_page_saves_the_adapter(make_server, page, browser, tiny_model_dir, tiny_data):
    server = make_server({"long": tiny_preset(tiny_model_dir, tiny_data, max_steps=5000, save_steps=10_000)})
    open_app(page, server)
    load_preset(page, "long")
    start_run(page)
    run_state(page, "running", timeout=60_000)
    page.wait_for_function(  # at least one optimizer step logged
        "() => /step [1-9][0-9]* \\//.test(document.querySelector('#run-status .run-step')?.textContent || '')",
        timeout=240_000,
    )

    # A second tab (or a reload) finds the same running job.
    other = browser.new_context().new_page()
    open_app(other, server)
    other.get_by_role("tab", name="3 · Train").click()
    run_state(other, "running", timeout=10_000)
    assert other.locator("#start-btn").is_disabled()
    other.context.close()

    page.locator("#stop-btn").click()
    run_state(page, "stopped", timeout=120_000)
    run_dir = only_run_dir(server)
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    end = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()][-1]
    assert end["event"] == "end" and end["status"] == "stopped"
    assert "saved" in page.locator("#run-status").inner_text()
