"""Rough speed of a device in one dtype, for ranking decoding methods before anything is measured.

`estimate(hardware)` -> `DeviceEstimate`: CPUs from their instruction set and core
count, GPUs from their data-sheet figures (`pardec_cli.hardware.KNOWN_GPUS`). `pardec
tune` replaces these guesses with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from pardec_cli.hardware import (
    BIG_GPU_BYTES, UNKNOWN_BIG_GPU, UNKNOWN_GPU, CpuInfo, GpuInfo, Hardware, canonical_dtype, cpu_isa, gpu_spec,
)


@dataclass(frozen=True)
class DeviceEstimate:
    """How fast a device runs one dtype, roughly: enough to rank decoding methods.

    A forward of n new tokens through a model with P parameters of b bytes and L layers
    is estimated as ``L * overhead_ms_per_layer + P*b / bandwidth + n * 2P / compute``:
    a fixed launch/Python cost, the weights read once, and the arithmetic growing with n
    (`pardec_cli.selection.costmodel` turns this into a verification cost curve).
    """

    bandwidth_gbs: float
    gflops: float
    overhead_ms_per_layer: float
    source: str


# Effective (not peak) GFLOPS per CPU core, per dtype, by instruction set. Calibrated on
# the two CPUs this project was measured on: an AVX2-only EPYC (float32 forward of
# SmolLM2-135M: 54 ms for 1 token, +3.3 ms per extra token; bfloat16 emulated: +13 ms per
# token) and an AMX Xeon (bfloat16: +0.4 ms per token).
_CPU_GFLOPS_PER_CORE = {
    "amx": {"float32": 60.0, "bfloat16": 340.0, "float16": 10.0},
    "avx512_bf16": {"float32": 60.0, "bfloat16": 120.0, "float16": 10.0},
    "avx512": {"float32": 60.0, "bfloat16": 10.0, "float16": 5.0},
    "avx2": {"float32": 32.0, "bfloat16": 8.0, "float16": 4.0},
    "other": {"float32": 15.0, "bfloat16": 4.0, "float16": 4.0},
}
_CPU_BANDWIDTH_PER_CORE_GBS = 5.0  # what a few cores of a shared server actually stream
_CPU_BANDWIDTH_MAX_GBS = 60.0
_CPU_OVERHEAD_MS_PER_LAYER = 0.15
_GPU_OVERHEAD_MS_PER_LAYER = 0.3  # eager PyTorch kernel launches
_GPU_EFFICIENCY = 0.5  # share of data-sheet bandwidth and compute eager PyTorch reaches



def cpu_estimate(cpu: CpuInfo, dtype: str) -> DeviceEstimate:
    """Speed estimate of `cpu` in `dtype` (see `_CPU_GFLOPS_PER_CORE`)."""
    isa = cpu_isa(cpu)
    cores = max(cpu.logical_cores, 1)
    return DeviceEstimate(
        bandwidth_gbs=min(cores * _CPU_BANDWIDTH_PER_CORE_GBS, _CPU_BANDWIDTH_MAX_GBS),
        gflops=cores * _CPU_GFLOPS_PER_CORE[isa][canonical_dtype(dtype)],
        overhead_ms_per_layer=_CPU_OVERHEAD_MS_PER_LAYER,
        source=f"{cores} {isa.upper().replace('_', '-')} core{'s' if cores > 1 else ''}",
    )


def gpu_estimate(gpu: GpuInfo, dtype: str) -> DeviceEstimate:
    """Speed estimate of `gpu` in `dtype`, from `KNOWN_GPUS` (float32 runs at 1/8 the tensor rate)."""
    spec = gpu_spec(gpu.name)
    source = f"the {spec.pattern} data sheet" if spec else "a guess (GPU not in pardec's table)"
    if spec is None:
        spec = UNKNOWN_BIG_GPU if gpu.total_memory_bytes >= BIG_GPU_BYTES else UNKNOWN_GPU
    tflops = spec.tflops_16 if canonical_dtype(dtype) != "float32" else spec.tflops_16 / 8
    if canonical_dtype(dtype) == "bfloat16" and not gpu.has_bf16:
        tflops /= 8  # no bf16 tensor cores: emulated
    return DeviceEstimate(
        bandwidth_gbs=spec.bandwidth_gbs * _GPU_EFFICIENCY,
        gflops=tflops * 1000 * _GPU_EFFICIENCY,
        overhead_ms_per_layer=_GPU_OVERHEAD_MS_PER_LAYER,
        source=source,
    )


def estimate(hardware: Hardware) -> DeviceEstimate:
    """The speed estimate of the device `hardware` describes, in its dtype."""
    if hardware.gpu is not None:
        return gpu_estimate(hardware.gpu, hardware.dtype)
    if hardware.hw_class == "apple":
        return DeviceEstimate(200, 10000, _GPU_OVERHEAD_MS_PER_LAYER, "a guess for Apple GPUs")
    return cpu_estimate(hardware.cpu, hardware.dtype)
