"""How long a forward pass takes, as a function of how many tokens it verifies.

Parallel decoding trades work for steps: a step that verifies n drafted tokens costs
more than a one-token step, and pays off only when it emits more tokens than that extra
cost. The *verification cost curve* says how much more: the time of one target forward
over n new tokens (on top of a realistic context), known at a few n and interpolated.

`pardec tune` measures the curve on the user's machine (`CostCurve.measured`); until
then `estimated_curve` derives one from the model's size and a `DeviceEstimate`
(`pardec_cli.hardware`): fixed per-layer overhead + reading the weights once + the
arithmetic of n tokens. Torch-free.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pardec_cli.selection.estimates import DeviceEstimate

# The n at which curves are estimated and measured (new tokens per forward).
CURVE_POINTS: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
_BYTES_PER_PARAM = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


@dataclass(frozen=True)
class ModelShape:
    """What the cost of a forward depends on: parameter count and depth."""

    parameters: int
    layers: int

    @classmethod
    def from_config_summary(cls, summary: Mapping[str, Any]) -> ModelShape | None:
        """From `store.inventory.config_summary` (files only, no torch); None when unknown."""
        params, layers = summary.get("parameters"), summary.get("layers")
        if not params or not layers:
            return None
        return cls(int(params), int(layers))


def forward_ms(estimate: DeviceEstimate, shape: ModelShape, dtype: str, n: int) -> float:
    """Estimated time of one forward over `n` new tokens, in milliseconds."""
    weight_bytes = shape.parameters * _BYTES_PER_PARAM.get(dtype, 4.0)
    overhead = shape.layers * estimate.overhead_ms_per_layer
    memory = weight_bytes / (estimate.bandwidth_gbs * 1e9) * 1e3
    compute = n * 2.0 * shape.parameters / (estimate.gflops * 1e9) * 1e3
    return overhead + memory + compute


@dataclass(frozen=True)
class CostCurve:
    """Forward time in ms at a few token counts n (sorted, n >= 1, n = 1 included).

    Between points the time is interpolated linearly; beyond the last point it grows
    with the slope of the last segment (the arithmetic part keeps growing linearly).
    """

    points: tuple[tuple[int, float], ...]
    source: str  # for people: "estimated from ...", "measured by pardec tune on ..."
    # What each row's forward costs more per 1000 tokens of text beyond `context_tokens`,
    # the text the points were measured after (every row attends to all of it; 0: not
    # measured). On the Zen 4 EPYC's native step 4 rows cost 1.1x one after 300 tokens,
    # 2x after 2000 (docs/auto.md).
    context_tokens: int = 0
    row_ms_per_1k: float = 0.0

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 1:
            raise ValueError("a cost curve needs its n=1 point first")
        if any(b[0] <= a[0] for a, b in zip(self.points, self.points[1:])):
            raise ValueError("cost curve points must have increasing n")
        if any(ms <= 0 for _, ms in self.points):
            raise ValueError("cost curve times must be positive")

    @classmethod
    def from_mapping(cls, times: Mapping[int, float], source: str) -> CostCurve:
        return cls(tuple(sorted((int(n), float(ms)) for n, ms in times.items())), source)

    @property
    def base_ms(self) -> float:
        """One-token forward: what plain decoding pays per token."""
        return self.points[0][1]

    def ms(self, n: float) -> float:
        """Time of a forward over `n` new tokens (n may be fractional: a mean)."""
        n = max(float(n), 1.0)
        ns = [p[0] for p in self.points]
        if len(self.points) == 1:
            return self.points[0][1] * n  # no slope known: assume linear (pessimistic)
        i = bisect.bisect_left(ns, n)
        if i < len(ns) and ns[i] == n:
            return self.points[i][1]
        lo, hi = (self.points[-2], self.points[-1]) if i >= len(ns) else (self.points[i - 1], self.points[i])
        slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
        return max(lo[1] + slope * (n - lo[0]), self.points[0][1])

    def ms_at(self, n: float, context: int) -> float:
        """`ms(n)` for a forward after `context` tokens of text: each of its n rows costs
        `row_ms_per_1k` more per 1000 tokens beyond the curve's own (never less)."""
        extra = max(context - self.context_tokens, 0) / 1000 * self.row_ms_per_1k
        return self.ms(n) + max(float(n), 1.0) * extra

    def relative(self, n: float) -> float:
        """Cost of verifying `n` new tokens relative to one: 1.0 at n = 1."""
        return self.ms(n) / self.base_ms

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "ms": {str(n): round(ms, 3) for n, ms in self.points}}

    def describe(self, ns: Iterable[int] = (8, 16, 32)) -> str:
        """'8: 1.5x, 16: 2.2x, 32: 3.0x' for explanations."""
        return ", ".join(f"{n}: {self.relative(n):.1f}x" for n in ns)


def estimated_curve(estimate: DeviceEstimate, shape: ModelShape, dtype: str) -> CostCurve:
    """The curve `forward_ms` predicts at `CURVE_POINTS`."""
    times = {n: forward_ms(estimate, shape, dtype, n) for n in CURVE_POINTS}
    return CostCurve.from_mapping(times, f"estimated from {estimate.source}; `pardec tune` measures it")
