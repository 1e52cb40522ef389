"""What this machine can do: CPU features, memory, GPUs, and the device/dtype to use.

The CPU part reads ``/proc/cpuinfo`` and ``/proc/meminfo`` and never imports torch, so
``pardec --help`` stays fast. Anything about CUDA or MPS imports torch lazily, inside
the function that needs it.

- `cpu_info()` / `parse_cpuinfo(text)`: model name, logical cores, feature flags.
- `total_ram_bytes()`, `available_ram_bytes()`: memory, or None when unknown.
- `cuda_devices()`: name, memory and compute capability of each CUDA GPU.
- `resolve_device(requested)`: "auto" | "cpu" | "cuda" | "cuda:N" | "mps" -> a device.
- `resolve_dtype(requested, device)`: "auto" | a dtype name -> "float32" | "bfloat16" |
  "float16"; `torch_dtype(name)` turns such a name into a ``torch.dtype``.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pardec_cli.errors import PardecUsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

CPUINFO_PATH = Path("/proc/cpuinfo")
MEMINFO_PATH = Path("/proc/meminfo")

# Canonical dtype names and the spellings accepted for each.
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda", "cuda:N", "mps")


# --------------------------------------------------------------------------- CPU


@dataclass(frozen=True)
class CpuInfo:
    """The CPU as the kernel reports it. `flags` is empty where it cannot be read."""

    model_name: str
    logical_cores: int
    flags: frozenset[str] = field(default_factory=frozenset, repr=False)

    @property
    def has_avx2(self) -> bool:
        """AVX2 (x86): the baseline for fast float32 matmuls on CPU."""
        return "avx2" in self.flags

    @property
    def has_avx512(self) -> bool:
        """AVX-512 foundation instructions."""
        return "avx512f" in self.flags

    @property
    def has_avx512_bf16(self) -> bool:
        """AVX-512 BF16 dot products (Cooper Lake, Zen 4 and later)."""
        return "avx512_bf16" in self.flags

    @property
    def has_amx_bf16(self) -> bool:
        """AMX tiles with bf16 (Sapphire Rapids and later)."""
        return "amx_bf16" in self.flags

    @property
    def has_fast_bf16(self) -> bool:
        """Whether bfloat16 matmuls run in hardware (so bf16 beats float32 on this CPU)."""
        return self.has_amx_bf16 or self.has_avx512_bf16


def parse_cpuinfo(text: str, logical_cores: int | None = None) -> CpuInfo:
    """Parse the text of ``/proc/cpuinfo`` (x86 ``flags`` or ARM ``Features`` lines).

    `logical_cores` defaults to the number of ``processor`` entries in the text, or 1.
    """
    model_name = ""
    flags: set[str] = set()
    processors = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        value = value.strip()
        if key == "processor":
            processors += 1
        elif key in ("model name", "cpu model", "hardware") and not model_name:
            model_name = value
        elif key in ("flags", "features") and not flags:
            flags.update(value.split())
    cores = logical_cores if logical_cores is not None else max(processors, 1)
    return CpuInfo(model_name=model_name, logical_cores=cores, flags=frozenset(flags))


def cpu_info() -> CpuInfo:
    """This machine's CPU. Off Linux (macOS, Windows) the flags are empty."""
    cores = os.cpu_count() or 1
    try:
        text = CPUINFO_PATH.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuInfo(model_name=platform.processor() or platform.machine(), logical_cores=cores)
    info = parse_cpuinfo(text, logical_cores=cores)
    if not info.model_name:
        info = CpuInfo(platform.processor() or platform.machine(), info.logical_cores, info.flags)
    return info


# ------------------------------------------------------------------------ memory


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse ``/proc/meminfo`` text into bytes per field (``MemTotal``, ``MemAvailable``...)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^(\w+):\s+(\d+)(?:\s+kB)?", line)
        if match:
            unit = 1024 if line.rstrip().endswith("kB") else 1
            out[match.group(1)] = int(match.group(2)) * unit
    return out


def _meminfo() -> dict[str, int]:
    try:
        return parse_meminfo(MEMINFO_PATH.read_text(encoding="utf-8"))
    except OSError:
        return {}


def total_ram_bytes() -> int | None:
    """Physical memory in bytes, or None when it cannot be found."""
    total = _meminfo().get("MemTotal")
    if total:
        return total
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def available_ram_bytes() -> int | None:
    """Memory available to new processes (Linux ``MemAvailable``), or None when unknown."""
    return _meminfo().get("MemAvailable")


# -------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device."""

    index: int
    name: str
    total_memory_bytes: int
    capability: tuple[int, int]


def cuda_devices() -> list[GpuInfo]:
    """The CUDA GPUs torch can see (imports torch); empty without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            GpuInfo(index, props.name, int(props.total_memory), (props.major, props.minor))
        )
    return devices


def hardware_summary(include_gpu: bool = True) -> dict[str, Any]:
    """A JSON-friendly description of the machine (for `doctor` output and bench records)."""
    cpu = cpu_info()
    summary: dict[str, Any] = {
        "cpu": cpu.model_name,
        "logical_cores": cpu.logical_cores,
        "avx2": cpu.has_avx2,
        "avx512": cpu.has_avx512,
        "fast_bf16": cpu.has_fast_bf16,
        "amx_bf16": cpu.has_amx_bf16,
        "ram_bytes": total_ram_bytes(),
    }
    if include_gpu:
        summary["gpus"] = [
            {
                "name": g.name,
                "memory_bytes": g.total_memory_bytes,
                "capability": f"{g.capability[0]}.{g.capability[1]}",
            }
            for g in cuda_devices()
        ]
    return summary


# ---------------------------------------------------------------- device, dtype


def resolve_device(requested: str) -> str:
    """Turn a ``--device`` value into a torch device string.

    "auto" gives "cuda" when torch sees a CUDA GPU, else "cpu". Asking for a device this
    machine lacks raises `PardecUsageError`.
    """
    value = (requested or "auto").strip().lower()
    if value == "cpu":
        return "cpu"
    if value == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if value == "cuda" or re.fullmatch(r"cuda:\d+", value):
        import torch

        if not torch.cuda.is_available():
            raise PardecUsageError(
                f"device {value!r} was asked for, but torch sees no CUDA GPU",
                hint="use --device cpu (or auto); a CUDA build of torch and a GPU driver "
                "are needed for cuda",
            )
        if ":" in value:
            index = int(value.split(":", 1)[1])
            count = torch.cuda.device_count()
            if index >= count:
                raise PardecUsageError(
                    f"device {value!r} does not exist: torch sees {count} CUDA GPU(s)",
                    hint=f"use cuda:0 ... cuda:{count - 1}",
                )
        return value
    if value == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise PardecUsageError(
                "device 'mps' was asked for, but Apple's Metal backend is not available",
                hint="use --device cpu (or auto)",
            )
        return "mps"
    raise PardecUsageError(
        f"unknown device {requested!r}", hint="choose one of: " + ", ".join(DEVICE_CHOICES)
    )


def canonical_dtype(name: str) -> str:
    """"bf16" -> "bfloat16" and so on; an unknown name raises `PardecUsageError`."""
    key = (name or "").strip().lower()
    if key.startswith("torch."):
        key = key[len("torch.") :]
    try:
        return DTYPE_ALIASES[key]
    except KeyError:
        raise PardecUsageError(
            f"unknown dtype {name!r}", hint="choose one of: auto, " + ", ".join(DTYPE_NAMES)
        ) from None


def resolve_dtype(requested: str, device: str, *, cpu: CpuInfo | None = None) -> str:
    """Turn a ``--dtype`` value into "float32", "bfloat16" or "float16".

    "auto" means: on CUDA, bfloat16 where the GPU supports it, else float16; on MPS,
    float16; on CPU, bfloat16 only when the CPU does bf16 in hardware (AMX-bf16 or
    AVX512-bf16), else float32. `cpu` replaces this machine's CPU (for tests).
    Greedy output is bit-exact against plain decoding only in float32.
    """
    value = (requested or "auto").strip().lower()
    if value != "auto":
        return canonical_dtype(value)
    kind = device.split(":", 1)[0].lower()
    if kind == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if kind == "mps":
        return "float16"
    info = cpu if cpu is not None else cpu_info()
    return "bfloat16" if info.has_fast_bf16 else "float32"


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` for a dtype name such as "bfloat16" or "bf16" (imports torch)."""
    import torch

    return {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[canonical_dtype(name)]
