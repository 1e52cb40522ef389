"""The verification cost curve: interpolation, extrapolation, and estimates that match
what was measured on the machines this project ran on."""

from __future__ import annotations

import pytest

from pardec_cli.selection.costmodel import CostCurve, ModelShape, estimated_curve
from pardec_cli.hardware import CpuInfo, describe
from pardec_cli.selection.estimates import estimate

SMOLLM2_135M = ModelShape(134_515_008, 30)


def curve(**points: float) -> CostCurve:
    return CostCurve.from_mapping({int(k[1:]): v for k, v in points.items()}, "test")


def test_interpolates_between_points_and_extrapolates_with_the_last_slope() -> None:
    c = curve(n1=50.0, n8=80.0, n16=120.0)
    assert c.base_ms == 50.0
    assert c.ms(1) == 50.0 and c.ms(16) == 120.0
    assert c.ms(12) == pytest.approx(100.0)
    assert c.ms(32) == pytest.approx(200.0)  # slope 5 ms per token beyond 16
    assert c.ms(0.5) == 50.0  # never below one token
    assert c.relative(8) == pytest.approx(1.6)


def test_a_single_point_curve_assumes_linear_cost() -> None:
    c = curve(n1=10.0)
    assert c.ms(4) == pytest.approx(40.0)


@pytest.mark.parametrize("points", [{}, {2: 5.0}, {1: 5.0, 4: 0.0}])
def test_bad_curves_are_rejected(points: dict[int, float]) -> None:
    with pytest.raises(ValueError):
        CostCurve.from_mapping(points, "bad")


def test_round_trip_through_a_dict() -> None:
    c = curve(n1=50.0, n8=80.0)
    data = c.to_dict()
    again = CostCurve.from_mapping({int(n): ms for n, ms in data["ms"].items()}, data["source"])
    assert again == c


def test_estimate_for_this_projects_avx2_cpu_in_float32_is_close_to_the_measurement() -> None:
    # Measured (BRIEF): 8 tokens ~1.55x one, 16 ~2.2x, 32 ~3.1x.
    hw = describe("cpu", "float32", CpuInfo("AMD EPYC", 2, frozenset({"avx2"})))
    c = estimated_curve(estimate(hw), SMOLLM2_135M, "float32")
    assert c.relative(8) == pytest.approx(1.55, rel=0.15)
    assert c.relative(16) == pytest.approx(2.2, rel=0.15)
    assert c.relative(32) == pytest.approx(3.1, rel=0.15)


def test_estimate_says_bf16_without_hardware_support_makes_width_expensive() -> None:
    # Measured (BRIEF): bf16 on the AVX2 CPU: 8 tokens ~3.7x one, 32 ~13x.
    hw = describe("cpu", "bfloat16", CpuInfo("AMD EPYC", 2, frozenset({"avx2"})))
    c = estimated_curve(estimate(hw), SMOLLM2_135M, "bfloat16")
    assert c.relative(8) > 2.5 and c.relative(32) > 8


def test_estimate_says_width_is_nearly_free_on_amx_and_on_an_h100() -> None:
    # Measured (architecture guide): AMX bf16, 64 tokens ~1.6x one.
    amx = describe("cpu", "bfloat16", CpuInfo("Xeon", 2, frozenset({"avx2", "avx512f", "amx_bf16"})))
    assert estimated_curve(estimate(amx), SMOLLM2_135M, "bfloat16").relative(64) < 2.2
    from pardec_cli.hardware import GpuInfo

    h100 = describe("cuda:0", "bfloat16", amx.cpu, [GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 << 30, (9, 0))])
    assert estimated_curve(estimate(h100), ModelShape(8_000_000_000, 32), "bfloat16").relative(64) < 1.3


def test_the_measured_curve_times_each_forward_to_the_end_of_its_device_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a forward returns once its work is queued: the curve waits for the device
    before reading the clock each time, or a CUDA-graph replay's launch is all it times
    (flat: 64 rows as cheap as one, and auto drafted 64-node trees). A fake device: each
    forward of n rows launches in 0.1 ms and queues n ms of work that a synchronize runs."""
    from types import SimpleNamespace

    from pardec_cli import hardware
    from pardec_cli.engine.model import LanguageModel
    from pardec_cli.tuning import curve as curves
    from tests.tiny_models import tiny_llama

    clock = {"now": 0.0, "queued": 0.0}

    class Asynchronous(LanguageModel):
        def forward(self, token_ids, cache, **kwargs):  # type: ignore[no-untyped-def]
            clock["now"] += 0.1e-3
            clock["queued"] += len(token_ids) * 1e-3
            return super().forward(token_ids, cache, **kwargs)

    def synchronize(device: object) -> None:
        clock["now"], clock["queued"] = clock["now"] + clock["queued"], 0.0

    monkeypatch.setattr(hardware, "synchronize_device", synchronize)
    monkeypatch.setattr(curves, "time", SimpleNamespace(perf_counter=lambda: clock["now"], strftime=lambda f: "today"))
    session = SimpleNamespace(target=Asynchronous(tiny_llama(0)))
    measured = curves.measure_curve(session, list(range(3, 40)), points=(1, 4, 16), repeats=2)
    assert measured.base_ms == pytest.approx(1.1)
    assert measured.relative(16) == pytest.approx(16.1 / 1.1)
