"""Hardware detection on whatever this machine has, and the planning catalogue."""

from __future__ import annotations

import pytest

from finetune_app.config import build_config
from finetune_app.hardware import GPU_CATALOGUE, GPUInfo, HardwareInfo, catalogue_gpu, detect_hardware


def test_detect_hardware_never_raises():
    info = detect_hardware()
    assert isinstance(info, HardwareInfo)
    assert all(isinstance(g, GPUInfo) for g in info.gpus)
    assert info.cpu_ram_total > 0


def test_no_gpu_means_empty_list():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert detect_hardware().gpus == []


def test_catalogue_capabilities():
    assert not catalogue_gpu("T4").bf16
    assert catalogue_gpu("rtx4090").bf16 and catalogue_gpu("rtx-4090").flash_attention_capable
    assert catalogue_gpu("H200").total_bytes == 141 * 10**9
    assert catalogue_gpu("a100 80gb").compute_capability == (8, 0)
    with pytest.raises(KeyError, match="catalogue"):
        catalogue_gpu("Voodoo 2")
    assert len(GPU_CATALOGUE) == 12


def test_catalogue_gpus_feed_the_config_hardware_check():
    from finetune_app.config import ConfigError

    with pytest.raises(ConfigError, match="float16"):
        build_config({}, gpus=[catalogue_gpu("T4")])
    assert build_config({}, ["model.dtype=float16"], gpus=[catalogue_gpu("T4")]).model.dtype == "float16"
