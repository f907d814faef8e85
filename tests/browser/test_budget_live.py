"""The memory budget follows the settings live, in the direction the estimator predicts."""

from __future__ import annotations

import os

import pytest

from finetune_app.config import RunConfig, build_config
from finetune_app.memory.estimator import estimate_memory
from finetune_app.memory.shape import load_model_shape

from .conftest import open_app

pytestmark = pytest.mark.browser
# "Within a second" on an idle machine; FINETUNE_APP_BROWSER_SLOWDOWN scales it on a loaded CI box.
UPDATE_MS = 1000 * float(os.environ.get("FINETUNE_APP_BROWSER_SLOWDOWN", "1"))


def shown_total(page) -> int:
    return int(page.locator("#budget-total").get_attribute("data-bytes"))


def wait_for_new_total(page, before: int) -> int:
    page.wait_for_function(
        "before => { const e = document.querySelector('#budget-total');"
        " return e && e.dataset.bytes && Number(e.dataset.bytes) !== before; }",
        arg=before,
        timeout=UPDATE_MS,
    )
    return shown_total(page)


def expected_direction(changes: dict) -> int:
    base = RunConfig()
    shape = load_model_shape(base.model.name_or_path)
    data = base.model_dump(mode="json")
    for key, value in changes.items():
        section, name = key.split(".")
        data[section][name] = value
    before = estimate_memory(base, shape).total
    after = estimate_memory(build_config(data), shape).total
    assert after != before, f"{changes} does not change the estimate: nothing to test"
    return 1 if after > before else -1


def open_section(page, section: str) -> None:
    header = page.locator(f"#section-{section} > button").first
    if header.get_attribute("aria-expanded") != "true":
        header.click()


def test_budget_follows_4bit_checkpointing_and_rank(make_server, page):
    server = make_server()  # no presets: the RunConfig defaults
    open_app(page, server)
    assert page.locator("#budget-verdict").get_attribute("data-verdict") in ("fits", "tight", "does_not_fit")

    # 4-bit -> none (double_quant follows automatically, so the config stays valid)
    open_section(page, "quantization")
    total = shown_total(page)
    page.locator("#field-quantization-load_in input").click()
    page.get_by_role("option", name="none", exact=True).click()
    new_total = wait_for_new_total(page, total)
    assert (new_total - total) * expected_direction(
        {"quantization.load_in": "none", "quantization.double_quant": False}
    ) > 0
    assert page.locator("#config-errors").inner_text().strip() == ""

    # gradient checkpointing off
    open_section(page, "memory")
    total = new_total
    page.locator("#field-memory-gradient_checkpointing input[type=checkbox]").click()
    new_total = wait_for_new_total(page, total)
    assert (new_total - total) * expected_direction({"memory.gradient_checkpointing": False}) > 0

    # LoRA rank 16 -> 256
    open_section(page, "lora")
    total = new_total
    page.locator("#field-lora-r input").fill("256")
    new_total = wait_for_new_total(page, total)
    assert (new_total - total) * expected_direction({"lora.r": 256}) > 0


def test_invalid_settings_are_shown_inline(make_server, page):
    open_app(page, make_server())
    open_section(page, "distributed")
    page.locator("#field-distributed-num_processes input").fill("2")
    page.locator("#config-errors").get_by_text("num_processes > 1 needs distributed.strategy=ddp or fsdp").wait_for(
        timeout=5000
    )
