"""Pick the attention kernel the run can really use, and say why when it differs from the request.

Pure: callers pass what they know about the machine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str  # what transformers gets as attn_implementation
    reason: str | None  # why it differs from the request (None when it does not)


def choose_attention(
    requested: str, *, on_cuda: bool, flash_installed: bool, gpu_supports_flash: bool, dtype: str
) -> AttentionChoice:
    if requested in ("sdpa", "eager"):
        return AttentionChoice(requested, None)
    problem = _flash_problem(on_cuda, flash_installed, gpu_supports_flash, dtype)
    if problem is None:
        return AttentionChoice("flash_attention_2", None)
    if requested == "auto":
        return AttentionChoice("sdpa", f"attention auto -> sdpa: {problem}")
    return AttentionChoice("sdpa", f"flash_attention_2 unavailable, falling back to sdpa: {problem}")


def _flash_problem(on_cuda: bool, installed: bool, gpu_ok: bool, dtype: str) -> str | None:
    if not on_cuda:
        return "FlashAttention-2 needs an NVIDIA GPU and this run is on CPU"
    if not gpu_ok:
        return "FlashAttention-2 needs an Ampere or newer GPU (compute capability 8.0+)"
    if not installed:
        return "the flash-attn package is not installed (pip install 'finetune_app[flash]')"
    if dtype == "float32":
        return "FlashAttention-2 runs in float16/bfloat16 only and model.dtype is float32"
    return None
