"""The search: successive halving over candidates, within a time budget (pure logic).

    screen   every candidate on the first `screen_prompts` prompts; its measured tokens
             per step and drafted tokens per step (exact counts, not timings) and the
             verification cost curve predict its speed; candidates predicted well below
             the best are dropped without spending more time on them
    halving  the survivors run on more and more prompts (doubling each round); each
             round keeps the best 1/eta by measured end-to-end tokens/s relative to
             vanilla's on the same prompts (run interleaved, so drift hits all alike)

A run whose greedy output differs from vanilla's drops its candidate when exactness is
required (float32); otherwise (16-bit, where batched verification may round
differently after a near-tie) the match count is only reported.

Everything the search needs from the outside comes through `measure(label, prompt)`
and `clock()`, so it runs as well on a fake cost surface (tests) as on a real model.
Runs already measured (an earlier, interrupted tune) are reused, never measured again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pardec_cli.selection.costmodel import CostCurve
from pardec_cli.schedule import interleaved
from pardec_cli.selection.tuned import Run

P = TypeVar("P")  # a prompt, as the caller names it (tune: an id; bench: an index)
VANILLA = "vanilla"
# Screening drops candidates predicted slower than this share of the best prediction.
SCREEN_KEEP_RATIO = 0.8


@dataclass(frozen=True)
class SearchConfig:
    """How hard to search. `budget_s` bounds the time spent measuring (wall clock)."""

    budget_s: float
    run_estimate_s: float = 1.0  # expected seconds per run before any was measured
    screen_prompts: int = 1
    eta: int = 2  # each halving round keeps 1/eta of the candidates
    exact: bool = True  # drop candidates whose greedy output differs from vanilla's


@dataclass
class Progress:
    """What the search reports after every run (for a progress bar)."""

    phase: str  # "screen", "round N"
    done: int  # runs measured in this search so far (reused ones not counted)
    planned: int  # runs planned for the current phase and the ones before it
    best: str | None
    best_speedup: float | None
    elapsed_s: float
    remaining_s: float  # of the budget


@dataclass
class Outcome:
    """What the search found: the ranking of the last complete phase, and why it stopped."""

    ranking: list[tuple[str, float]] = field(default_factory=list)  # (label, speed-up), best first
    rounds: dict[str, int] = field(default_factory=dict)  # label -> last round it ran in (0: screen)
    dropped: dict[str, str] = field(default_factory=dict)  # label -> why it left the search
    complete: bool = False
    stop_reason: str = ""

    @property
    def best(self) -> str | None:
        return self.ranking[0][0] if self.ranking else None


class BudgetTooSmall(Exception):
    """Not even the screening phase fits the budget."""


def speedups(runs: Sequence[Run], labels: Sequence[str], prompts: Sequence[str]) -> dict[str, float]:
    """Each label's tokens/s over `prompts` divided by vanilla's over the same prompts."""
    wanted = set(prompts)
    totals: dict[str, list[float]] = {}
    for run in runs:
        if run.prompt in wanted:
            tokens, seconds = totals.setdefault(run.label, [0.0, 0.0])
            totals[run.label] = [tokens + run.tokens, seconds + run.seconds]
    if VANILLA not in totals or totals[VANILLA][1] <= 0 or totals[VANILLA][0] <= 0:
        return {}
    base = totals[VANILLA][0] / totals[VANILLA][1]
    return {label: (t[0] / t[1]) / base for label in labels if (t := totals.get(label)) and t[1] > 0}


def predicted_speedup(runs: Sequence[Run], curve: CostCurve) -> float | None:
    """Speed-up predicted from exact counts: tokens per step over the curve's cost of
    the step (verifying 1 + drafted tokens) plus the measured drafting time."""
    steps = sum(r.steps for r in runs)
    if steps == 0:
        return None
    tokens_per_step = sum(r.tokens - 1 for r in runs) / steps  # the prefill's token is not a step's
    drafted = sum(r.drafted for r in runs) / steps
    draft_ms = sum(r.propose_s for r in runs) / steps * 1000
    return tokens_per_step * curve.base_ms / (curve.ms(1 + drafted) + draft_ms)


class SuccessiveHalving:
    """One search over `labels` (vanilla is added as the reference) on `prompts`.

    `run()` returns the outcome and every run (`previous` ones included). `on_run` is
    called after each new run (to save it); a KeyboardInterrupt raised inside `measure`
    or a callback propagates after nothing is lost: the runs so far went through `on_run`.
    """

    def __init__(
        self,
        labels: Sequence[str],
        prompts: Sequence[str],
        *,
        measure: Callable[[str, str], Run],
        clock: Callable[[], float],
        config: SearchConfig,
        curve: CostCurve,
        previous: Sequence[Run] = (),
        on_run: Callable[[Run], None] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.prompts = list(prompts)
        self.measure, self.clock, self.config, self.curve = measure, clock, config, curve
        self.on_run, self.on_progress = on_run, on_progress
        self.candidates = [label for label in dict.fromkeys(labels) if label != VANILLA]
        self.runs: list[Run] = list(previous)
        self.have = {(r.label, r.prompt) for r in self.runs}
        self.outcome = Outcome()
        self.done = 0  # runs measured by this search (reused ones not counted)
        self.planned = 0  # runs planned for the current phase and the ones before it
        self.seconds_per_run = _seconds_per_run(self.runs, config.run_estimate_s)
        self.start = 0.0

    def remaining(self) -> float:
        """Seconds of the budget left."""
        return self.config.budget_s - (self.clock() - self.start)

    def run(self) -> tuple[Outcome, list[Run]]:
        """Screen, then halve; raises BudgetTooSmall before measuring when not even the screen fits."""
        self.start = self.clock()
        screen = self.prompts[: max(self.config.screen_prompts, 1)]
        survivors = self._screen(screen)
        if survivors is None:
            return self.outcome, self.runs
        self._halve(survivors, screen)
        return self.outcome, self.runs

    # -- phases ---------------------------------------------------------------------------

    def _screen(self, screen: list[str]) -> list[str] | None:
        """Every candidate on the first prompts; the curve predicts, the worst go. None: out of budget."""
        self.planned = len(screen) * (len(self.candidates) + 1)
        needed = self.planned - _already(self.have, [VANILLA, *self.candidates], screen)
        if not _fits(self.config.budget_s, self.seconds_per_run, needed):
            raise BudgetTooSmall(
                f"screening {len(self.candidates)} candidates needs about {self.planned * self.seconds_per_run / 60:.1f} min here"
            )
        if not self._measure_phase("screen", self.candidates, screen):
            self.outcome.stop_reason = "the budget ran out while screening"
            screened = [c for c in self.candidates if all((c, p) in self.have for p in screen)]
            self._finish(screened, screen)
            return None
        survivors = self._drop_mismatches(self.candidates)
        for label in survivors:
            self.outcome.rounds[label] = 0
        predicted = {label: predicted_speedup([r for r in self.runs if r.label == label and r.prompt in screen], self.curve)
                     or 0.0 for label in survivors}
        best_predicted = max(predicted.values(), default=0.0)
        kept = [label for label in survivors if predicted[label] >= SCREEN_KEEP_RATIO * best_predicted]
        for label in survivors:
            if label not in kept:
                self.outcome.dropped[label] = (
                    f"predicted {predicted[label]:.2f}x from its tokens per step and the cost curve, "
                    f"under {SCREEN_KEEP_RATIO:.0%} of the best ({best_predicted:.2f}x)")
        return kept

    def _halve(self, survivors: list[str], used_prompts: list[str]) -> None:
        """Successive halving on measured speed over doubling prompt sets, then the winner
        alone against vanilla on the remaining prompts (a better estimate of its speed-up
        for auto; cut short by the budget, the search still counts as done)."""
        prompts = self.prompts
        round_number = 0
        while survivors and (len(survivors) > 1 or len(used_prompts) < len(prompts)):
            round_number += 1
            if len(survivors) > 1 and len(used_prompts) == len(prompts):
                survivors = _keep(self.outcome, self.runs, survivors, used_prompts, 1, round_number)
                continue
            confirming = len(survivors) == 1
            target = len(prompts) if confirming else min(len(prompts), max(2 * len(used_prompts), len(used_prompts) + 1))
            round_prompts = prompts[:target]
            self.planned += (len(round_prompts) - len(used_prompts)) * (len(survivors) + 1)
            phase = "confirm" if confirming else f"round {round_number}"
            if not self._measure_phase(phase, survivors, round_prompts):
                self.outcome.complete = confirming
                self.outcome.stop_reason = f"the budget ran out ({phase})"
                if confirming:  # rank on the prompts both the winner and vanilla ran on
                    used_prompts = [p for p in round_prompts if (survivors[0], p) in self.have and (VANILLA, p) in self.have]
                self._finish(survivors, used_prompts)
                return
            survivors = self._drop_mismatches(survivors)
            used_prompts = round_prompts
            for label in survivors:
                self.outcome.rounds[label] = round_number
            if len(survivors) > 1:
                keep = 1 if len(used_prompts) == len(prompts) else max(1, math.ceil(len(survivors) / self.config.eta))
                survivors = _keep(self.outcome, self.runs, survivors, used_prompts, keep, round_number)
        self.outcome.complete = True
        self.outcome.stop_reason = "done"
        self._finish(survivors, used_prompts)

    # -- steps --------------------------------------------------------------------------------

    def _measure_phase(self, phase: str, members: list[str], phase_prompts: Sequence[str]) -> bool:
        """Measure what is missing for `members` (and vanilla) on `phase_prompts`,
        interleaved prompt by prompt (`interleaved`); False when the budget ran out first."""
        for index, prompt, label in interleaved([VANILLA, *members], phase_prompts):
            if (label, prompt) in self.have:
                continue
            if self.remaining() < self.seconds_per_run:
                return False
            run = self.measure(label, prompt)
            self.runs.append(run)
            self.have.add((label, prompt))
            self.done += 1
            self.seconds_per_run = _seconds_per_run(self.runs, self.config.run_estimate_s)
            if self.on_run:
                self.on_run(run)
            if self.on_progress:
                ranked = _ranked(self.runs, members, phase_prompts[: index + 1])
                best = ranked[0] if ranked else (None, None)
                self.on_progress(Progress(phase, self.done, self.planned, best[0], best[1], self.clock() - self.start,
                                          max(self.remaining(), 0.0)))
        return True

    def _drop_mismatches(self, members: list[str]) -> list[str]:
        if not self.config.exact:
            return members
        bad = {r.label for r in self.runs if not r.match and r.label in members}
        for label in bad:
            self.outcome.dropped[label] = "its output differed from vanilla's (a bug: please report it)"
        return [m for m in members if m not in bad]

    def _finish(self, members: list[str], prompts: Sequence[str]) -> None:
        """Rank what survived on the prompts every survivor ran on."""
        self.outcome.ranking = _ranked(self.runs, members, prompts)


def successive_halving(labels: Sequence[str], prompts: Sequence[str], **kwargs: Any) -> tuple[Outcome, list[Run]]:
    """`SuccessiveHalving(labels, prompts, **kwargs).run()`."""
    return SuccessiveHalving(labels, prompts, **kwargs).run()


def _keep(outcome: Outcome, runs: list[Run], members: list[str], prompts: Sequence[str], keep: int, round_number: int) -> list[str]:
    """The best `keep` of `members` by measured speed-up; the rest are dropped with a reason."""
    ranked = _ranked(runs, members, prompts)
    for label, value in ranked[keep:]:
        outcome.dropped[label] = f"{value:.2f}x over {len(prompts)} prompts in round {round_number}, behind the best {keep}"
    return [label for label, _ in ranked[:keep]]


def _ranked(runs: Sequence[Run], labels: Sequence[str], prompts: Sequence[str]) -> list[tuple[str, float]]:
    values = speedups(runs, labels, prompts)
    return sorted(((label, values[label]) for label in labels if label in values), key=lambda kv: -kv[1])


def _seconds_per_run(runs: Sequence[Run], estimate: float) -> float:
    """The mean measured run time so far (`estimate` before any run)."""
    return sum(r.seconds for r in runs) / len(runs) if runs else estimate


def _already(have: set[tuple[str, str]], labels: Sequence[str], prompts: Sequence[str]) -> int:
    return sum((label, prompt) in have for label in labels for prompt in prompts)


def _fits(budget_s: float, seconds_per_run: float, runs_needed: int) -> bool:
    return runs_needed <= 0 or budget_s >= seconds_per_run * runs_needed
