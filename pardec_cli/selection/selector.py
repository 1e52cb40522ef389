"""`--method auto`: choose the decoding method and knobs with a small cost model.

One decoding step that verifies a draft of d tokens costs a target forward over 1 + d
tokens plus the drafting, and emits on average t tokens. Relative to plain decoding
(one token per one-token forward, time c(1)) a candidate is expected to run at

    speed-up = t * c(1) / (c(1 + d) + draft_forwards * c(1) + draft_calls * a(1) + draft_ms)

where c(n) is the verification cost curve of this model on this device (measured by
`pardec tune`, else estimated from the hardware: `pardec_cli.selection.costmodel`), a(1) one
forward of the accelerator (drafter or heads) the candidate needs, and t, d and the
drafting terms come from the task profile's priors.

Measured beats guessed. A configuration measured on this machine for this profile
(by `pardec tune`, or by use: `selection.learned`) enters with its measured speed-up,
and while any is measured, every prior ranks below them: a prior can only win where
nothing was measured. Measured ones rank by their speed-up shrunk towards 1.0 by how
few runs stand behind it (`selection.learned.shrunk`), so one lucky prompt does not beat eight
steady ones. Priors are discounted by how wrong priors have been on this machine: the
runs-weighted geometric mean of measured / prior over configurations that have both
(`prior_discount`), never above 1. Plain decoding (1.0) is always a candidate, so auto
never picks something it expects to be slower.

Nothing here knows a method by name: the profile lists candidates, the registry says
which methods exist and which accelerator each needs (`MethodSpec.accelerator`), the
store says which accelerators are installed. A method added later (Medusa, EAGLE)
takes part as soon as a profile lists it or tune measured it; one that is not
registered, or whose accelerator is missing, is skipped with a reason.

`select` is the pure function (tested on simulated hardware); `AutoSelector` gathers
its inputs for a loaded session once and answers `choose(prompt, profile)` per prompt
(the CLI, the benchmark and the TUI use it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pardec_cli.selection.costmodel import CostCurve, ModelShape, estimated_curve, forward_ms
from pardec_cli.selection.estimates import estimate as device_estimate
from pardec_cli.hardware import Hardware
from pardec_cli.selection.learned import Measurement, merge
from pardec_cli.selection.profiles import AUTO, Candidate, Profile, canonical_label, knob_problem, method_label, parse_label
from pardec_cli.store.accelerators import InstalledAccelerator
from pardec_cli.selection.tasks import TaskGuess, detect_task

if TYPE_CHECKING:
    from pardec_cli.methods.registry import MethodSpec
    from pardec_cli.selection.learned import Usage
    from pardec_cli.selection.tuned import TunedProfile, TunedResults

AUTO_METHOD = "auto"
# Under sampling a drafted token is kept with probability min(1, p/q) instead of when
# it is the argmax: deterministic drafts lose about this share of their extra tokens
# at the usual temperatures (a prior; profiles may give sampled_tokens_per_step).
SAMPLING_DISCOUNT = 0.6
# An accelerator whose size is unknown is assumed to cost this share of a target forward.
UNKNOWN_ACCELERATOR_SHARE = 0.15
# Priors are never discounted below this share of themselves (a handful of bad
# measurements should not make every prior look worthless).
MIN_DISCOUNT = 0.25


@dataclass(frozen=True)
class Estimate:
    """What the cost model expects from one candidate on this hardware."""

    method: str
    knobs: dict[str, Any]
    speedup: float  # expected tokens/s over plain decoding's
    tokens_per_step: float
    step_cost: float  # time of one step, in one-token forwards (measured ones: implied by tokens and speed-up)
    basis: str  # "measured" (on this machine: tune or use), "prior" (profile data), "baseline"
    accelerator: str | None = None  # the accelerator reference it uses
    prior: float | None = None  # a prior's speed-up before the machine's discount
    measurement: Measurement | None = None  # what a measured one was measured as

    @property
    def label(self) -> str:
        return method_label(self.method, self.knobs)

    @property
    def score(self) -> float:
        """What ranks it: a measured speed-up shrunk by how few runs it rests on; else the estimate."""
        if self.measurement is None:
            return self.speedup
        from pardec_cli.selection.learned import shrunk

        return shrunk(self.speedup, self.measurement.runs)

    def describe(self) -> str:
        """'measured 1.42x (1.30-1.51) over 12 runs (tune)', 'prior 1.71x, discounted to 1.10x', 'plain decoding'."""
        if self.basis == "baseline":
            return "plain decoding"
        if self.measurement is not None:
            m = self.measurement
            spread = f" ({m.low:.2f}-{m.high:.2f})" if m.runs > 1 else ""
            return f"measured {self.speedup:.2f}x{spread} over {m.runs} run{'s' * (m.runs != 1)} ({m.source})"
        if self.prior is not None and abs(self.prior - self.speedup) > 0.005:
            return f"prior {self.prior:.2f}x, discounted to {self.speedup:.2f}x"
        return f"prior {self.speedup:.2f}x"


@dataclass(frozen=True)
class Choice:
    """What auto decided, and why."""

    method: str
    knobs: dict[str, Any]
    profile: str
    estimate: Estimate
    ranking: tuple[Estimate, ...]  # every candidate estimated, best first
    skipped: tuple[tuple[str, str], ...]  # (candidate label, why it was not considered)
    curve: CostCurve
    hardware: Hardware
    task: TaskGuess | None = None  # set when the profile was detected from the prompt
    notes: tuple[str, ...] = ()  # e.g. tuned results that do not apply here
    discount: float = 1.0  # what priors were multiplied by (how wrong they have been here)
    discount_basis: str = ""  # why, for people
    context: int = 0  # the prompt's tokens the priors were priced after (0: the curve's own text)

    @property
    def measured(self) -> tuple[Estimate, ...]:
        """The configurations measured on this machine for this profile, best first."""
        return tuple(e for e in self.ranking if e.basis == "measured")

    @property
    def label(self) -> str:
        return method_label(self.method, self.knobs)

    def reasons(self) -> list[str]:
        """The explanation, one line per fact (what `--explain` prints)."""
        hw = self.hardware
        est = self.estimate
        profile = f"{self.profile} (detected: {'; '.join(self.task.reasons)})" if self.task else f"{self.profile} (given)"
        lines = [
            f"method    {self.label}",
            f"profile   {profile}",
            f"hardware  {hw.hw_class}: {hw.name}, {hw.dtype}",
            f"cost      verifying n tokens costs {self.curve.describe()} one ({self.curve.source})",
        ]
        curve = self.curve
        if self.context > curve.context_tokens and curve.row_ms_per_1k > 0:
            lines.append(f"context   priors priced after this prompt's {self.context} tokens: every verified row "
                         f"costs {curve.row_ms_per_1k:.2f} ms more per 1000 tokens of text beyond "
                         f"{curve.context_tokens} (8 tokens {curve.ms_at(8, self.context) / curve.ms_at(1, self.context):.1f}x "
                         "one here), but for methods that size their own drafts by that price")
        if est.basis == "baseline":
            why = "measured" if self.measured else "expected"
            lines.append(f"expect    no candidate is {why} to beat plain decoding here")
        else:
            lines.append(f"expect    {est.describe()} plain decoding, {est.tokens_per_step:.2f} tokens per step")
        if self.measured:
            lines.append("measured  " + "; ".join(f"{e.label} {e.describe().removeprefix('measured ')}"
                                                  for e in self.measured[:5]))
        others = [e for e in self.ranking if e is not est and e.basis == "prior"][:4]
        if others:
            head = "priors    " if self.measured else "others    "
            lines.append(head + ", ".join(f"{e.label} {e.describe()}" for e in others))
        if self.discount != 1.0 and self.discount_basis:
            lines.append(f"discount  priors x{self.discount:.2f}: {self.discount_basis}")
        if self.skipped:
            lines.append("skipped   " + "; ".join(f"{label}: {why}" for label, why in self.skipped))
        lines += [f"note      {note}" for note in self.notes]
        return lines

    def explain(self) -> str:
        """The reasons as one block, headed 'auto: LABEL'."""
        first, *rest = self.reasons()
        return "\n".join(["auto: " + first.split(None, 1)[1], *rest])


# ------------------------------------------------------------------ the model


def step_cost_ms(candidate: Candidate, curve: CostCurve, accelerator_ms: float, context: int = 0) -> float:
    """Expected time of one decoding step of `candidate`, in milliseconds, after `context`
    tokens of text (0: the text the curve was measured after)."""
    return (
        curve.ms_at(1 + candidate.drafted, context)
        + candidate.draft_forwards * curve.ms_at(1, context)
        + candidate.draft_calls * accelerator_ms
        + candidate.draft_ms
    )


def sampled_tokens(tokens_per_step: float, given: float | None = None) -> float:
    """Tokens per step under sampling: the profile's figure, else the greedy extra tokens discounted."""
    return given if given is not None else 1.0 + (tokens_per_step - 1.0) * SAMPLING_DISCOUNT


def select(
    *,
    hardware: Hardware,
    model: ModelShape,
    profile: Profile,
    greedy: bool = True,
    accelerators: Sequence[InstalledAccelerator] = (),
    tuned: TunedProfile | None = None,
    measured: Sequence[Measurement] = (),
    discount: float = 1.0,
    discount_basis: str = "",
    curve: CostCurve | None = None,
    methods: Mapping[str, MethodSpec] | None = None,
    missing: str = "not a method of this pardec version",
    context: int = 0,
) -> Choice:
    """Choose a method for `profile` on `hardware` (pure: everything comes in as arguments).

    `curve` is the measured verification cost curve (None: estimated from `hardware` and
    `model`); `tuned` the measurements tune made for this profile on this machine and
    `measured` any others (use), which rank above every prior; `discount` multiplies
    the priors' speed-ups (`prior_discount`); `methods` the method registry (default:
    pardec's), or the part of it an engine runs (`--engine vllm`), with `missing`
    saying why the others are skipped; `context` the prompt's length in tokens, which
    prices the priors' verified rows (each attends to the whole text: `CostCurve.ms_at`).
    """
    if methods is None:
        from pardec_cli.methods.registry import METHODS

        methods = METHODS
    curve = curve or estimated_curve(device_estimate(hardware), model, hardware.dtype)
    baseline = Estimate("vanilla", {}, 1.0, 1.0, 1.0, "baseline")
    skipped: list[tuple[str, str]] = []

    found = _measured_estimates([*(tuned_measurements(tuned) if tuned else []), *measured], greedy, methods,
                                accelerators, missing, skipped)
    measured_labels = {e.label for e in found}
    priors = [replace(e, speedup=e.speedup * discount, prior=e.speedup)
              for e in prior_estimates(hardware=hardware, model=model, profile=profile, greedy=greedy,
                                       accelerators=accelerators, curve=curve, methods=methods, missing=missing,
                                       skipped=skipped, context=context)
              if _canonical(e.method, e.knobs) not in measured_labels]
    # Best first; on equal speed-up the earlier candidate (profile order) stays first.
    # While anything is measured here, the measured (and plain decoding) rank above
    # every prior: a guess never beats a measurement.
    if found:
        ranking = (*sorted([baseline, *found], key=lambda e: -round(e.score, 6)),
                   *sorted(priors, key=lambda e: -round(e.speedup, 6)))
    else:
        ranking = tuple(sorted([baseline, *priors], key=lambda e: -round(e.speedup, 6)))
    best = ranking[0]
    return Choice(best.method, dict(best.knobs), profile.name, best, ranking, tuple(dict.fromkeys(skipped)), curve,
                  hardware, discount=discount, discount_basis=discount_basis, context=context)


def prior_estimates(
    *,
    hardware: Hardware,
    model: ModelShape,
    profile: Profile,
    greedy: bool,
    accelerators: Sequence[InstalledAccelerator],
    curve: CostCurve,
    methods: Mapping[str, MethodSpec],
    missing: str = "not a method of this pardec version",
    skipped: list[tuple[str, str]] | None = None,
    context: int = 0,
) -> list[Estimate]:
    """The profile's candidates for `hardware` as the cost model expects them (basis "prior")
    after `context` tokens of text (but those that size their own drafts, `sizes_itself`),
    labelled canonically; the ones that cannot run here go to `skipped` with a reason."""
    from pardec_cli.methods.registry import sizes_itself

    skipped = skipped if skipped is not None else []
    estimates = []
    for candidate in profile.candidates_for(hardware):
        label = candidate.label
        if candidate.method == "vanilla":
            continue  # the baseline is always there
        why = unavailable_reason(candidate.method, methods, accelerators, missing)
        if why is not None:
            skipped.append((label, why))
            continue
        problem = knob_problem(candidate.method, candidate.knobs)
        if problem is not None:
            skipped.append((label, problem))
            continue
        for knobs, accelerator_ms, acc in _accelerator_variants(candidate, methods, accelerators, hardware, model, curve):
            ref = acc.ref if acc is not None else None
            measured = acc.tokens_per_step if acc is not None else None
            if measured:  # the accelerator's own measurement (trained heads) beats the method's prior
                tokens = measured if greedy else sampled_tokens(measured)
            else:
                tokens = candidate.tokens_per_step if greedy else sampled_tokens(candidate.tokens_per_step, candidate.sampled_tokens_per_step)
            # A method that sizes its drafts by the step's price drafts fewer rows after a
            # long text than its prior says: priced at the curve's own text, as measured.
            priced_at = 0 if sizes_itself(candidate.method, knobs) else context
            step_ms = step_cost_ms(candidate, curve, accelerator_ms, priced_at)
            base_ms = curve.ms_at(1, priced_at)
            estimates.append(Estimate(candidate.method, knobs, tokens * base_ms / step_ms, tokens,
                                      step_ms / base_ms, "prior", ref))
    return estimates


def tuned_measurements(tuned: TunedProfile) -> list[Measurement]:
    """What tune measured for one profile, as measurements (spread from its raw runs)."""
    from pardec_cli.selection.tuned import measurements

    return measurements(tuned)


def prior_discount(pairs: Sequence[tuple[float, float, int]]) -> float | None:
    """How wrong priors have been here: the runs-weighted geometric mean of measured / prior
    over (measured, prior, runs) of configurations that have both; None without any.
    Capped at 1 (priors are never raised) and floored at `MIN_DISCOUNT`."""
    import math

    usable = [(m, p, n) for m, p, n in pairs if m > 0 and p > 0 and n > 0]
    if not usable:
        return None
    weight = sum(n for _, _, n in usable)
    mean = math.exp(sum(n * math.log(m / p) for m, p, n in usable) / weight)
    return min(max(mean, MIN_DISCOUNT), 1.0)


def _canonical(method: str, knobs: dict[str, Any]) -> str:
    """The label in the one spelling tune and use records write (as given for unknown methods)."""
    from pardec_cli.errors import PardecUsageError

    try:
        return canonical_label(method, knobs)
    except (PardecUsageError, KeyError):
        return method_label(method, knobs)


def _measured_estimates(
    measurements: Sequence[Measurement], greedy: bool, methods: Mapping[str, MethodSpec],
    accelerators: Sequence[InstalledAccelerator], missing: str, skipped: list[tuple[str, str]],
) -> list[Estimate]:
    """One measured estimate per label (tune's and use's merged) that can still run here."""
    from pardec_cli.errors import PardecUsageError

    by_label: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_label.setdefault(m.label, []).append(m)
    found = []
    for label, items in by_label.items():
        m = merge(items)
        try:
            method, knobs = parse_label(label)
        except (PardecUsageError, KeyError, ValueError):
            continue  # a method this pardec no longer has: its measurement cannot be run
        if method == "vanilla":
            continue
        why = unavailable_reason(method, methods, accelerators, missing)
        if why is not None:
            skipped.append((label, why))
            continue
        tokens = m.tokens_per_step if greedy else sampled_tokens(m.tokens_per_step)
        speedup = m.speedup * tokens / m.tokens_per_step if m.tokens_per_step > 0 else m.speedup
        found.append(Estimate(method, knobs, speedup, tokens, tokens / speedup, "measured", measurement=m))
    return found


def unavailable_reason(
    method: str, methods: Mapping[str, MethodSpec], accelerators: Sequence[InstalledAccelerator],
    missing: str = "not a method of this pardec version",
) -> str | None:
    """Why `method` cannot run here (not registered, not combinable, accelerator missing), or None."""
    parts = method.split("+")
    for part in parts:
        if part not in methods:
            return missing
        if len(parts) > 1 and not methods[part].combinable:
            return f"{part!r} cannot be combined"
    kind = methods[parts[0]].accelerator if len(parts) == 1 else None
    if kind is not None and not any(a.kind == kind for a in accelerators):
        from pardec_cli.store.catalog import accelerator_noun

        return f"needs {accelerator_noun(kind, article=True)} for this model; none is installed"
    return None


def _accelerator_variants(
    candidate: Candidate,
    methods: Mapping[str, MethodSpec],
    accelerators: Sequence[InstalledAccelerator],
    hardware: Hardware,
    model: ModelShape,
    curve: CostCurve,
) -> list[tuple[dict[str, Any], float, InstalledAccelerator | None]]:
    """(knobs, accelerator forward ms, accelerator) per usable accelerator; one entry
    without an accelerator for methods that need none."""
    spec = methods.get(candidate.method)
    if spec is None or spec.accelerator is None:
        return [(dict(candidate.knobs), 0.0, None)]
    variants = []
    for acc in accelerators:
        if acc.kind != spec.accelerator:
            continue
        if acc.parameters and acc.layers:
            # Scale the estimate by the measured curve's calibration: a(1) = c(1) * est_a / est_c.
            ratio = forward_ms(device_estimate(hardware), ModelShape(acc.parameters, acc.layers), hardware.dtype, 1) / forward_ms(
                device_estimate(hardware), model, hardware.dtype, 1
            )
            accelerator_ms = curve.base_ms * ratio
        else:
            accelerator_ms = curve.base_ms * UNKNOWN_ACCELERATOR_SHARE
        knobs = dict(candidate.knobs)
        if spec.accelerator_option and spec.accelerator_option not in knobs:
            knobs[spec.accelerator_option] = acc.ref
        variants.append((knobs, accelerator_ms, acc))
    return variants


# ------------------------------------------------------------- for a session


@dataclass(frozen=True)
class ModelInfo:
    """The model auto chooses for: its name, where it is, its size and identity."""

    name: str
    shape: ModelShape
    fingerprint: str
    path: Path | None = None
    repo: str | None = None


class AutoSelector:
    """The inputs of `select` that do not change between prompts, gathered once.

    `choose(prompt, profile)` then costs a task detection and a few multiplications.
    `usage` is what generations measured here (`selection.learned`); with `tuned`, it
    makes the measured configurations of each profile and the discount on priors.
    """

    def __init__(
        self,
        hardware: Hardware,
        model: ModelInfo,
        *,
        profiles: Mapping[str, Profile],
        accelerators: Sequence[InstalledAccelerator] = (),
        tuned: TunedResults | None = None,
        usage: Usage | None = None,
        notes: Sequence[str] = (),
        methods: Mapping[str, MethodSpec] | None = None,
        missing: str = "not a method of this pardec version",
        learned_curve: CostCurve | None = None,
        count_tokens: Callable[[str], int] | None = None,
    ) -> None:
        self.hardware = hardware
        self.model = model
        self.profiles = dict(profiles)
        self.accelerators = list(accelerators)
        self.tuned = tuned
        self.usage = usage
        #: The cost curve measured here for this step kind outside `pardec tune`
        #: (`Session.auto_selector` measures it once and keeps it in learned.json).
        self.learned_curve = learned_curve
        self.notes = tuple(notes)
        # The methods auto may choose (None: every registered one), and why the others
        # are skipped: `--engine vllm` passes the part of the registry vLLM runs.
        self.methods, self.missing = methods, missing
        #: A prompt's length in tokens, to price the priors for it (None: priced for the
        #: text the curve was measured after).
        self.count_tokens = count_tokens
        self._discount: tuple[float, str] | None = None

    @classmethod
    def for_session(cls, session: Any, *, drafters: Sequence[str] = (),
                    profiles: Mapping[str, Profile] | None = None) -> AutoSelector:  # fmt: skip
        """Everything about a loaded `Session`: hardware, installed accelerators (plus
        `drafters` given on the command line), profiles (`profiles`, else read now), the
        tuned results that match this model, device and dtype exactly, and what use
        measured for them."""
        from pardec_cli.selection.learned import learning_enabled, read_usage
        from pardec_cli.selection.profiles import load_profiles
        from pardec_cli.store.accelerators import installed_accelerators, local_path, sized_accelerator
        from pardec_cli.selection.tuned import find_results, unusable_results

        hardware, info = session_model(session)
        path = info.path
        accelerators = (
            installed_accelerators(info.name, info.repo, source=getattr(session, "model_source", None), path=path)
            if path else []
        )
        for ref in drafters:
            accelerators.insert(0, sized_accelerator("drafter", ref, local_path(ref)))
        tuned = find_results(info.fingerprint, hardware.key, hardware.dtype)
        notes = unusable_results(info.name, info.fingerprint, hardware.key, hardware.dtype)
        usage = read_usage(info.fingerprint, hardware.key, session.step_kind) if learning_enabled() else None
        return cls(hardware, info, profiles=load_profiles() if profiles is None else profiles, accelerators=accelerators,
                   tuned=tuned, usage=usage, notes=notes, learned_curve=usage.curve if usage is not None else None,
                   count_tokens=lambda text: len(session.tokenizer.encode(text)))

    def learn(self, profile: str, label: str, row: Any) -> None:
        """A row this session's generation just recorded (`selection.learned.UsageRecorder`):
        the next choice ranks with it, as a later session reading learned.json would."""
        if self.usage is None:  # learning is off
            return
        from pardec_cli.selection.learned import WINDOW

        rows = self.usage.rows.setdefault(profile, {}).setdefault(label, [])
        rows.append(row)
        del rows[:-WINDOW]
        self._discount = None  # measured / prior changes with it

    @property
    def measured_curve(self) -> CostCurve | None:
        """The verification cost curve measured on this machine: the one measured for
        this very kind of step (`learned_curve`: by tune or by an earlier auto run), else
        tune's (its step may have been compiled where this one is eager); None when
        neither was."""
        if self.learned_curve is not None:
            return self.learned_curve
        return self.tuned.curve if self.tuned is not None else None

    @property
    def curve(self) -> CostCurve:
        """The verification cost curve: measured (`measured_curve`), else estimated."""
        measured = self.measured_curve
        if measured is not None:
            return measured
        return estimated_curve(device_estimate(self.hardware), self.model.shape, self.hardware.dtype)

    def measured(self, profile: str) -> list[Measurement]:
        """Every measurement for `profile` on this machine: tune's and use's (not merged)."""
        found: list[Measurement] = []
        tuned_profile = self.tuned.profiles.get(profile) if self.tuned else None
        if tuned_profile is not None:
            found += tuned_measurements(tuned_profile)
        if self.usage is not None:
            measured_curve = self.measured_curve
            base = measured_curve.base_ms if measured_curve is not None else None
            found += self.usage.measurements(profile, curve_base_ms=base)
        return found

    def ranking(self, profile: str) -> list[Measurement]:
        """`profile`'s measured configurations, tune's and use's merged per label, best first."""
        by_label: dict[str, list[Measurement]] = {}
        for m in self.measured(profile):
            by_label.setdefault(m.label, []).append(m)
        return sorted((merge(items) for items in by_label.values()), key=lambda m: -m.speedup)

    def discount(self) -> tuple[float, str]:
        """(factor on priors, why): measured / prior over every configuration here that has both."""
        if self._discount is None:
            pairs = []
            curve = self.curve
            methods = self.methods
            if methods is None:
                from pardec_cli.methods.registry import METHODS

                methods = METHODS
            for name, profile in self.profiles.items():
                measured = self.ranking(name)
                if not measured:
                    continue
                priors = {_canonical(e.method, e.knobs): e.speedup for e in prior_estimates(
                    hardware=self.hardware, model=self.model.shape, profile=profile, greedy=True,
                    accelerators=self.accelerators, curve=curve, methods=methods, missing=self.missing)}
                pairs += [(m.speedup, priors[m.label], m.runs, m.label) for m in measured if m.label in priors]
            factor = prior_discount([(m, p, n) for m, p, n, _ in pairs])
            if factor is None:
                self._discount = (1.0, "")
            else:
                self._discount = (factor, f"measured / prior over {len(pairs)} configuration"
                                          f"{'s' * (len(pairs) != 1)} measured here ({', '.join(p[3] for p in pairs[:3])})")
        return self._discount

    def choose(self, prompt: str | None, profile: str = AUTO, *, greedy: bool = True) -> Choice:
        """The choice for `prompt` (its task detected when `profile` is "auto")."""
        task = None
        if profile == AUTO:
            task = detect_task(prompt or "")
            profile = task.profile
        if profile not in self.profiles:
            from pardec_cli.errors import PardecUsageError

            raise PardecUsageError(f"unknown profile {profile!r}; choose from: auto, {', '.join(self.profiles)}")
        factor, why = self.discount()
        # Counted only where the curve prices text (a measured row cost): else it changes nothing.
        curve = self.measured_curve
        priced = curve is not None and curve.row_ms_per_1k > 0
        context = self.count_tokens(prompt) if prompt and priced and self.count_tokens is not None else 0
        choice = select(
            hardware=self.hardware,
            model=self.model.shape,
            profile=self.profiles[profile],
            greedy=greedy,
            accelerators=self.accelerators,
            measured=self.measured(profile),
            discount=factor,
            discount_basis=why,
            curve=curve,
            methods=self.methods,
            missing=self.missing,
            context=context,
        )
        return replace(choice, task=task, notes=self.notes)


def session_model(session: Any) -> tuple[Hardware, ModelInfo]:
    """The hardware a loaded `Session` runs on and what auto knows of its model (its
    fingerprint: the weights' files, else its config and size)."""
    from pardec_cli.hardware import cpu_info, cuda_devices, describe
    from pardec_cli.selection.tuned import fingerprint_config, fingerprint_directory

    gpus = cuda_devices() if session.device.startswith("cuda") else []
    hardware = describe(session.device, session.dtype, cpu_info(), gpus)
    model = session.target.model
    parameters = sum(p.numel() for p in model.parameters())
    shape = ModelShape(parameters, int(getattr(model.config, "num_hidden_layers", 1) or 1))
    path = getattr(session, "model_path", None)
    fingerprint = fingerprint_directory(path) if path else fingerprint_config(model.config.to_dict(), parameters)
    return hardware, ModelInfo(session.model_name, shape, fingerprint, path, getattr(session, "model_repo", None))


def choose(session: Any, prompt: str | None, profile: str = AUTO, sampling: Any = None) -> Choice:
    """One-call API (the TUI's): the choice for `prompt` on a loaded `Session`.

    `sampling` is a `SamplingParams` (None: greedy). Gathers the inputs anew each call;
    keep an `AutoSelector.for_session(session)` to choose for many prompts.
    """
    greedy = sampling is None or getattr(sampling, "greedy", True)
    return AutoSelector.for_session(session).choose(prompt, profile, greedy=greedy)

