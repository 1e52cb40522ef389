"""`--method auto`: choose the decoding method and knobs with a small cost model.

One decoding step that verifies a draft of d tokens costs a target forward over 1 + d
tokens plus the drafting, and emits on average t tokens. Relative to plain decoding
(one token per one-token forward, time c(1)) a candidate is expected to run at

    speed-up = t * c(1) / (c(1 + d) + draft_forwards * c(1) + draft_calls * a(1) + draft_ms)

where c(n) is the verification cost curve of this model on this device (measured by
`pardec tune`, else estimated from the hardware: `pardec_cli.selection.costmodel`), a(1) one
forward of the accelerator (drafter or heads) the candidate needs, and t, d and the
drafting terms come from the task profile's priors or, better, from tune's
measurements on this machine. The candidate with the highest expected speed-up wins;
plain decoding (1.0) is always a candidate, so auto never picks something it expects
to be slower.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pardec_cli.selection.costmodel import CostCurve, ModelShape, estimated_curve, forward_ms
from pardec_cli.selection.estimates import estimate as device_estimate
from pardec_cli.hardware import Hardware
from pardec_cli.selection.profiles import AUTO, Candidate, Profile, knob_problem, method_label
from pardec_cli.store.accelerators import InstalledAccelerator
from pardec_cli.selection.tasks import TaskGuess, detect_task

if TYPE_CHECKING:
    from pardec_cli.methods.registry import MethodSpec
    from pardec_cli.selection.tuned import TunedProfile, TunedResults

AUTO_METHOD = "auto"
# Under sampling a drafted token is kept with probability min(1, p/q) instead of when
# it is the argmax: deterministic drafts lose about this share of their extra tokens
# at the usual temperatures (a prior; profiles may give sampled_tokens_per_step).
SAMPLING_DISCOUNT = 0.6
# An accelerator whose size is unknown is assumed to cost this share of a target forward.
UNKNOWN_ACCELERATOR_SHARE = 0.15


@dataclass(frozen=True)
class Estimate:
    """What the cost model expects from one candidate on this hardware."""

    method: str
    knobs: dict[str, Any]
    speedup: float  # expected tokens/s over plain decoding's
    tokens_per_step: float
    step_cost: float  # time of one step, in one-token forwards
    basis: str  # "prior" (profile data), "tuned" (measured by pardec tune), "baseline"
    accelerator: str | None = None  # the accelerator reference it uses

    @property
    def label(self) -> str:
        return method_label(self.method, self.knobs)


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
        if est.basis == "baseline":
            lines.append("expect    no candidate is expected to beat plain decoding here")
        else:
            basis = "measured by pardec tune" if est.basis == "tuned" else "profile prior"
            lines.append(f"expect    {est.tokens_per_step:.2f} tokens per step ({basis}), "
                         f"{est.speedup:.2f}x plain decoding")
        others = [e for e in self.ranking if e is not est][:4]
        if others:
            lines.append("others    " + ", ".join(f"{e.label} {e.speedup:.2f}x" for e in others))
        if self.skipped:
            lines.append("skipped   " + "; ".join(f"{label}: {why}" for label, why in self.skipped))
        lines += [f"note      {note}" for note in self.notes]
        return lines

    def explain(self) -> str:
        """The reasons as one block, headed 'auto: LABEL'."""
        first, *rest = self.reasons()
        return "\n".join(["auto: " + first.split(None, 1)[1], *rest])


# ------------------------------------------------------------------ the model


def step_cost_ms(candidate: Candidate, curve: CostCurve, accelerator_ms: float) -> float:
    """Expected time of one decoding step of `candidate`, in milliseconds."""
    return (
        curve.ms(1 + candidate.drafted)
        + candidate.draft_forwards * curve.base_ms
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
    curve: CostCurve | None = None,
    methods: Mapping[str, MethodSpec] | None = None,
    missing: str = "not a method of this pardec version",
) -> Choice:
    """Choose a method for `profile` on `hardware` (pure: everything comes in as arguments).

    `curve` is the measured verification cost curve (None: estimated from `hardware` and
    `model`); `tuned` the measurements tune made for this profile on this machine, which
    replace the profile's priors for every method they cover; `methods` the method
    registry (default: pardec's), or the part of it an engine runs (`--engine vllm`),
    with `missing` saying why the others are skipped.
    """
    if methods is None:
        from pardec_cli.methods.registry import METHODS

        methods = METHODS
    curve = curve or estimated_curve(device_estimate(hardware), model, hardware.dtype)
    baseline = Estimate("vanilla", {}, 1.0, 1.0, 1.0, "baseline")
    estimates: list[Estimate] = [baseline]
    skipped: list[tuple[str, str]] = []

    # Tune's winner enters with its measured speed-up; every method tune measured (won or
    # lost) no longer enters with its prior: a measurement beats a guess. Losers are not
    # candidates themselves: most were measured on a prompt or two, too few to trust.
    measured_methods: set[str] = set()
    if tuned is not None:
        measured_methods = {tc.method for tc in tuned.candidates}
        tc = tuned.best_candidate()
        if tc is not None and tc.method != "vanilla" and unavailable_reason(tc.method, methods, accelerators, missing) is None:
            tokens = tc.tokens_per_step if greedy else sampled_tokens(tc.tokens_per_step)
            speedup = tc.speedup * tokens / tc.tokens_per_step
            estimates.append(Estimate(tc.method, dict(tc.knobs), speedup, tokens, tokens / speedup, "tuned"))

    for candidate in profile.candidates_for(hardware):
        label = candidate.label
        if candidate.method == "vanilla" or candidate.method in measured_methods:
            continue  # the baseline is always there; tune measured this method here
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
            step_ms = step_cost_ms(candidate, curve, accelerator_ms)
            speedup = tokens * curve.base_ms / step_ms
            estimates.append(Estimate(candidate.method, knobs, speedup, tokens, step_ms / curve.base_ms, "prior", ref))

    # Best first; on equal speed-up the earlier candidate (profile order) stays first.
    ranking = tuple(sorted(estimates, key=lambda e: -round(e.speedup, 6)))
    best = ranking[0]
    return Choice(best.method, dict(best.knobs), profile.name, best, ranking, tuple(dict.fromkeys(skipped)), curve, hardware)


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
    """

    def __init__(
        self,
        hardware: Hardware,
        model: ModelInfo,
        *,
        profiles: Mapping[str, Profile],
        accelerators: Sequence[InstalledAccelerator] = (),
        tuned: TunedResults | None = None,
        notes: Sequence[str] = (),
        methods: Mapping[str, MethodSpec] | None = None,
        missing: str = "not a method of this pardec version",
    ) -> None:
        self.hardware = hardware
        self.model = model
        self.profiles = dict(profiles)
        self.accelerators = list(accelerators)
        self.tuned = tuned
        self.notes = tuple(notes)
        # The methods auto may choose (None: every registered one), and why the others
        # are skipped: `--engine vllm` passes the part of the registry vLLM runs.
        self.methods, self.missing = methods, missing

    @classmethod
    def for_session(cls, session: Any, *, drafters: Sequence[str] = ()) -> AutoSelector:
        """Everything about a loaded `Session`: hardware, installed accelerators (plus
        `drafters` given on the command line), profiles, and the tuned results that
        match this model, device and dtype exactly."""
        from pardec_cli.hardware import cpu_info, cuda_devices, describe
        from pardec_cli.selection.profiles import load_profiles
        from pardec_cli.store.accelerators import installed_accelerators, local_path, sized_accelerator
        from pardec_cli.selection.tuned import find_results, fingerprint_config, fingerprint_directory, unusable_results

        gpus = cuda_devices() if session.device.startswith("cuda") else []
        hardware = describe(session.device, session.dtype, cpu_info(), gpus)
        model = session.target.model
        parameters = sum(p.numel() for p in model.parameters())
        shape = ModelShape(parameters, int(getattr(model.config, "num_hidden_layers", 1) or 1))
        path = getattr(session, "model_path", None)
        fingerprint = fingerprint_directory(path) if path else fingerprint_config(model.config.to_dict(), parameters)
        info = ModelInfo(session.model_name, shape, fingerprint, path, getattr(session, "model_repo", None))
        accelerators = (
            installed_accelerators(info.name, info.repo, source=getattr(session, "model_source", None), path=path)
            if path else []
        )
        for ref in drafters:
            accelerators.insert(0, sized_accelerator("drafter", ref, local_path(ref)))
        tuned = find_results(fingerprint, hardware.key, hardware.dtype)
        notes = unusable_results(info.name, fingerprint, hardware.key, hardware.dtype)
        return cls(hardware, info, profiles=load_profiles(), accelerators=accelerators, tuned=tuned, notes=notes)

    def choose(self, prompt: str | None, profile: str = AUTO, *, greedy: bool = True) -> Choice:
        """The choice for `prompt` (its task detected when `profile` is "auto")."""
        task = None
        if profile == AUTO:
            task = detect_task(prompt or "")
            profile = task.profile
        if profile not in self.profiles:
            from pardec_cli.errors import PardecUsageError

            raise PardecUsageError(f"unknown profile {profile!r}; choose from: auto, {', '.join(self.profiles)}")
        tuned_profile = self.tuned.profiles.get(profile) if self.tuned else None
        choice = select(
            hardware=self.hardware,
            model=self.model.shape,
            profile=self.profiles[profile],
            greedy=greedy,
            accelerators=self.accelerators,
            tuned=tuned_profile,
            curve=self.tuned.curve if self.tuned else None,
            methods=self.methods,
            missing=self.missing,
        )
        return replace(choice, task=task, notes=self.notes)


def choose(session: Any, prompt: str | None, profile: str = AUTO, sampling: Any = None) -> Choice:
    """One-call API (the TUI's): the choice for `prompt` on a loaded `Session`.

    `sampling` is a `SamplingParams` (None: greedy). Gathers the inputs anew each call;
    keep an `AutoSelector.for_session(session)` to choose for many prompts.
    """
    greedy = sampling is None or getattr(sampling, "greedy", True)
    return AutoSelector.for_session(session).choose(prompt, profile, greedy=greedy)

