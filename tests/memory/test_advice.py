"""Verdicts, suggestions and fit_to_gpu: every proposed config is valid and really fits per the estimator."""

from __future__ import annotations

import pytest

from finetune_app.config import RunConfig, build_config
from finetune_app.memory.advice import (
    FIT_MARGIN,
    fit_to_gpu,
    largest_max_length,
    largest_micro_batch_size,
    suggestions,
    verdict,
    with_overrides,
)
from finetune_app.memory.estimator import GiB, estimate_memory
from finetune_app.memory.shape import KNOWN_CONFIGS, shape_from_config

# Llama-3.1-8B's published config.
LLAMA8B = shape_from_config(KNOWN_CONFIGS["meta-llama/Llama-3.1-8B-Instruct"])
HEAVY = [
    "training.micro_batch_size=8",
    "training.max_length=4096",
    "memory.gradient_checkpointing=false",
    "memory.attention=eager",
    "quantization.double_quant=false",
]


def test_verdict_thresholds():
    e = estimate_memory(build_config({}), LLAMA8B)
    assert verdict(e, int(e.total / (1 - FIT_MARGIN)) + 1).status == "fits"
    assert verdict(e, e.total).status == "tight"
    assert verdict(e, e.total - 1).status == "does_not_fit"


def test_suggestions_each_save_memory_and_are_valid():
    cfg = build_config({}, HEAVY)
    found = suggestions(cfg, LLAMA8B)
    titles = [s.title for s in found]
    assert any("gradient checkpointing" in t for t in titles)
    assert any("SDPA" in t for t in titles)
    base = estimate_memory(cfg, LLAMA8B).total
    for s in found:
        changed = with_overrides(cfg, s.overrides)
        assert estimate_memory(changed, LLAMA8B).total == base - s.saving
        assert s.saving > 0


def test_smaller_micro_batch_keeps_effective_batch():
    cfg = build_config({}, HEAVY + ["training.gradient_accumulation_steps=2"])
    for s in suggestions(cfg, LLAMA8B):
        if s.title.startswith("micro-batch"):
            t = with_overrides(cfg, s.overrides).training
            assert t.micro_batch_size * t.gradient_accumulation_steps == 16


@pytest.mark.parametrize("gpu_gib", [24, 16, 12])
def test_fit_to_gpu_returns_a_config_that_fits(gpu_gib):
    cfg = build_config({}, HEAVY)
    result = fit_to_gpu(cfg, LLAMA8B, gpu_gib * GiB)
    assert isinstance(result.config, RunConfig)
    assert result.verdict.fits
    assert verdict(estimate_memory(result.config, LLAMA8B), gpu_gib * GiB).fits
    assert result.applied  # something had to change
    # Free changes come first.
    assert result.applied[0].overrides == ("memory.attention=sdpa",)


def test_fit_to_gpu_leaves_a_fitting_config_alone():
    cfg = build_config({})
    result = fit_to_gpu(cfg, LLAMA8B, 80 * GiB)
    assert result.config == cfg and result.applied == ()


def test_largest_max_length_is_the_boundary():
    cfg = build_config({}, ["memory.attention=sdpa"])
    gpu = 12 * GiB
    n = largest_max_length(cfg, LLAMA8B, gpu)
    assert n is not None
    assert verdict(estimate_memory(with_overrides(cfg, [f"training.max_length={n}"]), LLAMA8B), gpu).fits
    assert not verdict(estimate_memory(with_overrides(cfg, [f"training.max_length={n + 1}"]), LLAMA8B), gpu).fits


def test_largest_micro_batch_size_and_none_when_hopeless():
    cfg = build_config({})
    b = largest_micro_batch_size(cfg, LLAMA8B, 24 * GiB)
    assert b is not None and b >= 1
    assert largest_micro_batch_size(cfg, LLAMA8B, 2 * GiB) is None
