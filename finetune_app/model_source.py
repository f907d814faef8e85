"""Turn `model.name_or_path` into something `from_pretrained` can load.

A Hub id stays a Hub id (downloaded by transformers as usual); a local folder is used as it is; a GGUF
file (local, or `gguf_file` inside a Hub repo) is converted once into a cached safetensors folder; the
demo sentinel resolves to the demo model's cached folder.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_dir
from .config import DEMO_MODEL, ModelSection
from .paths import cache_dir

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


class ModelSourceError(ValueError):
    pass


@dataclass(frozen=True)
class ResolvedModel:
    path: str  # a local folder or a Hub id
    revision: str | None
    kind: str  # "demo" | "local" | "gguf" | "hub"

    @property
    def is_local(self) -> bool:
        return self.kind != "hub"


def resolve_model(section: ModelSection, log=print) -> ResolvedModel:
    name = section.name_or_path.strip()
    if name == DEMO_MODEL:
        from .demo_model import ensure_demo_model

        return ResolvedModel(str(ensure_demo_model(log)), None, "demo")
    local = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not local.is_file():
            raise ModelSourceError(f"model.name_or_path: GGUF file not found: {local}")
        return ResolvedModel(str(_cached_gguf_conversion(local.parent, local.name, log)), None, "gguf")
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelSourceError(
                f"model.name_or_path: {local} is a folder but has no config.json; point it at a Hugging Face "
                "model folder (config.json + *.safetensors) or a .gguf file"
            )
        return ResolvedModel(str(local.resolve()), None, "local")
    if name.startswith((".", "/", "~")) or not _HUB_ID.match(name):
        raise ModelSourceError(
            f"model.name_or_path: {name!r} is neither an existing local folder/.gguf file nor a Hub id like "
            "'meta-llama/Llama-3.1-8B-Instruct'"
        )
    if section.gguf_file:
        gguf = _download_hub_file(name, section.gguf_file, section.revision)
        return ResolvedModel(str(_cached_gguf_conversion(gguf.parent, gguf.name, log)), None, "gguf")
    return ResolvedModel(name, section.revision, "hub")


def _download_hub_file(repo_id: str, filename: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except Exception as exc:  # the hub client raises many types; the user needs the message
        raise ModelSourceError(f"could not download {filename} from {repo_id}: {exc}") from None


def _cached_gguf_conversion(directory: Path, filename: str, log) -> Path:
    source = (directory / filename).resolve()
    stat = source.stat()
    key = hashlib.sha256(f"{source}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    folder = cache_dir() / "models" / f"gguf-{source.stem}-{key}"
    if not (folder / "config.json").is_file():
        log(f"Converting {source.name} to a safetensors folder in {folder} (once) ...")
        convert_gguf_to_folder(directory, filename, folder)
    return folder


def convert_gguf_to_folder(directory: Path, filename: str, folder: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and save it as a normal bf16 safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kwargs = dict(gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(
        str(directory),
        quantization_config=GgufConfig(gguf_file=filename, dequantize=True),
        dtype=torch.float32,
        **kwargs,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(directory), **kwargs)
    model = model.to(torch.bfloat16)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with atomic_dir(folder) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
