"""`pardec tune` for one loaded model: curve, then a search per profile, saved as it goes.

    1. find this model's results for this device and dtype (resume) or start new ones;
    2. check the budget can measure anything at all (estimated from one quick probe);
    3. measure the verification cost curve (once per model, device and dtype);
    4. per profile: build the candidate pool (capped so screening fits its share of the
       budget), run the successive-halving search on the profile's prompts, and save
       after every run, so Ctrl-C or a crash loses at most the run in progress.

By default the pool is the profile's own candidates for this hardware, at most
`QUICK_CANDIDATES` of them, the ones the cost model ranks highest on the measured curve
(a useful result in a few minutes); `thorough` adds every
candidate's neighbouring knob settings (the longer search). Either way each candidate is
followed by itself sized for the measured cost curve (`space.with_curve_sizes`).

Generation goes through the session (the one decoding loop); nothing here decodes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

from pardec_cli.selection.costmodel import CostCurve, estimated_curve
from pardec_cli.selection.estimates import estimate as device_estimate
from pardec_cli.errors import PardecUsageError
from pardec_cli.tuning.prompts import TunePrompt, builtin_prompts, file_prompts
from pardec_cli.selection.tuned import Run, TunedCandidate, TunedProfile, TunedResults, write_results
from pardec_cli.tuning.search import VANILLA, BudgetTooSmall, Outcome, Progress, SearchConfig, successive_halving
from pardec_cli.tuning.space import TuneCandidate, candidate_pool, likeliest_first, with_curve_sizes

CURVE_REPEATS = 3
CONTEXT_TOKENS = 300
SCREEN_SHARE = 0.4  # at most this share of a profile's budget goes to screening
QUICK_CANDIDATES = 3  # the quick search's pool per profile: the candidates ranked highest here
SCREEN_RUNS = 3  # the smallest useful search: vanilla and two candidates on one prompt
MIN_TOKENS = 24  # a slow machine's quick tune shortens its runs down to this, rather than refuse
#: Where plain decoding of a run would take less than this, a tune whose token count was
#: not given lengthens its runs (doubling, up to `MAX_RUN_TOKENS`: gen's default reply):
#: prompt lookup's gain grows with the reply it copies from, and 64-token runs told a Zen 5
#: EPYC's tune that nothing beat plain decoding on chat prompts, where pld gained 1.04x at
#: 64 tokens, 1.16x at 160 and 1.10-1.2x on Spec-Bench's at 96 (docs/adaptive.md).
RUN_TARGET_S = 0.5
MAX_RUN_TOKENS = 256


@dataclass
class TuneRequest:
    """What `pardec tune` was asked to do."""

    profiles: list[str]
    budget_s: float
    max_new_tokens: int = 96
    prompts_file: Path | None = None
    methods: list[str] = field(default_factory=list)  # empty: every candidate
    thorough: bool = False  # also the neighbouring knob settings of every candidate
    lengthen: bool = False  # the token count was not given: longer runs where they are quick (`RUN_TARGET_S`)


@dataclass
class TuneEvent:
    """Progress for the front end: the curve ("curve", done, total) or a profile's search."""

    stage: str  # "stage" (what starts now), "curve", "search", "skip", "done", "note"
    profile: str | None = None
    done: int = 0
    total: int = 0
    progress: Progress | None = None
    message: str = ""


def summarize(runs: Sequence[Run], candidates: dict[str, TuneCandidate], outcome: Outcome | None) -> list[TunedCandidate]:
    """Per measured candidate: counts, speed and speed-up over vanilla on the prompts both ran."""
    vanilla = {r.prompt: r for r in runs if r.label == VANILLA}
    summaries = []
    for label, candidate in candidates.items():
        mine = [r for r in runs if r.label == label and r.prompt in vanilla]
        steps = sum(r.steps for r in mine)
        seconds = sum(r.seconds for r in mine)
        base_seconds = sum(vanilla[r.prompt].seconds for r in mine)
        if not mine or not steps or not seconds or not base_seconds:
            continue
        tokens_per_s = sum(r.tokens for r in mine) / seconds
        base = sum(vanilla[r.prompt].tokens for r in mine) / base_seconds
        summaries.append(TunedCandidate(
            method=candidate.method, knobs=candidate.knob_dict,
            tokens_per_step=round(sum(r.tokens - 1 for r in mine) / steps, 4),
            drafted=round(sum(r.drafted for r in mine) / steps, 3),
            draft_ms=round(sum(r.propose_s for r in mine) / steps * 1000, 3),
            tokens_per_s=round(tokens_per_s, 3), speedup=round(tokens_per_s / base, 4),
            prompts=len(mine), matched=sum(r.match for r in mine),
            round=outcome.rounds.get(label, 0) if outcome else 0,
        ))  # fmt: skip
    return sorted(summaries, key=lambda c: (-c.round, -c.speedup))


def mixed(prompts: list[TunePrompt]) -> list[TunePrompt]:
    """`prompts` in a fixed shuffled order. Successive halving decides its first rounds on
    the first few prompts, so those must be a fair sample of the set, and sets are written
    grouped by kind (the built-in code set: new functions first, then edits of given code,
    where longer drafts pay: a 3-minute tune dropped suffix[max_nodes=4] after its first four
    prompts, all new functions, and kept a 2-token prompt lookup)."""
    order = list(prompts)
    random.Random(0).shuffle(order)
    return order


class Tuner:
    """Tunes the model of `session` for `request`, reporting through `on_event`."""

    def __init__(self, session: Any, request: TuneRequest, *, on_event: Callable[[TuneEvent], None] | None = None,
                 clock: Callable[[], float] = perf_counter) -> None:
        from pardec_cli.selection.profiles import load_profiles
        from pardec_cli.selection.selector import AutoSelector

        self.session = session
        self.request = request
        self.on_event = on_event or (lambda event: None)
        self.clock = clock
        self.selector = AutoSelector.for_session(session)
        self.hardware = self.selector.hardware
        self.profiles = load_profiles()
        for name in request.profiles:
            if name not in self.profiles:
                raise PardecUsageError(f"unknown profile {name!r}; choose from: all, {', '.join(self.profiles)}")
        info = self.selector.model
        self.results = self.selector.tuned or TunedResults(info.name, info.fingerprint, self.hardware.key, self.hardware.dtype)
        self.prompts = self._prompts()
        # What one run generates and how often each curve point is timed: the request's,
        # unless a quick tune on a slow (or busy) machine has to measure less to fit, or
        # runs on a fast one are lengthened (`check_budget`): then as an earlier tune here
        # lengthened them, so that it resumes.
        self.max_new_tokens = request.max_new_tokens
        if request.lengthen:
            earlier = [p.max_new_tokens for p in self.results.profiles.values() if p.prompts == self.prompts_source]
            self.max_new_tokens = max([self.max_new_tokens, *earlier])
        self.curve_repeats = CURVE_REPEATS

    # -- inputs ---------------------------------------------------------------------------

    def _prompts(self) -> dict[str, list[TunePrompt]]:
        """Each profile's prompts: built-in, or the file's, split by detected task when
        several profiles are tuned."""
        if self.request.prompts_file is None:
            found = {name: builtin_prompts(name) for name in self.request.profiles}
        else:
            from pardec_cli.selection.tasks import detect_task

            prompts = file_prompts(self.request.prompts_file)
            if len(self.request.profiles) == 1:
                found = {self.request.profiles[0]: prompts}
            else:
                found = {name: [p for p in prompts if detect_task(p.text).profile == name] for name in self.request.profiles}
        for name, prompts in found.items():
            if not prompts:
                where = f"{self.request.prompts_file} has no {name} prompts" if self.request.prompts_file else \
                    f"profile {name!r} has no built-in tuning prompts"
                raise PardecUsageError(where, hint="pass --prompts FILE.jsonl with prompts of that kind")
        return {name: mixed(prompts) for name, prompts in found.items()}

    @property
    def prompts_source(self) -> str:
        return str(self.request.prompts_file) if self.request.prompts_file else "built-in"

    # -- estimates --------------------------------------------------------------------------

    def probe_ms(self) -> float:
        """One-token forward time, measured now (about a second): a saved curve's may be
        stale when the machine is busier or quieter than when it was measured. Timed as the
        curve is (`measure_curve`: on a GPU, to the end of the work)."""
        from pardec_cli.tuning.curve import measure_curve

        ids = self.session.encode(next(iter(self.prompts.values()))[0].text)[:64]
        return measure_curve(self.session, ids, points=(1,), repeats=3).base_ms

    def run_estimate_s(self, base_ms: float) -> float:
        """Seconds one vanilla generation of `max_new_tokens` takes here, roughly."""
        return self.max_new_tokens * base_ms / 1000 * 1.15 + 0.05

    def curve_estimate_s(self, base_ms: float) -> float:
        """Seconds measuring the curve takes: the estimated curve's shape at the probed speed."""
        if self.results.curve is not None:
            return 0.0
        from pardec_cli.selection.costmodel import CURVE_POINTS

        estimate = estimated_curve(device_estimate(self.hardware), self.selector.model.shape, self.hardware.dtype)
        return self.curve_repeats * sum(estimate.relative(n) for n in CURVE_POINTS) * base_ms / 1000 + 1.0

    def check_budget(self) -> tuple[float, float]:
        """(probe ms, seconds per run); a budget that cannot measure anything is an error.

        A quick tune on a machine too slow (or too busy) for its budget measures less
        instead: each curve point timed once, and runs shortened (not below
        `MIN_TOKENS`) until the curve and three runs take at most half the budget. On a
        quick machine, runs whose length was not given are lengthened (`RUN_TARGET_S`).
        """
        base_ms = self.probe_ms()
        per_token_s = base_ms / 1000 * 1.15  # as `run_estimate_s` counts a run
        run_s = self.run_estimate_s(base_ms)
        minimum = self.curve_estimate_s(base_ms) + 3 * run_s  # the curve, vanilla and two candidates once
        if self.request.budget_s < 2 * minimum and not self.request.thorough:
            self.curve_repeats = 1
            room = self.request.budget_s / 2 - self.curve_estimate_s(base_ms)
            fitting = int(room / 3 / per_token_s) if room > 0 else 0
            self.max_new_tokens = min(self.max_new_tokens, max(MIN_TOKENS, fitting))
            run_s = self.run_estimate_s(base_ms)
            minimum = self.curve_estimate_s(base_ms) + 3 * run_s
            if self.max_new_tokens < self.request.max_new_tokens:
                self.on_event(TuneEvent("note", message=f"this machine is slow for a {self.request.budget_s / 60:g}-minute "
                                        f"budget: {self.max_new_tokens} tokens a run, the curve timed once"))
        elif self.request.lengthen and self.max_new_tokens == self.request.max_new_tokens:
            while self.max_new_tokens * 2 <= MAX_RUN_TOKENS and self.max_new_tokens * 2 * per_token_s <= RUN_TARGET_S \
                    and 3 * self.run_estimate_s(base_ms) * 2 <= self.request.budget_s / 2:
                self.max_new_tokens *= 2
            if self.max_new_tokens > self.request.max_new_tokens:
                run_s = self.run_estimate_s(base_ms)
                self.on_event(TuneEvent("note", message=f"plain decoding is quick here: {self.max_new_tokens} tokens a run, "
                                        "nearer the replies auto will choose for"))
        if self.request.budget_s < minimum:
            raise PardecUsageError(
                f"a budget of {self.request.budget_s / 60:.1f} min is too small to measure anything here: "
                f"the cost curve and one prompt for vanilla and two candidates take about {minimum / 60:.1f} min",
                hint=f"give at least --budget {max(1, round(minimum / 60 + 0.5))} (a few times that finds better settings)",
            )
        return base_ms, run_s

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> TunedResults:
        """Tune every requested profile; results are saved as they come."""
        self.on_event(TuneEvent("stage", message="warming up"))
        # Compiling (compiled runner) is not measuring: outside the budget; every cache size the prompts need.
        contexts = [len(self.session.encode(p.text)) + self.max_new_tokens for prompts in self.prompts.values() for p in prompts]
        self.session.target.warm(contexts=contexts)
        started = self.clock()
        todo = [name for name in self.request.profiles if not self._already_done(name)]
        if not todo and self.results.curve is not None:
            return self.results
        self.on_event(TuneEvent("stage", message="timing one forward"))
        warmed = self.max_new_tokens
        _, run_s = self.check_budget()
        if self.max_new_tokens > warmed:  # lengthened runs: longer caches to warm, outside the budget too
            self.session.target.warm(contexts=[c - warmed + self.max_new_tokens for c in contexts])
            started = self.clock()
        if self.results.curve is None:
            self.on_event(TuneEvent("stage", message="cost curve"))
            self.results.curve = self._measure_curve()
            self._save()
            self._share_curve(self.results.curve)
        curve = self.results.curve
        for index, name in enumerate(todo):
            left = self.request.budget_s - (self.clock() - started)
            # An equal share, unless that cannot screen anything (vanilla and two candidates
            # on one prompt) while the whole rest could: then the earlier profiles get what
            # they need and the later ones what is left (a slow machine tunes some
            # profiles rather than none).
            share = max(left / (len(todo) - index), min(left, SCREEN_RUNS * run_s))
            self._tune_profile(name, share, curve, run_s)
        return self.results

    def _already_done(self, name: str) -> bool:
        done = self.results.profiles.get(name)
        if done is not None and done.complete and done.prompts == self.prompts_source \
                and done.max_new_tokens in (self.request.max_new_tokens, self.max_new_tokens):
            self.on_event(TuneEvent("skip", name, message=f"{name}: already tuned ({done.best}); "
                                    "`pardec tune --reset` to measure again"))
            return True
        return False

    def _share_curve(self, curve: CostCurve) -> None:
        """Keep the curve for later sessions with the same kind of step too (learned.json:
        tune's results are not keyed by step kind, a compiled tune and an eager `gen` differ)."""
        from pardec_cli.selection.learned import keep_session_curve, learning_enabled

        if learning_enabled():
            keep_session_curve(self.session, curve)

    def _measure_curve(self) -> CostCurve:
        from pardec_cli.tuning.curve import measure_curve

        prompt = next(iter(self.prompts.values()))[0].text
        context = self.session.encode(prompt * (CONTEXT_TOKENS // 40 + 1))[:CONTEXT_TOKENS]
        return measure_curve(self.session, context, repeats=self.curve_repeats,
                             on_point=lambda done, total: self.on_event(TuneEvent("curve", done=done, total=total)))

    def _tune_profile(self, name: str, budget_s: float, curve: CostCurve, run_s: float) -> None:
        from pardec_cli.tuning.evaluate import SessionEvaluator

        profile = self.profiles[name]
        previous = self.results.profiles.get(name)
        if previous is not None and (previous.prompts != self.prompts_source or previous.max_new_tokens != self.max_new_tokens):
            self.on_event(TuneEvent("note", name, message=f"{name}: prompts or token count changed; starting over"))
            previous = None
        tuned = previous or TunedProfile(name, prompts=self.prompts_source, max_new_tokens=self.max_new_tokens)
        tuned.budget_s = round(tuned.budget_s + budget_s, 1)
        self.results.profiles[name] = tuned

        pool = candidate_pool(profile, self.hardware, accelerators=self.selector.accelerators, only=self.request.methods,
                              neighbours_too=self.request.thorough)
        if not self.request.thorough:
            # The ones the priors rank highest on this machine's curve, not the profile's
            # first: on a Zen 4 EPYC the fourth cpu candidate, pld[num_draft=2], was the
            # best fixed configuration in 10 of 13 Spec-Bench categories.
            from pardec_cli.methods.registry import METHODS
            from pardec_cli.selection.selector import prior_estimates

            estimates = prior_estimates(hardware=self.hardware, model=self.selector.model.shape, profile=profile, greedy=True,
                                        accelerators=self.selector.accelerators, curve=curve, methods=METHODS)  # fmt: skip
            pool = likeliest_first(pool, estimates)[:QUICK_CANDIDATES]
        pool = with_curve_sizes(pool, curve.relative)
        if not pool:
            self.on_event(TuneEvent("note", name, message=f"{name}: no candidate method can run here; skipped"))
            return
        measured = {r.label for r in tuned.runs}
        cap = max(2, int(budget_s * SCREEN_SHARE / run_s) - 1)
        # Candidates measured before (resume) stay in, whatever the cap says.
        pool = [c for c in pool if c.label in measured] + [c for c in pool if c.label not in measured]
        pool = pool[: max(cap, sum(c.label in measured for c in pool))]
        candidates = {c.label: c for c in pool}
        prompts = self.prompts[name]
        evaluator = SessionEvaluator(self.session, prompts, pool, max_new_tokens=self.max_new_tokens)
        start = self.clock()
        self.on_event(TuneEvent("stage", name, message=f"{name}: {len(pool)} candidates on {len(prompts)} prompts"))

        def on_run(run: Run) -> None:
            tuned.runs.append(run)
            tuned.spent_s = round(tuned.spent_s + run.seconds, 3)
            tuned.candidates = summarize(tuned.runs, candidates, None)
            self._save()

        def on_progress(progress: Progress) -> None:
            self.on_event(TuneEvent("search", name, progress=progress))

        config = SearchConfig(budget_s=budget_s, run_estimate_s=run_s, exact=self.hardware.dtype == "float32")
        previous_runs = [r for r in tuned.runs if r.label in candidates or r.label == VANILLA]
        try:
            outcome, runs = successive_halving(
                list(candidates), [p.prompt_id for p in prompts], measure=evaluator.measure, clock=self.clock,
                config=config, curve=curve, previous=previous_runs, on_run=on_run, on_progress=on_progress,
            )
        except BudgetTooSmall as exc:
            self.on_event(TuneEvent("note", name, message=f"{name}: not tuned: its share of the budget is too small ({exc})"))
            return
        tuned.candidates = summarize(runs, candidates, outcome)
        tuned.best = outcome.best
        tuned.complete = outcome.complete
        self._save()
        self.on_event(TuneEvent("done", name, message=outcome.stop_reason, done=int(self.clock() - start)))

    def _save(self) -> None:
        write_results(self.results)


def describe_results(results: TunedResults, *, applies: bool | None = None) -> list[str]:
    """`pardec tune --show` lines for one results file."""
    here = "" if applies is None else ("  (applies here)" if applies else "  (not for this machine/model: not used)")
    lines = [f"{results.model} on {results.device}, {results.dtype}{here}",
             f"  file      {results.path}", f"  updated   {results.updated}"]
    if results.curve is not None:
        lines.append(f"  curve     verifying n tokens costs {results.curve.describe((8, 16, 32, 64))} one "
                     f"(1 token: {results.curve.base_ms:.1f} ms)")
    for name, profile in results.profiles.items():
        state = "complete" if profile.complete else "incomplete (run `pardec tune` again to continue)"
        lines.append(f"  {name:<10} {state}; {len(profile.runs)} runs over {profile.prompts} prompts, "
                     f"{profile.max_new_tokens} tokens each")
        lines += ["    " + line for line in describe_profile(profile)]
    return lines


def describe_profile(profile: TunedProfile) -> list[str]:
    """What tune measured for one profile, in plain words, and only then the best."""
    from pardec_cli.selection.tuned import candidate_measurement

    measured = sorted(((c, candidate_measurement(profile, c)) for c in profile.candidates if c.method != "vanilla"),
                      key=lambda cm: -cm[1].speedup)
    lines = []
    for c, m in measured:
        spread = f" ({m.low:.2f}-{m.high:.2f})" if m.runs > 1 else ""
        lines.append(f"{c.label}: {m.tokens_per_step:.2f} tokens per step, {m.speedup:.2f}x plain decoding{spread} "
                     f"over {m.runs} prompt{'s' * (m.runs != 1)}, {c.matched}/{c.prompts} outputs equal to plain decoding's")
    if not measured:
        return ["nothing measured yet"]
    best = profile.best_measured()  # as auto ranks them, not the search's last round
    if best is not None:
        lines.append(f"best: {best.label} ({best.speedup:.2f}x plain decoding, {best.tokens_per_s:.1f} tok/s)")
    else:
        lines.append("best: plain decoding (nothing measured beat it)")
    return lines
