"""The tune search on a fake cost surface: finds the optimum, respects the budget, resumes."""

from __future__ import annotations

import random

import pytest

from pardec_cli.selection.costmodel import CostCurve
from pardec_cli.selection.tuned import Run
from pardec_cli.tuning.search import (
    VANILLA, BudgetTooSmall, SearchConfig, predicted_speedup, speedups, successive_halving,
)

TOKENS = 64
VANILLA_TOKENS_PER_S = 20.0
# The fake machine: verifying n tokens costs 1 + 0.05 (n - 1) times one token.
CURVE = CostCurve.from_mapping({1: 50.0, 65: 50.0 * (1 + 0.05 * 64)}, "fake")
# Candidate -> (tokens per step, drafted tokens per step): the speed follows from the curve.
SURFACE = {
    "tree[nodes=4]": (1.5, 4.0),  # 1.5 / 1.20 = 1.25x
    "tree[nodes=8]": (1.9, 8.0),  # 1.9 / 1.40 = 1.36x
    "tree[nodes=16]": (2.6, 16.0),  # the optimum: 2.6 / 1.80 = 1.44x
    "tree[nodes=32]": (2.7, 32.0),  # 2.7 / 2.60 = 1.04x
    "tree[nodes=64]": (2.9, 64.0),  # 2.9 / 4.20 = 0.69x
    "chain[k=4]": (1.5, 4.0),  # 1.25x
    "hopeless": (1.05, 30.0),  # 0.42x
}
PROMPTS = [f"p{i}" for i in range(16)]


def true_speedup(label: str) -> float:
    if label == VANILLA:
        return 1.0
    tokens_per_step, drafted = SURFACE[label]
    return tokens_per_step / CURVE.relative(1 + drafted)


class FakeMachine:
    """A clock and a `measure` that follow the surface, with a little seeded noise."""

    def __init__(self, noise: float = 0.02, seed: int = 0, mismatch: set[str] = frozenset(), fail_after: int | None = None):
        self.now = 0.0
        self.rng = random.Random(seed)
        self.noise, self.mismatch, self.fail_after = noise, mismatch, fail_after
        self.measured: list[tuple[str, str]] = []

    def clock(self) -> float:
        return self.now

    def measure(self, label: str, prompt: str) -> Run:
        if self.fail_after is not None and len(self.measured) >= self.fail_after:
            raise KeyboardInterrupt
        self.measured.append((label, prompt))
        speed = VANILLA_TOKENS_PER_S * true_speedup(label) * (1 + self.rng.uniform(-self.noise, self.noise))
        seconds = TOKENS / speed
        self.now += seconds
        tokens_per_step, drafted = SURFACE.get(label, (1.0, 0.0))
        steps = round((TOKENS - 1) / tokens_per_step)
        return Run(label, prompt, TOKENS, seconds, steps, round(drafted * steps), 0.0, label not in self.mismatch)


def search(machine: FakeMachine, budget_s: float, labels=tuple(SURFACE), previous=(), exact=True, on_run=None):
    return successive_halving(
        labels, PROMPTS, measure=machine.measure, clock=machine.clock, curve=CURVE, previous=previous, on_run=on_run,
        config=SearchConfig(budget_s=budget_s, run_estimate_s=TOKENS / VANILLA_TOKENS_PER_S, exact=exact),
    )


def test_the_fake_surface_has_one_optimum() -> None:
    ranked = sorted(SURFACE, key=true_speedup, reverse=True)
    assert ranked[:2] == ["tree[nodes=16]", "tree[nodes=8]"]
    assert true_speedup(ranked[0]) > 1.05 * true_speedup(ranked[1])


def test_finds_the_optimum_with_a_generous_budget() -> None:
    machine = FakeMachine()
    outcome, runs = search(machine, budget_s=3600)
    assert outcome.complete and outcome.best == "tree[nodes=16]"
    assert outcome.ranking[0][1] == pytest.approx(true_speedup("tree[nodes=16]"), rel=0.05)
    # Smarter than a grid: far fewer runs than every candidate on every prompt.
    assert len(runs) < 0.6 * (len(SURFACE) + 1) * len(PROMPTS)
    # The winner was confirmed on every prompt.
    assert {r.prompt for r in runs if r.label == outcome.best} == set(PROMPTS)


def test_screening_drops_what_the_cost_curve_predicts_to_be_slow() -> None:
    outcome, runs = search(FakeMachine(), budget_s=3600)
    for label in ("hopeless", "tree[nodes=64]"):
        assert "predicted" in outcome.dropped[label]
        assert len([r for r in runs if r.label == label]) == 1  # screened once, never again


def test_predicted_speedup_comes_from_counts_and_the_curve() -> None:
    run = Run("x", "p", 261, 9.9, 100, 1600, 0.0, True)  # 2.6 tokens and 16 drafted per step after the first
    assert predicted_speedup([run], CURVE) == pytest.approx(true_speedup("tree[nodes=16]"))


@pytest.mark.parametrize("budget_s", [30.0, 60.0, 120.0, 300.0])
def test_respects_the_budget(budget_s: float) -> None:
    machine = FakeMachine()
    outcome, runs = search(machine, budget_s=budget_s)
    longest_run = max(r.seconds for r in runs)
    assert machine.now <= budget_s + longest_run
    assert outcome.ranking, "a budget that fits the screening always gives a ranking"


def test_a_budget_too_small_to_screen_says_so_before_measuring() -> None:
    machine = FakeMachine()
    with pytest.raises(BudgetTooSmall, match="screening 7 candidates needs about"):
        search(machine, budget_s=5.0)
    assert machine.measured == []


def test_resumes_after_an_interruption_without_measuring_anything_twice() -> None:
    saved: list[Run] = []
    first = FakeMachine(fail_after=20)
    with pytest.raises(KeyboardInterrupt):
        search(first, budget_s=3600, on_run=saved.append)
    assert len(saved) == 20  # every finished run reached on_run before the interrupt
    second = FakeMachine(seed=1)
    outcome, runs = search(second, budget_s=3600, previous=saved)
    assert not set(second.measured) & {(r.label, r.prompt) for r in saved}
    assert outcome.complete and outcome.best == "tree[nodes=16]"
    assert len({(r.label, r.prompt) for r in runs}) == len(runs)


def test_a_candidate_whose_output_differs_from_vanilla_is_dropped_when_exactness_is_required() -> None:
    outcome, _ = search(FakeMachine(mismatch={"tree[nodes=16]"}), budget_s=3600)
    assert "differed from vanilla" in outcome.dropped["tree[nodes=16]"]
    assert outcome.best == "tree[nodes=8]"
    relaxed, _ = search(FakeMachine(mismatch={"tree[nodes=16]"}), budget_s=3600, exact=False)
    assert relaxed.best == "tree[nodes=16]"


def test_speedups_compare_against_vanilla_on_the_same_prompts() -> None:
    runs = [Run(VANILLA, "a", 100, 10.0, 99, 0, 0.0, True), Run(VANILLA, "b", 100, 30.0, 99, 0, 0.0, True),
            Run("x", "a", 100, 5.0, 50, 100, 0.0, True)]
    assert speedups(runs, ["x"], ["a"]) == {"x": pytest.approx(2.0)}
    assert speedups(runs, ["x"], ["a", "b"])["x"] == pytest.approx((100 / 5) / (200 / 40))


def test_the_shared_schedule_runs_prompt_by_prompt_rotating_the_order() -> None:
    from pardec_cli.schedule import interleaved

    assert interleaved(["vanilla", "a", "b"], ["p1", "p2", "p3", "p4"]) == [
        (0, "p1", "vanilla"), (0, "p1", "a"), (0, "p1", "b"),
        (1, "p2", "a"), (1, "p2", "b"), (1, "p2", "vanilla"),
        (2, "p3", "b"), (2, "p3", "vanilla"), (2, "p3", "a"),
        (3, "p4", "vanilla"), (3, "p4", "a"), (3, "p4", "b"),
    ]


def test_the_search_object_reports_what_it_did() -> None:
    from pardec_cli.tuning.search import SuccessiveHalving

    machine = FakeMachine()
    search_ = SuccessiveHalving(tuple(SURFACE), PROMPTS, measure=machine.measure, clock=machine.clock,
                                config=SearchConfig(budget_s=3600, run_estimate_s=TOKENS / VANILLA_TOKENS_PER_S),
                                curve=CURVE)
    outcome, runs = search_.run()
    assert search_.done == len(runs) and outcome is search_.outcome
    assert search_.planned >= search_.done and outcome.complete
