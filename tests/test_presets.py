"""Every preset in presets/ is a valid RunConfig, stored as an exact dump of it (after a comment header)."""

from pathlib import Path

import pytest

from finetune_app.config import dump_yaml, load_config

PRESETS = sorted((Path(__file__).parent.parent / "presets").glob("*.yaml"))


def test_there_are_presets():
    names = {p.stem for p in PRESETS}
    assert "demo-smollm2-135m" in names
    assert len(names) >= 5


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_is_valid_and_an_exact_dump(preset):
    cfg = load_config(preset)
    body = "".join(line for line in preset.read_text().splitlines(keepends=True) if not line.startswith("#"))
    assert dump_yaml(cfg) == body


def test_demo_preset_is_offline_qlora():
    cfg = load_config(Path(__file__).parent.parent / "presets" / "demo-smollm2-135m.yaml")
    assert cfg.model.name_or_path.startswith("demo:")
    assert cfg.data.path.startswith("builtin:")
    assert cfg.quantization.load_in == "4bit" and cfg.quantization.quant_type == "nf4"
    assert cfg.quantization.double_quant
