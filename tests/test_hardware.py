"""Hardware detection and the device/dtype rules, on simulated CPUs and GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pardec_cli import hardware
from pardec_cli.errors import PardecUsageError
from pardec_cli.hardware import CpuInfo, parse_cpuinfo, parse_meminfo, resolve_device, resolve_dtype
from pardec_cli.selection.estimates import estimate

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16

processor\t: 1
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16
"""


def cpu(*flags: str) -> CpuInfo:
    return CpuInfo(model_name="test cpu", logical_cores=2, flags=frozenset(flags))


# ------------------------------------------------------------------------ CPU


def test_parse_x86_cpuinfo() -> None:
    info = parse_cpuinfo(X86_CPUINFO)
    assert info.model_name == "Intel(R) Xeon(R) Platinum 8480+"
    assert info.logical_cores == 2
    assert {"avx2", "amx_bf16", "avx512_bf16"} <= info.flags
    assert info.has_avx2 and info.has_avx512 and info.has_avx512_bf16 and info.has_amx_bf16
    assert info.has_fast_bf16


def test_parse_arm_cpuinfo_has_no_x86_features() -> None:
    info = parse_cpuinfo(ARM_CPUINFO, logical_cores=8)
    assert info.logical_cores == 8
    assert "asimd" in info.flags
    assert not (info.has_avx2 or info.has_avx512 or info.has_fast_bf16)


def test_parse_empty_cpuinfo() -> None:
    info = parse_cpuinfo("")
    assert info == CpuInfo(model_name="", logical_cores=1, flags=frozenset())


def test_avx2_only_cpu_has_no_fast_bf16() -> None:
    info = parse_cpuinfo("processor : 0\nflags : sse avx avx2 fma\n")
    assert info.has_avx2 and not info.has_avx512 and not info.has_fast_bf16


def test_cpu_info_without_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hardware, "CPUINFO_PATH", tmp_path / "missing")
    info = hardware.cpu_info()
    assert info.flags == frozenset()
    assert info.logical_cores >= 1


def test_cpu_info_on_this_machine() -> None:
    info = hardware.cpu_info()
    assert info.logical_cores >= 1
    assert isinstance(info.flags, frozenset)


# --------------------------------------------------------------------- memory


def test_parse_meminfo() -> None:
    text = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:   8192000 kB\nHugePages_Total: 0\n"
    info = parse_meminfo(text)
    assert info["MemTotal"] == 16384000 * 1024
    assert info["MemAvailable"] == 8192000 * 1024
    assert info["HugePages_Total"] == 0


def test_total_ram_bytes() -> None:
    total = hardware.total_ram_bytes()
    assert total is None or total > 0


def test_total_ram_falls_back_without_meminfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hardware, "MEMINFO_PATH", tmp_path / "missing")
    total = hardware.total_ram_bytes()
    assert total is None or total > 0
    assert hardware.available_ram_bytes() is None


# ---------------------------------------------------------------------- dtype


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("avx2", "avx512f", "amx_bf16"), "bfloat16"),
        (("avx2", "avx512f", "avx512_bf16"), "bfloat16"),
        (("avx2", "avx512f"), "float32"),
        (("avx2",), "float32"),
        ((), "float32"),
    ],
)
def test_auto_dtype_on_cpu_follows_bf16_hardware(flags: tuple[str, ...], expected: str) -> None:
    assert resolve_dtype("auto", "cpu", cpu=cpu(*flags)) == expected


@pytest.mark.parametrize("flags", [("avx2", "avx512f", "amx_bf16"), ("avx2", "avx512f", "avx512_bf16"), ("avx2",)])
def test_auto_dtype_runs_a_gguf_s_4_bit_blocks_in_float32_where_the_native_step_is_ready(flags: tuple[str, ...]) -> None:
    # blocks4 (store.loading.native_auto): q4q8 in float32 on pardec's AVX2 kernels beat
    # bfloat16's int4 even with AVX512-BF16; a GPU keeps its 16-bit dtype.
    assert resolve_dtype("auto", "cpu", cpu=cpu(*flags), blocks4=True) == "float32"
    assert resolve_dtype("bfloat16", "cpu", cpu=cpu(*flags), blocks4=True) == "bfloat16"  # asked for: kept
    assert resolve_dtype("auto", "mps", cpu=cpu(*flags), blocks4=True) == "float16"


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("float32", "float32"), ("fp32", "float32"), ("FP32", "float32"),
        ("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("torch.bfloat16", "bfloat16"),
        ("fp16", "float16"), ("half", "float16"), ("float16", "float16"),
    ],
)  # fmt: skip
def test_explicit_dtype_names(requested: str, expected: str) -> None:
    # An explicit choice wins over the hardware rule.
    assert resolve_dtype(requested, "cpu", cpu=cpu()) == expected


def test_unknown_dtype_is_a_usage_error() -> None:
    with pytest.raises(PardecUsageError, match="unknown dtype 'int3'") as info:
        resolve_dtype("int3", "cpu")
    assert info.value.exit_code == 2
    assert "bfloat16" in (info.value.hint or "")


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bfloat16"), (False, "float16")])
def test_auto_dtype_on_cuda(monkeypatch: pytest.MonkeyPatch, bf16: bool, expected: str) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert resolve_dtype("auto", "cuda") == expected
    assert resolve_dtype("auto", "cuda:1") == expected


def test_auto_dtype_on_mps() -> None:
    assert resolve_dtype("auto", "mps") == "float16"


def test_torch_dtype() -> None:
    import torch

    assert hardware.torch_dtype("bf16") is torch.bfloat16
    assert hardware.torch_dtype("float32") is torch.float32
    assert hardware.torch_dtype("half") is torch.float16
    with pytest.raises(PardecUsageError):
        hardware.torch_dtype("float8")


# --------------------------------------------------------------------- device


def test_cpu_device() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(" CPU ") == "cpu"


@pytest.mark.parametrize(("available", "expected"), [(False, "cpu"), (True, "cuda")])
def test_auto_device(monkeypatch: pytest.MonkeyPatch, available: bool, expected: str) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert resolve_device("auto") == expected


@pytest.mark.parametrize("requested", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_cuda_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, requested: str) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PardecUsageError, match="no CUDA GPU") as info:
        resolve_device(requested)
    assert "--device cpu" in (info.value.hint or "")


def test_cuda_index_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(PardecUsageError, match="does not exist"):
        resolve_device("cuda:3")


def test_mps_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(PardecUsageError, match="mps"):
        resolve_device("mps")


@pytest.mark.parametrize("requested", ["tpu", "cuda:x", "gpu"])
def test_unknown_device(requested: str) -> None:
    with pytest.raises(PardecUsageError, match="unknown device"):
        resolve_device(requested)


def test_hardware_summary_without_gpu() -> None:
    summary = hardware.hardware_summary(include_gpu=False)
    assert summary["logical_cores"] >= 1
    assert "gpus" not in summary


# ------------------------------------------------- GPUs, hardware classes, estimates

H100 = hardware.GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 * 1024**3, (9, 0))
RTX_3060 = hardware.GpuInfo(0, "NVIDIA GeForce RTX 3060", 12 * 1024**3, (8, 6))
T4 = hardware.GpuInfo(0, "Tesla T4", 15 * 1024**3, (7, 5))


def test_bf16_support_follows_compute_capability() -> None:
    assert H100.has_bf16 and RTX_3060.has_bf16
    assert not T4.has_bf16


def test_parse_nvidia_smi() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 81559, 9.0\n1, NVIDIA GeForce RTX 4090, 24564, 8.9\ngarbage line\n"
    gpus = hardware.parse_nvidia_smi(text)
    assert [g.name for g in gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"]
    assert gpus[0].capability == (9, 0) and gpus[1].index == 1
    assert gpus[0].total_memory_bytes == 81559 * 1024 * 1024


def test_probe_gpus_without_a_driver_does_not_import_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(hardware, "NVIDIA_DRIVER_PATH", tmp_path / "no-driver")
    monkeypatch.setattr(hardware, "cuda_devices", lambda: pytest.fail("torch must not be asked"))
    if Path("/dev/kfd").exists():
        pytest.skip("this machine has a ROCm device node")
    assert hardware.probe_gpus() == []


@pytest.mark.parametrize(
    ("name", "pattern", "tier"),
    [
        ("NVIDIA H100 80GB HBM3", "H100", "datacenter"),
        ("NVIDIA H100 PCIe", "H100 PCIe", "datacenter"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", "datacenter"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", "consumer"),
        ("Tesla T4", "T4", "datacenter"),
    ],
)
def test_known_gpu_table(name: str, pattern: str, tier: str) -> None:
    spec = hardware.gpu_spec(name)
    assert spec is not None and spec.pattern == pattern and spec.tier == tier
    assert spec.bandwidth_gbs > 100 and spec.tflops_16 > 10


def test_unknown_gpu_is_guessed_from_its_memory() -> None:
    assert hardware.gpu_spec("Some Future GPU") is None
    big = hardware.describe("cuda:0", "bfloat16", cpu(), [hardware.GpuInfo(0, "Some Future GPU", 96 * 1024**3, (10, 0))])
    small = hardware.describe("cuda:0", "bfloat16", cpu(), [hardware.GpuInfo(0, "Some Future GPU", 8 * 1024**3, (8, 0))])
    assert big.hw_class == "gpu-datacenter" and small.hw_class == "gpu-consumer"
    assert "guess" in estimate(big).source


@pytest.mark.parametrize(
    ("device", "dtype", "flags", "gpus", "expected"),
    [
        ("cuda:0", "bfloat16", (), [H100], "gpu-datacenter"),
        ("cuda:0", "bfloat16", (), [RTX_3060], "gpu-consumer"),
        ("mps", "float16", (), [], "apple"),
        ("cpu", "bfloat16", ("avx2", "avx512f", "amx_bf16"), [], "cpu-bf16"),
        ("cpu", "float32", ("avx2", "avx512f", "amx_bf16"), [], "cpu"),
        ("cpu", "bfloat16", ("avx2",), [], "cpu"),  # bf16 without hardware support: no cheap width
        ("cpu", "float32", ("avx2",), [], "cpu"),
    ],
)
def test_hardware_classes(device, dtype, flags, gpus, expected) -> None:
    hw = hardware.describe(device, dtype, cpu(*flags), gpus)
    assert hw.hw_class == expected
    assert hw.family == ("cpu" if expected.startswith("cpu") else "gpu")


def test_estimates_rank_devices_sensibly() -> None:
    h100 = estimate(hardware.describe("cuda:0", "bfloat16", cpu(), [H100]))
    rtx = estimate(hardware.describe("cuda:0", "bfloat16", cpu(), [RTX_3060]))
    amx = estimate(hardware.describe("cpu", "bfloat16", cpu("avx2", "avx512f", "amx_bf16")))
    avx2_bf16 = estimate(hardware.describe("cpu", "bfloat16", cpu("avx2")))
    avx2_f32 = estimate(hardware.describe("cpu", "float32", cpu("avx2")))
    assert h100.bandwidth_gbs > rtx.bandwidth_gbs > amx.bandwidth_gbs
    assert h100.gflops > rtx.gflops > amx.gflops > avx2_f32.gflops > avx2_bf16.gflops


def test_device_key_names_the_device_and_cores() -> None:
    hw = hardware.describe("cpu", "float32", CpuInfo("AMD EPYC 7B13", 2, frozenset({"avx2"})))
    assert hw.key == "cpu:AMD EPYC 7B13 (2 cores)"
    assert hardware.describe("cuda:0", "bfloat16", cpu(), [H100]).key == "cuda:NVIDIA H100 80GB HBM3"


def test_detect_hardware_on_this_machine_runs_without_torch_on_cpu() -> None:
    hw = hardware.detect_hardware("cpu", "auto")
    assert hw.device == "cpu" and hw.dtype in ("float32", "bfloat16")
    assert hw.hw_class in hardware.HARDWARE_CLASSES
