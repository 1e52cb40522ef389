"""Adaptive decoding: switch while decoding among a few configurations (arms) by measured speed.

`--method auto` chooses a configuration per prompt from a cost model and priors; this
proposer checks that choice on the job. Its arms are full proposers (by default auto's
choice at its size and at half of it, plus plain decoding); each step one arm drafts and
the loop verifies as always, so the output is what any arm alone gives: greedy stays
token-for-token exact, sampling keeps the target's distribution. Only the speed changes.

The policy (`SwitchPolicy`, see docs/adaptive.md): per arm, discounted tokens per step
over discounted seconds per step (the step's drafting, target forward, verification and
update, timed between `propose` and the end of `update`). Every arm first runs a short
`probe`, the incumbent (auto's choice) first; after each run the fastest measured arm
becomes the incumbent if it beats the current one by more than `margin` (hysteresis:
measurement noise does not flip-flop) and runs `dwell` steps; an arm idle for `reprobe`
steps is probed again. An idle arm that can be dry-run (`Proposer.dry_runs`) drafts
every `DRY_EVERY` steps unverified; the tokens that follow score that draft, so its
tokens per step stay current without running it, and it is re-timed only rarely.

Arms that are not drafting stay consistent: every arm's `update` is called every step,
the idle ones with `EMPTY_DRAFT` and the step's shared facts (the new context, the
target's top tokens at every input, hidden states of the kept positions), as a `+`
combination feeds a part that drafted nothing. Their indexes catch up lazily (suffix
tries, n-gram indexes, drafter caches) or learn from every step (recycling's table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from math import ceil
from time import perf_counter
from typing import TYPE_CHECKING, Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Needs, Outcome, Proposer, StartContext, fit_to_tiles
from pardec_cli.engine.tree import kept_along
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import ProposerBase

if TYPE_CHECKING:
    from pardec_cli.methods.base import MethodEnv

ARM_SEPARATOR = "|"
# Per observation, older steps of an arm weigh this much less: its estimate follows the
# last ~7 steps it ran (acceptance changes as the text moves from copying to new prose).
DECAY = 0.85
# A re-probed arm's old evidence weighs this much against its fresh steps: the text has
# moved on since it was measured (a translation that turns to copying names).
STALE = 0.25
# The sizes auto's choice runs at, as shares of the size it chose (plus plain decoding).
#: See `challenger_arm`: the challenger of plain decoding, and the smaller arm of a choice.
CHALLENGER_SHARES = (1.0, 0.5, 0.25)
SMALLER_SHARES = (0.5, 0.25)
#: A choice that verifies cheaply, or whose method can be dry-run, also runs this many
#: times larger, up to the method's default size (`sibling_arms`): text that turns out to
#: copy well (a code edit) pays for the longer drafts tune's own prompts did not.
LARGER_SHARE = 4.0
CHALLENGER_MAX_COST = 1.5


# An arm that can be dry-run (`Proposer.dry_runs`) drafts, unverified, at most every this
# many steps while idle: its would-be tokens per step stay current for a few hundred
# microseconds of drafting, so it needs no re-probe to be found again.
DRY_EVERY = 2
# ... and less often when its drafting is slow: each idle arm's dry runs may take this
# share of a plain step's time on average (suffix drafting over code took up to 3 ms, a
# quarter of a 13 ms step: two such arms every other step made auto 16% slower than plain
# decoding while it was running plain decoding).
DRY_BUDGET = 0.02
# A step drafting more nodes than any step timed so far is guessed to cost this share of
# the cheapest step timed per extra node (the compiled bf16 step on a 2-core CPU without AMX: 8 nodes
# cost 1.9x one token; flatter on AMX and GPUs): an arm is then tried, and timed.
UNTIMED_NODE_SHARE = 0.125
# A dry-run arm's cost (seconds per step) is re-measured this many times less often than
# an idle arm that cannot be dry-run is re-probed: costs change slowly, texts quickly.
DRY_REPROBE_FACTOR = 4


@dataclass
class ArmStats:
    """One arm's running estimate: discounted sums of the tokens its steps emitted and the
    seconds they took, and, when it can be dry-run, of the tokens its unverified drafts
    would have emitted and the seconds such steps cost (`StepCosts`)."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0  # steps it ran in this generation
    dry_runs: int = 0  # its drafts scored while idle, in this generation
    last_step: int = -1  # the policy step it last ran

    @property
    def rate(self) -> float:
        """Estimated tokens per second (0 until measured)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class StepCosts:
    """What a step costs by draft size, from the steps every arm ran: discounted mean
    seconds per size class (0 drafted nodes: a plain step; then 1, 2, 3-4, 5-8, ...).

    A dry run is charged the cost of a step of its own draft's size: an arm that would
    draft 8 junk nodes is charged an 8-node verification, not the plain steps it ran
    while it had nothing to draft."""

    def __init__(self, decay: float = DECAY) -> None:
        self.decay = decay
        self._sums: dict[int, list[float]] = {}  # size class -> [discounted seconds, weight]
        self._means: dict[int, float] = {}  # size class -> its mean (asked for several times a step)

    @staticmethod
    def size_class(drafted: int) -> int:
        return 0 if drafted <= 0 else (drafted - 1).bit_length() + 1

    def add(self, drafted: int, seconds: float) -> None:
        size = self.size_class(drafted)
        entry = self._sums.setdefault(size, [0.0, 0.0])
        entry[0] = entry[0] * self.decay + seconds
        entry[1] = entry[1] * self.decay + 1
        self._means[size] = entry[0] / entry[1]

    def estimate(self, drafted: int) -> float | None:
        """Seconds of a step drafting `drafted` nodes: its size class's mean, interpolated
        linearly between the classes timed around it; above every class timed, the largest
        one's plus `UNTIMED_NODE_SHARE` of the smallest per extra node. None below every
        class timed (a plain step's cost is never guessed from a verification's)."""
        want = self.size_class(drafted)
        means = self._means
        below = max((c for c in means if c <= want), default=None)
        if below is None:
            return None
        above = min((c for c in means if c >= want), default=None)
        if above is None:
            extra = drafted - (0 if below == 0 else 2 ** (below - 1))  # nodes beyond the largest class timed
            return means[below] + UNTIMED_NODE_SHARE * means[min(means)] * max(extra, 0)
        if above == below:
            return means[below]
        share = (want - below) / (above - below)
        return means[below] + share * (means[above] - means[below])


class SwitchPolicy:
    """Which arm drafts the next step. Pure: observations in, arm indices out (no clock)."""

    def __init__(
        self, arms: int, *, dwell: int, probe: int, reprobe: int, margin: float, decay: float = DECAY,
        dry: Sequence[bool] = (),
    ) -> None:
        if arms < 1 or dwell < 1 or probe < 1 or reprobe < 1 or margin < 0:
            raise PardecUsageError(
                f"adaptive needs dwell, probe and reprobe >= 1 and margin >= 0, got {dwell}, {probe}, {reprobe}, {margin}"
            )
        self.size, self.dwell, self.probe, self.reprobe, self.margin, self.decay = arms, dwell, probe, reprobe, margin, decay
        # Arms whose tokens per step are also observed while idle (dry runs): re-probed rarely.
        self.dry = tuple(dry) or (False,) * arms
        # Step costs are the machine's, not the text's: kept across generations; so is the
        # size each arm drafted last (what its probe will cost).
        self.costs = StepCosts(decay)
        self.drafts: list[int | None] = [None] * arms
        self.reset()

    def reset(self) -> None:
        """Forget the arms' estimates (a new generation): arm 0 is the incumbent again."""
        self.stats = [ArmStats() for _ in range(self.size)]
        self.incumbent = self.current = 0
        self.step = 0
        self._left = 0  # steps left in the current run

    def next_arm(self) -> int:
        """The arm that drafts the next step."""
        self.step += 1
        if self._left == 0:
            self.current, self._left = self._decide()
        self._left -= 1
        self.stats[self.current].last_step = self.step
        return self.current

    def observe(self, arm: int, tokens: int, seconds: float, drafted: int = 0) -> None:
        """A step of `arm` that drafted `drafted` nodes emitted `tokens` tokens in `seconds`."""
        seconds = max(seconds, 1e-9)
        self._add(arm, tokens, seconds)
        self.costs.add(drafted, seconds)
        self.stats[arm].steps += 1
        self.drafts[arm] = drafted

    def observe_dry(self, arm: int, tokens: int, drafted: int) -> None:
        """Idle `arm`'s unverified draft of `drafted` nodes would have emitted `tokens`
        tokens (ignored while no step of that size was timed)."""
        self.drafts[arm] = drafted
        seconds = self.costs.estimate(drafted)
        if seconds is not None:
            self._add(arm, tokens, seconds)
            self.stats[arm].dry_runs += 1

    def _add(self, arm: int, tokens: float, seconds: float) -> None:
        s = self.stats[arm]
        s.tokens = s.tokens * self.decay + tokens
        s.seconds = s.seconds * self.decay + seconds

    def _decide(self) -> tuple[int, int]:
        """(arm, steps to run it) at the end of a run."""
        for i, s in enumerate(self.stats):
            if s.steps == 0 and s.dry_runs == 0:  # measure every arm briefly (a scored dry run will do), the incumbent first
                return i, self._probe_steps(i)
        best = max(range(self.size), key=lambda i: self.stats[i].rate)
        if self.stats[best].rate > self.stats[self.incumbent].rate * (1 + self.margin):
            self.incumbent = best
        idle = [
            i for i in range(self.size)
            if i != self.incumbent and self.step - self.stats[i].last_step > self.reprobe * (DRY_REPROBE_FACTOR if self.dry[i] else 1)
        ]
        if idle:  # the text (or, for a dry-run arm, the machine) may have changed since it lost
            arm = min(idle, key=lambda i: self.stats[i].last_step)
            if not self.dry[arm]:  # its evidence is old: let the probe's steps weigh more
                self.stats[arm].tokens *= STALE
                self.stats[arm].seconds *= STALE
            return arm, self._probe_steps(arm)
        return self.incumbent, self.dwell

    def _probe_steps(self, arm: int) -> int:
        """`probe` plain steps' worth of `arm`'s steps, at least one, for an arm whose dry
        runs go on scoring it while idle and whose usual step cost is known (a 16-node
        step that costs 3.2 plain ones probes once, not 3 times); else `probe` steps."""
        drafted, plain = self.drafts[arm], self.costs.estimate(0)
        own = self.costs.estimate(drafted) if drafted is not None else None
        if not self.dry[arm] or own is None or plain is None:
            return self.probe
        return max(1, round(self.probe * plain / own))


class Adaptive(ProposerBase):
    """Runs one of its arms per step, chosen by `SwitchPolicy` from their measured speed."""

    name = "adaptive"

    def __init__(
        self, env: MethodEnv, *, arms: str, dwell: int, probe: int, reprobe: int, margin: float,
        clock: Callable[[], float] = perf_counter,
    ) -> None:
        from pardec_cli.methods.registry import create

        specs = parse_arms(arms)
        if len(specs) < 2:
            raise PardecUsageError(
                f"adaptive needs at least two arms, got {arms!r}",
                hint="e.g. -O 'arms=pld[num_draft=8] | pld[num_draft=4] | vanilla'",
            )
        if any(method == self.name for _, method, _ in specs):
            raise PardecUsageError("an arm of adaptive cannot be adaptive itself")
        self.labels = [label for label, _, _ in specs]
        shared = replace(env, indexes={})  # the arms see one text: they may share its indexes
        self.arms: list[Proposer] = [create(method, knobs, shared) for _, method, knobs in specs]
        self._arm_needs = [arm.needs() for arm in self.arms]
        layers = {n.feature_layers for n in self._arm_needs if n.feature_layers}
        if len(layers) > 1:
            raise PardecUsageError("the arms of adaptive must read the same hidden states of the target")
        self._needs = Needs.union(self._arm_needs)
        self.needs_rollback = any(arm.needs_rollback for arm in self.arms)
        self._dry = [i for i, arm in enumerate(self.arms) if arm.dry_runs]
        self.policy = SwitchPolicy(
            len(self.arms), dwell=dwell, probe=probe, reprobe=reprobe, margin=margin,
            dry=[arm.dry_runs for arm in self.arms],
        )
        self.clock = clock  # injectable: tests drive the policy with a fake clock
        self._row_tile = env.target.row_tile
        self._active = 0
        self._started = 0.0
        self._pending: list[tuple[int, int, Draft]] = []  # dry runs to score: (arm, context length, draft)
        self._drafting = [0.0] * len(self.arms)  # per arm: discounted mean seconds of its dry drafting
        self._last_dry = [0] * len(self.arms)  # per arm: the policy step of its last dry run

    @property
    def active(self) -> str:
        """The label of the arm that drafted the last step."""
        return self.labels[self._active]

    def needs(self) -> Needs:
        return self._needs

    def start(self, ctx: StartContext) -> None:
        self.policy.reset()
        self._pending = []
        self._last_dry = [0] * len(self.arms)
        for arm in self.arms:
            arm.start(ctx)

    def prefilled(self, features: Any) -> None:
        for arm, needs in zip(self.arms, self._arm_needs):
            if needs.feature_layers:
                arm.prefilled(features)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self._active = self.policy.next_arm()
        self._started = self.clock()
        plain = self.policy.costs.estimate(0)  # read once for every idle arm
        for i in self._dry:
            if i != self._active and self.policy.step - self._last_dry[i] >= self._dry_period(i, plain):
                self._dry_run(i, context, max_tokens)
        return replace(self.arms[self._active].propose(context, max_tokens), arm=self.labels[self._active])

    def _dry_period(self, arm: int, plain: float | None) -> int:
        """Steps between an idle arm's dry runs: DRY_EVERY, or more when its drafting would
        take over DRY_BUDGET of a plain step of `plain` seconds (None: none timed yet; wall
        time: the budget is real time spent)."""
        if plain is None or self._drafting[arm] <= 0:
            return DRY_EVERY
        return max(DRY_EVERY, ceil(self._drafting[arm] / (DRY_BUDGET * plain)))

    def _dry_run(self, arm: int, context: Sequence[int], max_tokens: int) -> None:
        """Draft with an idle arm without verifying: scored once the tokens that follow are known."""
        began = perf_counter()
        draft = fit_to_tiles(self.arms[arm].propose(context, max_tokens), self._row_tile)  # as the loop would verify it
        spent = perf_counter() - began
        self._drafting[arm] = spent if self._drafting[arm] <= 0 else DECAY * self._drafting[arm] + (1 - DECAY) * spent
        self._last_dry[arm] = self.policy.step
        if draft.tokens:
            self._pending.append((arm, len(context), draft))
        else:  # nothing to draft: it would have emitted the target's token alone, in a plain step
            self.policy.observe_dry(arm, 1, 0)

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        # What every idle arm learns: nothing of its own was drafted, the context moved on.
        idle = Outcome(
            accepted=0, top_tokens=None if outcome.top_tokens is None else outcome.top_tokens[:1],
            step_inputs=outcome.step_inputs, step_top_tokens=outcome.step_top_tokens, features=outcome.features,
        )
        for i, (arm, needs) in enumerate(zip(self.arms, self._arm_needs)):
            own = outcome if i == self._active else idle
            arm.update(context, draft if i == self._active else EMPTY_DRAFT, _narrowed(own, needs))
        # The dry runs whose fate the new tokens decide: what greedy verification would have kept.
        waiting = []
        for index, start, dry in self._pending:
            kept = kept_along(dry, context[start:])
            if kept is None:
                waiting.append((index, start, dry))
            else:
                self.policy.observe_dry(index, kept + 1, len(dry))
        self._pending = waiting
        # The step's cost: this proposer's propose, the target's forward and verification, every arm's update.
        self.policy.observe(self._active, outcome.accepted + 1, self.clock() - self._started, len(draft))

    def knobs(self) -> dict[str, Any]:
        p = self.policy
        return {"arms": f" {ARM_SEPARATOR} ".join(self.labels), "dwell": p.dwell, "probe": p.probe,
                "reprobe": p.reprobe, "margin": p.margin}


def _narrowed(outcome: Outcome, needs: Needs) -> Outcome:
    """`outcome` as an arm that asked for `needs` expects it (top-k width, features or not)."""
    top, step_top = outcome.top_tokens, outcome.step_top_tokens
    changes: dict[str, Any] = {}
    if not needs.top_k:
        if top is not None or step_top is not None:
            changes.update(top_tokens=None, step_top_tokens=None, step_inputs=())
    elif step_top is not None and step_top.shape[-1] > needs.top_k:
        changes.update(top_tokens=None if top is None else top[:, : needs.top_k], step_top_tokens=step_top[:, : needs.top_k])
    if not needs.feature_layers and outcome.features is not None:
        changes["features"] = None
    return replace(outcome, **changes) if changes else outcome


def parse_arms(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """'pld[num_draft=8] | vanilla' -> [(label, method, knobs)] (knob values parsed when built)."""
    from pardec_cli.methods.options import parse_assignments, parse_label

    arms = []
    for item in text.split(ARM_SEPARATOR):
        label = item.strip()
        if label:
            name, knobs = parse_label(label, "arm")
            arms.append((label, name, parse_assignments(knobs)))
    return arms


def arm_label(method: str, knobs: dict[str, Any]) -> str:
    """'pld[num_draft=8]' (knobs sorted), or the bare name without knobs."""
    if not knobs:
        return method
    text = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(knobs.items()))
    return f"{method}[{text}]"


def sized_knobs(method: str, knobs: dict[str, Any], share: float) -> tuple[dict[str, Any], int | None]:
    """`knobs` with each part's size knob (`MethodSpec.size_option`) at `share` of its value
    (at least 1; a share above 1 grows it up to the method's default size at most), and the
    largest size that gives (None: the method has no size knob)."""
    from pardec_cli.methods.registry import get_spec

    sized, largest = dict(knobs), None
    for part, option, key in _size_knobs(method):
        default = next(o.default for o in get_spec(part).options if o.name == option)
        current = sized.get(key, sized.get(option))
        if current is None:
            current = default
        size = int(current) if share == 1 else max(1, round(int(current) * share))
        if share > 1:  # growing stops at the method's own default size
            size = max(int(current), min(size, int(default)))
        if share != 1:
            sized[key] = size
        largest = size if largest is None else max(largest, size)
    return sized, largest


def _size_knobs(method: str) -> list[tuple[str, str, str]]:
    """(part, its size knob `MethodSpec.size_option`, that knob's key in `method`'s knobs:
    PART.KNOB in a `+` combination) for each part of `method` that has one."""
    from pardec_cli.methods.registry import get_spec

    return [(part, option, f"{part}.{option}" if "+" in method else option)
            for part in method.split("+") if (option := get_spec(part).size_option) is not None]  # fmt: skip


def size_free(method: str, knobs: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The configuration less its size knobs (each part's, under either key `sized_knobs`
    reads): configurations that differ only in size (the arms `sibling_arms` makes) give
    the same."""
    sizes = {name for _, option, key in _size_knobs(method) for name in (option, key)}
    return method, tuple(sorted((key, str(value)) for key, value in knobs.items() if key not in sizes))


def challenger_arm(method: str, knobs: dict[str, Any], relative_cost: Callable[[float], float],
                   shares: Sequence[float] = CHALLENGER_SHARES) -> str:  # fmt: skip
    """A cheap arm of this configuration: at the largest of `shares` of its size whose
    verification costs at most `CHALLENGER_MAX_COST` plain steps (`relative_cost(rows)`,
    the cost curve), else at the smallest. It challenges plain decoding when auto expects
    nothing to beat it (its drafts are likely junk), and is the smaller arm of auto's
    choice: a junk 16-node draft costs 3.2 steps on a CPU whose int4 kernel works in
    tiles of 4 rows, 1.0 on a GPU."""
    return arm_label(method, cheap_knobs(method, knobs, relative_cost, shares))


def cheap_knobs(method: str, knobs: dict[str, Any], relative_cost: Callable[[float], float],
                shares: Sequence[float] = CHALLENGER_SHARES) -> dict[str, Any]:  # fmt: skip
    """The knobs of `challenger_arm`: `knobs` sized to the largest of `shares` whose
    verification costs at most `CHALLENGER_MAX_COST` plain steps, else the smallest."""
    for share in shares:
        sized, size = sized_knobs(method, knobs, share)
        if size is None or relative_cost(1 + size) <= CHALLENGER_MAX_COST:
            return sized
    return sized_knobs(method, knobs, shares[-1])[0]


def sibling_arms(method: str, knobs: dict[str, Any], relative_cost: Callable[[float], float], *,
                 dry: bool = False) -> list[str]:  # fmt: skip
    """The other sizes auto's choice runs at. Smaller (`challenger_arm` over
    `SMALLER_SHARES`) unless the choice verifies for at most `CHALLENGER_MAX_COST` plain
    steps; `LARGER_SHARE` times larger (up to its method's default size) where it does,
    or where the method can be dry-run (`dry`: an idle arm costs a few hundred microseconds
    of drafting), so that a choice tune sized down on its own prompts can still draft long
    on text that copies (a code edit)."""
    _, size = sized_knobs(method, knobs, 1.0)
    cheap = size is not None and relative_cost(1 + size) <= CHALLENGER_MAX_COST
    larger, grown = sized_knobs(method, knobs, LARGER_SHARE)
    grows = size is not None and grown is not None and grown > size and (cheap or dry)
    # A cheap choice that grows needs no smaller arm; one at its default size still gets it.
    arms = [] if cheap and grows else [challenger_arm(method, knobs, relative_cost, SMALLER_SHARES)]
    return [*arms, arm_label(method, larger)] if grows else arms
