"""A chi-square goodness-of-fit test without SciPy (Wilson-Hilferty approximation)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping


def chi_square_p_value(observed: Counter, expected_probs: Mapping[Hashable, float], *, min_expected: float = 5.0) -> float:
    """p-value of observed counts against expected probabilities; cells with small expectation are pooled."""
    n = sum(observed.values())
    statistic, dof, pooled_obs, pooled_exp = 0.0, -1, 0.0, 0.0
    for cell, prob in expected_probs.items():
        expected = prob * n
        if expected < min_expected:
            pooled_obs += observed.get(cell, 0)
            pooled_exp += expected
            continue
        statistic += (observed.get(cell, 0) - expected) ** 2 / expected
        dof += 1
    stray = n - sum(observed.get(c, 0) for c in expected_probs)  # outcomes with probability 0
    pooled_obs += stray
    if pooled_exp > 0:
        statistic += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    elif pooled_obs > 0:
        return 0.0
    dof = max(dof, 1)
    z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))
