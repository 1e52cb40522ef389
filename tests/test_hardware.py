"""Hardware detection and the device/dtype rules, on simulated CPUs and GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pardec_cli import hardware
from pardec_cli.errors import PardecUsageError
from pardec_cli.hardware import CpuInfo, parse_cpuinfo, parse_meminfo, resolve_device, resolve_dtype

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
