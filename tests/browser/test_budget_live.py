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


def expected_direction(before: dict, after: dict) -> int:
    """+1 if the estimator says the settings `after` need more memory than `before`, else -1."""
    base = RunConfig()
    shape = load_model_shape(base.model.name_or_path)

    def total(changes: dict) -> int:
        data = base.model_dump(mode="json")
        for key, value in changes.items():
            section, name = key.split(".")
            data[section][name] = value
        return estimate_memory(build_config(data), shape).total

    assert total(after) != total(before), f"{before} -> {after} does not change the estimate: nothing to test"
    return 1 if total(after) > total(before) else -1


def open_section(page, section: str) -> None:
    header = page.locator(f"#section-{section} > button").first
    if header.get_attribute("aria-expanded") != "true":
        header.click()


def test_budget_follows_4bit_checkpointing_and_rank(default_server, page):
    open_app(page, default_server)
    assert page.locator("#budget-verdict").get_attribute("data-verdict") in ("fits", "tight", "does_not_fit")
    changes: dict = {}

    def step(new: dict) -> tuple[dict, dict]:
        before = dict(changes)
        changes.update(new)
        return before, dict(changes)

    # 4-bit -> none (double_quant follows automatically, so the config stays valid)
    open_section(page, "quantization")
    total = shown_total(page)
    page.locator("#field-quantization-load_in input").click()
    page.get_by_role("option", name="none", exact=True).click()
    new_total = wait_for_new_total(page, total)
    direction = expected_direction(*step({"quantization.load_in": "none", "quantization.double_quant": False}))
    assert (new_total - total) * direction > 0
    assert not page.locator("#field-quantization-double_quant input[type=checkbox]").is_checked()
    assert page.locator("#config-errors").inner_text().strip() == ""

    # gradient checkpointing off
    open_section(page, "memory")
    total = new_total
    page.locator("#field-memory-gradient_checkpointing input[type=checkbox]").click()
    new_total = wait_for_new_total(page, total)
    assert (new_total - total) * expected_direction(*step({"memory.gradient_checkpointing": False})) > 0

    # LoRA rank 16 -> 256
    open_section(page, "lora")
    total = new_total
    page.locator("#field-lora-r input").fill("256")
    new_total = wait_for_new_total(page, total)
    assert (new_total - total) * expected_direction(*step({"lora.r": 256})) > 0


def test_invalid_settings_are_shown_inline(default_server, page):
    open_app(page, default_server)
    open_section(page, "distributed")
    page.locator("#field-distributed-num_processes input").fill("2")
    page.locator("#config-errors").get_by_text("num_processes > 1 needs distributed.strategy=ddp or fsdp").wait_for(
        timeout=5000
    )
    page.get_by_role("tab", name="3 · Train").click()
    page.locator("#start-btn").click()
    page.locator("#train-message").get_by_text("Cannot start").wait_for(timeout=5000)


def test_planning_for_a_catalogue_gpu_changes_the_verdict(default_server, page):
    open_app(page, default_server)
    page.get_by_role("tab", name="1 · Hardware").click()
    assert "No NVIDIA GPU" in page.locator("#hardware-info").inner_text()  # CI has no GPU
    page.get_by_role("tab", name="2 · Configure").click()
    open_section(page, "training")
    page.locator("#field-training-max_length input").fill("16384")
    open_section(page, "memory")
    page.locator("#field-memory-gradient_checkpointing input[type=checkbox]").click()
    page.locator("#budget-verdict[data-verdict=does_not_fit]").wait_for(timeout=5000)
    page.get_by_role("tab", name="1 · Hardware").click()
    page.locator("#target-gpu input").click()
    page.get_by_role("option", name="H200", exact=True).click()
    page.get_by_role("tab", name="2 · Configure").click()
    page.locator("#budget-verdict[data-verdict=fits]").wait_for(timeout=5000)
    assert "H200" in page.locator("#budget-panel").inner_text()
