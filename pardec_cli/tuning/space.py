"""The candidates `pardec tune` tries for one profile on one machine.

Seeds are the profile's candidates for this hardware class that can run here (the same
filter `--method auto` applies: registered, accelerator installed; one seed per
installed drafter). Around each seed, every knob that declares search values
(`MethodOption.search`) is moved one step down and one step up its list: the
neighbourhood where a better setting for this machine usually is. `--methods` limits
the search to some methods (seeding one that no profile lists with its defaults).

Each candidate is followed by itself sized for this machine's verification cost curve
(`with_curve_sizes`: the size auto's cheap arm would draft at), which is often what
pays on a CPU whose cost grows steeply with the rows verified.

Knobs are normalized (values equal to the method's defaults dropped, combination knobs
written PART.KNOB), so one setting never appears twice under two spellings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pardec_cli.errors import PardecUsageError
from pardec_cli.hardware import Hardware
from pardec_cli.methods.options import MethodOption
from pardec_cli.methods.registry import METHODS, MethodSpec, check_knobs, get_spec
from pardec_cli.selection.profiles import Profile, canonical_knobs, method_label
from pardec_cli.store.accelerators import InstalledAccelerator


@dataclass(frozen=True)
class TuneCandidate:
    """A method and knobs to measure; `label` identifies it in results and runs."""

    method: str
    knobs: tuple[tuple[str, Any], ...]

    @property
    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    @property
    def label(self) -> str:
        return method_label(self.method, self.knob_dict)


def normalize(method: str, knobs: Mapping[str, Any]) -> TuneCandidate:
    """Canonical form: typed values, defaults dropped, a combination's plain knobs
    spread to PART.KNOB for every part that has them."""
    return TuneCandidate(method, canonical_knobs(method, knobs))


def neighbours(candidate: TuneCandidate) -> list[TuneCandidate]:
    """One knob moved one step along its search values, for every searchable knob (not
    to a setting the method rejects: pld's fit with branches)."""
    spec = get_spec(candidate.method)
    current = {o.name: o.default for o in spec.options} | candidate.knob_dict
    found = []
    for option in spec.options:
        for value in _adjacent(option, current[option.name]):
            knobs = {**candidate.knob_dict, option.name: value}
            try:
                check_knobs(candidate.method, knobs)
            except PardecUsageError:
                continue
            found.append(normalize(candidate.method, knobs))
    return found


def _adjacent(option: MethodOption, value: Any) -> list[Any]:
    """The search values just below and just above `value`."""
    values = list(option.search)
    if not values or value is None:
        return []
    below = [v for v in values if v < value]
    above = [v for v in values if v > value]
    return [*below[-1:], *above[:1]]


def candidate_pool(
    profile: Profile,
    hardware: Hardware,
    *,
    accelerators: Sequence[InstalledAccelerator] = (),
    methods: Mapping[str, MethodSpec] = METHODS,
    only: Sequence[str] = (),
    neighbours_too: bool = True,
) -> list[TuneCandidate]:
    """Seeds first (profile order), then (with `neighbours_too`) their neighbours; each setting once."""
    from pardec_cli.selection.selector import unavailable_reason  # the same filter auto applies

    seeds: list[TuneCandidate] = []
    listed = [(c.method, c.knobs) for c in profile.candidates_for(hardware)]
    listed += [(name, {}) for name in only if name not in {m for m, _ in listed}]
    for method, knobs in listed:
        if only and method not in only:
            continue
        if method == "vanilla" or unavailable_reason(method, methods, accelerators) is not None:
            continue
        spec = methods[method.split("+")[0]]
        if "+" not in method and spec.accelerator is not None:
            for acc in accelerators:
                if acc.kind == spec.accelerator:
                    extra = {spec.accelerator_option: acc.ref} if spec.accelerator_option else {}
                    seeds.append(normalize(method, {**knobs, **extra}))
        else:
            seeds.append(normalize(method, knobs))
    pool = list(dict.fromkeys(seeds))
    if not neighbours_too:
        return pool
    for seed in seeds:
        for near in neighbours(seed):
            if near not in pool:
                pool.append(near)
    return pool


def likeliest_first(pool: Sequence[TuneCandidate], estimates: Sequence[Any]) -> list[TuneCandidate]:
    """`pool` by the cost model's expected speed-up (`selection.selector.Estimate`s), best
    first; ties and candidates it did not estimate keep their order, the latter last."""
    expected = {normalize(e.method, dict(e.knobs)).label: e.speedup for e in estimates}
    return sorted(pool, key=lambda c: -expected.get(c.label, 0.0))


def with_curve_sizes(pool: Sequence[TuneCandidate], relative_cost: Callable[[float], float]) -> list[TuneCandidate]:
    """Each candidate followed by itself at the size whose verification costs at most
    `methods.adaptive.CHALLENGER_MAX_COST` plain steps on this curve (`relative_cost(rows)`;
    `methods.adaptive.cheap_knobs`), where that differs; each setting once."""
    from pardec_cli.methods.adaptive import cheap_knobs

    found: list[TuneCandidate] = []
    for candidate in pool:
        for item in (candidate, normalize(candidate.method, cheap_knobs(candidate.method, candidate.knob_dict, relative_cost))):
            if item not in found:
                found.append(item)
    return found
