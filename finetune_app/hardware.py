"""What GPUs this machine has (NVML, torch.cuda as fallback) and a catalogue of common GPUs for planning.

Plain dataclasses only; nothing heavy is imported at module import. No GPU is a normal answer (an
empty list), never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1 << 30
GB = 10**9


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int]

    @property
    def bf16(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def flash_attention_capable(self) -> bool:
        """FlashAttention-2 runs on Ampere and newer (it also needs the flash-attn package installed)."""
        return self.compute_capability >= (8, 0)

    @property
    def flash_attention(self) -> bool:
        return self.flash_attention_capable and flash_attn_installed()


@dataclass(frozen=True)
class HardwareInfo:
    gpus: list[GPUInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None
    cpu_ram_total: int = 0
    cpu_ram_available: int = 0


def flash_attn_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("flash_attn") is not None


def _catalogue_gpu(name: str, memory_bytes: int, cc: tuple[int, int]) -> GPUInfo:
    return GPUInfo(index=0, name=name, total_bytes=memory_bytes, free_bytes=memory_bytes, compute_capability=cc)


# Usable memory as the driver reports it is a little below the marketing size; planning uses the
# marketing size and the verdict's margin absorbs the difference.
GPU_CATALOGUE: dict[str, GPUInfo] = {
    gpu.name: gpu
    for gpu in [
        _catalogue_gpu("T4", 16 * GB, (7, 5)),
        _catalogue_gpu("L4", 24 * GB, (8, 9)),
        _catalogue_gpu("A10G", 24 * GB, (8, 6)),
        _catalogue_gpu("RTX 3090", 24 * GiB, (8, 6)),
        _catalogue_gpu("RTX 4090", 24 * GiB, (8, 9)),
        _catalogue_gpu("RTX 5090", 32 * GiB, (12, 0)),
        _catalogue_gpu("L40S", 48 * GB, (8, 9)),
        _catalogue_gpu("RTX 6000 Ada", 48 * GiB, (8, 9)),
        _catalogue_gpu("A100 40GB", 40 * GiB, (8, 0)),
        _catalogue_gpu("A100 80GB", 80 * GiB, (8, 0)),
        _catalogue_gpu("H100 80GB", 80 * GiB, (9, 0)),
        _catalogue_gpu("H200", 141 * GB, (9, 0)),
    ]
}


def catalogue_gpu(name: str) -> GPUInfo:
    """Look a GPU up by name, ignoring case, spaces and dashes ('rtx4090', 'a100-80gb')."""
    key = _normalize(name)
    for gpu_name, gpu in GPU_CATALOGUE.items():
        if _normalize(gpu_name) == key:
            return gpu
    matches = [gpu for gpu_name, gpu in GPU_CATALOGUE.items() if key and key in _normalize(gpu_name)]
    if len(matches) == 1:
        return matches[0]
    raise KeyError(f"unknown GPU {name!r}; the catalogue has: {', '.join(GPU_CATALOGUE)}")


def _normalize(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def detect_hardware() -> HardwareInfo:
    """GPUs through NVML; if NVML is unavailable, through torch.cuda (imported only then)."""
    ram_total, ram_available = _cpu_ram()
    nvml = _detect_nvml()
    if nvml is not None:
        gpus, driver, cuda = nvml
    else:
        gpus, driver, cuda = _detect_torch()
    return HardwareInfo(gpus, driver, cuda, ram_total, ram_available)


def _cpu_ram() -> tuple[int, int]:
    try:
        import psutil

        mem = psutil.virtual_memory()
        return int(mem.total), int(mem.available)
    except Exception:
        return 0, 0


def _detect_nvml():
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no GPU: NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            version = pynvml.nvmlSystemGetCudaDriverVersion()
            cuda = f"{version // 1000}.{(version % 1000) // 10}"
        except Exception:
            cuda = None
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            gpus.append(GPUInfo(index, name, int(memory.total), int(memory.free), (int(major), int(minor))))
        return gpus, driver, cuda
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _detect_torch():
    try:
        import torch
    except ImportError:
        return [], None, None
    if not torch.cuda.is_available():
        return [], None, torch.version.cuda
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        gpus.append(GPUInfo(index, props.name, int(total), int(free), (props.major, props.minor)))
    return gpus, None, torch.version.cuda


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
