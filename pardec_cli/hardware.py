"""What this machine can do: CPU features, memory, GPUs, and the device/dtype to use.

The CPU part reads ``/proc/cpuinfo`` and ``/proc/meminfo`` and never imports torch, so
``pardec --help`` stays fast. Anything about CUDA or MPS imports torch lazily, inside
the function that needs it.

- `cpu_info()` / `parse_cpuinfo(text)`: model name, logical cores, feature flags.
- `total_ram_bytes()`, `available_ram_bytes()`: memory, or None when unknown.
- `cuda_devices()`: name, memory and compute capability of each CUDA GPU (torch);
  `probe_gpus()`: the same without torch where it can (nvidia-smi, or no NVIDIA driver).
- `gpu_spec(name)`: bandwidth, compute and tier of a known GPU (`KNOWN_GPUS`, read
  from data/gpus.toml).
- `describe(device, dtype, cpu, gpus)` -> `Hardware`: the hardware class (pure: tests
  simulate any machine; speed estimates for auto are in `pardec_cli.selection.estimates`);
  `detect_hardware(device, dtype)` does the same for this machine.
- `resolve_device(requested)`: "auto" | "cpu" | "cuda" | "cuda:N" | "mps" -> a device.
- `resolve_dtype(requested, device)`: "auto" | a dtype name -> "float32" | "bfloat16" |
  "float16"; `torch_dtype(name)` turns such a name into a ``torch.dtype``.
- `measure_memory_bandwidth(device)`: GB/s from a short copy or read test (imports torch).
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

    @property
    def has_bf16(self) -> bool:
        """bfloat16 tensor cores: Ampere (compute capability 8.0) and later."""
        return self.capability >= (8, 0)


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


NVIDIA_DRIVER_PATH = Path("/proc/driver/nvidia/version")


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total,compute_cap
    --format=csv,noheader,nounits`` output (memory in MiB)."""
    devices = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            index, memory = int(parts[0]), int(float(parts[2])) * 1024 * 1024
            major, _, minor = parts[3].partition(".")
            capability = (int(major), int(minor or 0))
        except ValueError:
            continue
        devices.append(GpuInfo(index, parts[1], memory, capability))
    return devices


def probe_gpus() -> list[GpuInfo]:
    """The CUDA GPUs, importing torch only when there is no cheaper way to know.

    No NVIDIA driver (and no ROCm) on the machine: no GPU, without importing torch.
    nvidia-smi on the PATH: its answer. Otherwise torch is asked (`cuda_devices`).
    """
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout
            return parse_nvidia_smi(out)
        except (OSError, subprocess.SubprocessError):
            pass
    if not NVIDIA_DRIVER_PATH.exists() and not Path("/dev/kfd").exists():
        return []
    try:
        return cuda_devices()
    except ImportError:
        return []


# ------------------------------------------------------- speed of known hardware


@dataclass(frozen=True)
class GpuSpec:
    """Published figures of a GPU model: memory bandwidth and dense 16-bit tensor throughput.

    `tier` is "datacenter" (HBM, large memory) or "consumer". The figures are the
    vendors' data-sheet numbers (dense, no sparsity); the cost model only needs their
    order of magnitude, and `pardec tune` replaces them with measurements.
    """

    pattern: str  # matched case-insensitively against the device name, first match wins
    bandwidth_gbs: float
    tflops_16: float
    tier: str


def _load_known_gpus() -> tuple[GpuSpec, ...]:
    from importlib.resources import files

    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib

    rows = tomllib.loads(files("pardec_cli").joinpath("data/gpus.toml").read_text(encoding="utf-8"))["gpu"]
    return tuple(GpuSpec(r["pattern"], float(r["bandwidth_gbs"]), float(r["tflops_16"]), r["tier"]) for r in rows)


# The table lives in data/gpus.toml (ordered: more specific names first).
KNOWN_GPUS: tuple[GpuSpec, ...] = _load_known_gpus()

# A GPU missing from the table: a middling consumer card, or a datacenter one when it
# has as much memory as those have.
UNKNOWN_GPU = GpuSpec("unknown", 500, 50, "consumer")
UNKNOWN_BIG_GPU = GpuSpec("unknown", 1500, 300, "datacenter")
BIG_GPU_BYTES = 40 * 1024**3  # an unlisted GPU with this much memory counts as a datacenter one


def gpu_spec(name: str) -> GpuSpec | None:
    """The `KNOWN_GPUS` row whose pattern occurs in `name` (case-insensitive), or None."""
    lowered = name.lower()
    return next((spec for spec in KNOWN_GPUS if spec.pattern.lower() in lowered), None)


def cpu_isa(cpu: CpuInfo) -> str:
    """The CPU's best matmul instruction set: "amx", "avx512_bf16", "avx512", "avx2" or "other"."""
    if cpu.has_amx_bf16:
        return "amx"
    if cpu.has_avx512_bf16:
        return "avx512_bf16"
    if cpu.has_avx512:
        return "avx512"
    if cpu.has_avx2:
        return "avx2"
    return "other"


# ------------------------------------------------------------- hardware classes

# Profiles list candidate methods per class (falling back to the family, then to
# "default"); each class stands for one regime of the verification cost curve.
HARDWARE_CLASSES: dict[str, str] = {
    "gpu-datacenter": "HBM GPU: verifying 64 tokens costs about as much as one",
    "gpu-consumer": "desktop GPU: verifying a few dozen tokens is nearly free",
    "apple": "Apple GPU (MPS): unified memory, moderate parallel headroom",
    "cpu-bf16": "CPU with bfloat16 in hardware (AMX, AVX512-bf16) running bf16: wide trees pay",
    "cpu": "CPU in float32 (or 16-bit without hardware support): every extra token costs",
}


@dataclass(frozen=True)
class Hardware:
    """Where a model runs, as `--method auto` needs to know it.

    `device` and `dtype` are resolved ("cpu", "cuda:0"; "float32"...); `hw_class` is a
    key of `HARDWARE_CLASSES` and `family` "gpu" or "cpu"; `name` names the device for
    people and for keying tuned results.
    """

    device: str
    dtype: str
    hw_class: str
    name: str
    cpu: CpuInfo
    gpu: GpuInfo | None = None

    @property
    def family(self) -> str:
        return "cpu" if self.hw_class.startswith("cpu") else "gpu"

    @property
    def key(self) -> str:
        """Identifies the device for tuned results: results from another device never apply."""
        return f"{self.device.split(':')[0]}:{self.name}"


def describe(device: str, dtype: str, cpu: CpuInfo, gpus: list[GpuInfo] | tuple[GpuInfo, ...] = ()) -> Hardware:
    """The `Hardware` for a resolved device and dtype on a machine with `cpu` and `gpus` (pure)."""
    dtype = canonical_dtype(dtype)
    kind, _, index_text = device.partition(":")
    if kind == "cuda":
        index = int(index_text or 0)
        gpu = next((g for g in gpus if g.index == index), None) or GpuInfo(index, "unknown CUDA GPU", 0, (0, 0))
        spec = gpu_spec(gpu.name)
        tier = spec.tier if spec else ("datacenter" if gpu.total_memory_bytes >= BIG_GPU_BYTES else "consumer")
        return Hardware(device, dtype, f"gpu-{tier}", gpu.name, cpu, gpu)
    if kind == "mps":
        return Hardware(device, dtype, "apple", "Apple GPU", cpu)
    fast_half = dtype == "bfloat16" and cpu.has_fast_bf16
    name = f"{cpu.model_name or 'unknown CPU'} ({cpu.logical_cores} cores)"
    return Hardware("cpu", dtype, "cpu-bf16" if fast_half else "cpu", name, cpu)


def detect_hardware(device: str = "auto", dtype: str = "auto", *, blocks4: bool = False) -> Hardware:
    """This machine's `Hardware` for a `--device`/`--dtype` pair (imports torch only for GPUs);
    `blocks4`: see `resolve_dtype`."""
    cpu = cpu_info()
    gpus = probe_gpus() if device != "cpu" else []
    # Without a GPU driver "auto" is the CPU, known without torch; with one, torch decides
    # (a CPU-only build of torch on a GPU machine runs on the CPU).
    if device == "auto" and not gpus:
        device = "cpu"
    device = resolve_device(device)
    if device == "cuda":
        device = "cuda:0"
    if (dtype or "auto") == "auto":
        dtype = auto_dtype(device, cpu, gpus, blocks4=blocks4)
    return describe(device, dtype, cpu, gpus)


def auto_dtype(device: str, cpu: CpuInfo, gpus: list[GpuInfo] | tuple[GpuInfo, ...] = (), *,
               blocks4: bool = False) -> str:
    """What `--dtype auto` means for `device` (see `resolve_dtype`), from detected facts only."""
    kind, _, index_text = device.partition(":")
    if kind == "cuda":
        gpu = next((g for g in gpus if g.index == int(index_text or 0)), None)
        return "bfloat16" if gpu is None or gpu.has_bf16 else "float16"
    if kind == "mps":
        return "float16"
    # A model kept as 4-bit blocks runs in float32 where pardec's AVX2 library is ready for
    # it: as q4q8 in the native step, 4.4 ms a token against bfloat16's 28 ms eager (7.5
    # compiled) on an AVX512-BF16 EPYC (docs/runner.md, "The native step on AVX512 CPUs").
    if blocks4:
        return "float32"
    return "bfloat16" if cpu.has_fast_bf16 else "float32"


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
                "bf16": g.has_bf16,
            }
            for g in probe_gpus()
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


def resolve_dtype(requested: str, device: str, *, cpu: CpuInfo | None = None, blocks4: bool = False) -> str:
    """Turn a ``--dtype`` value into "float32", "bfloat16" or "float16".

    "auto" means: on CUDA, bfloat16 where the GPU supports it, else float16; on MPS,
    float16; on CPU, float32 when `blocks4` says the native step will run the model
    (`store.loading.native_auto`: q4q8 or q8q8, asked for or auto's, and pardec's AVX2
    kernels built), else bfloat16 only when the CPU does bf16 in hardware
    (AMX-bf16 or AVX512-bf16), else float32. `cpu` replaces this machine's CPU (for tests).
    Greedy output is bit-exact against plain decoding only in float32.
    """
    value = (requested or "auto").strip().lower()
    if value != "auto":
        return canonical_dtype(value)
    kind = device.split(":", 1)[0].lower()
    if kind == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return auto_dtype(kind, cpu if cpu is not None else cpu_info(), blocks4=blocks4)


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` for a dtype name such as "bfloat16" or "bf16" (imports torch)."""
    import torch

    return {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[canonical_dtype(name)]


COPY_TEST_BYTES = 256 << 20  # far beyond any CPU cache, small enough for any machine
COPY_TEST_REPEATS = 5


def synchronize_device(device: Any) -> None:
    """Wait for the work queued on `device` (a torch.device or its name; nothing to wait for
    on a CPU). GPU work is asynchronous: a clock read right after a call times its launch,
    not its work."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def measure_memory_bandwidth(device: str = "cpu", *, size_bytes: int = COPY_TEST_BYTES,
                             repeats: int = COPY_TEST_REPEATS, kind: str = "copy") -> float:
    """Memory bandwidth of `device` in GB/s, from `repeats` passes over a `size_bytes`
    tensor, keeping the fastest (on a shared machine the best is the repeatable one).

    kind "copy": a copy reads and writes `size_bytes` each, and both count (STREAM's
    "Copy" convention). kind "read": a sum of float32 ones reads them once and writes
    nothing, as a decoding forward reads its weights. The two differ by CPU and by the
    moment (a 2-core AMD EPYC, six alternating pairs: read 46-53 GB/s, copy 43-46).
    About 0.1-0.5 s on a CPU. Imports torch.
    """
    import time

    import torch

    from pardec_cli.hugepages import huge_page_tensor

    if kind not in ("copy", "read"):
        raise ValueError(f"unknown bandwidth test {kind!r}")

    def buffer() -> torch.Tensor:  # on a CPU on 2 MB pages, as the weights are (`hugepages`): 2-17% faster reads
        t = huge_page_tensor(size_bytes // 4, torch.float32) if device == "cpu" else None
        return torch.empty(size_bytes // 4, dtype=torch.float32, device=device) if t is None else t

    src = buffer().fill_(1.0)  # written once: its pages are really mapped
    dst = buffer() if kind == "copy" else None

    def one_pass() -> None:
        if dst is not None:
            dst.copy_(src)
        else:
            src.sum()

    one_pass()  # warm-up: fault in dst's pages, start the threads
    synchronize_device(src.device)
    best = float("inf")
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        one_pass()
        synchronize_device(src.device)
        best = min(best, time.perf_counter() - start)
    moved = src.numel() * 4 * (2 if dst is not None else 1)
    return moved / best / 1e9
