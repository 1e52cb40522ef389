"""How one reply is decoded: its task profile, its sampling settings and its method.

`pardec gen`, `pardec serve`, `pardec bench` (its `auto` rows), `pardec tune` (what auto
picks afterwards) and the Python `Session` plan every prompt through `plan_reply`, so
a prompt is decoded the same way wherever it is sent (same profile, same sampling
defaults, same method and knobs, the same `--draft-model` drafters offered to auto):
the server's greedy text equals gen's.

`pardec chat` plans every reply through `Planner` too (the last user message is the
text), so a profile's [sampling] table and `--draft-model` drafters apply there as in gen.

Per prompt: the profile is the one given, or detected from the text (`-P auto`); its
[sampling] table gives defaults for the settings the user left unset; where that table
samples (temperature above 0, as the chat profile does), the model's own recommended
settings (`recommended_sampling`: its generation_config.json) replace the profile's
generic temperature, top_p and top_k; the method is the one given, or auto's choice for
the text, the profile and greedy or sampled decoding, run by default as method
`adaptive` over the choice at a few sizes and plain decoding (`auto_method`; `-O
adapt=off` keeps the choice). Torch-free until a selector is built.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# As a method: chosen per prompt; as a profile: detected from the prompt. Defined once, in
# the selection package (the lowest layer that needs it); import it from here.
from pardec_cli.selection.profiles import AUTO, Profile, method_label

# Settings a profile's [sampling] table gives defaults for (setting name -> profile key).
PROFILE_SAMPLING_KEYS = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
# `user_set` for a caller that fixes every setting itself (bench and tune compare methods
# at one token budget, greedy): the profile's [sampling] table then changes nothing.
ALL_SETTINGS = frozenset(PROFILE_SAMPLING_KEYS)
RECOMMENDED_KEYS = ("temperature", "top_p", "top_k")  # what a model's generation_config.json may recommend


def recommended_sampling(generation_config: Any) -> dict[str, Any]:
    """The sampling values a model's authors recommend: those its generation_config.json
    sets (transformers' `GenerationConfig.to_diff_dict()`: the values that differ from the
    library's defaults, so a file that sets nothing recommends nothing), and only when the
    file asks to sample (`do_sample` true, or a temperature above 0 without do_sample)."""
    if generation_config is None:
        return {}
    given = generation_config.to_diff_dict() if hasattr(generation_config, "to_diff_dict") else dict(generation_config)
    if given.get("do_sample") is False or given.get("temperature") == 0:
        return {}
    values = {key: given[key] for key in RECOMMENDED_KEYS if given.get(key) is not None}
    if not values or ("do_sample" not in given and "temperature" not in values):
        return {}
    return values


@dataclass(frozen=True)
class Settings:
    """How to generate one reply (before a profile fills in what the user left unset)."""

    max_tokens: int
    sampling: Any  # engine.sampling_params.SamplingParams
    stop: tuple[str, ...]
    system: str | None
    raw: bool


@dataclass(frozen=True)
class Plan:
    """What `plan_reply` decided for one prompt."""

    settings: Settings
    method: str
    knobs: dict[str, Any]
    profile: str
    reasons: tuple[str, ...] = field(default=())  # what --explain prints, one fact a line
    choice: Any = field(default=None, compare=False)  # auto's `selection.selector.Choice`; None for a named method

    @property
    def label(self) -> str:
        """'method[knob=value,...]', as the tables and auto's explanation name it."""
        return method_label(self.method, self.knobs)

    def explain_lines(self) -> list[str]:
        """The reasons, plus the sampling and token limit in effect."""
        sampling = self.settings.sampling
        mode = ("greedy" if sampling.greedy
                else f"temperature {sampling.temperature:g}, top_p {sampling.top_p:g}, top_k {sampling.top_k}")
        return [*self.reasons, f"sampling  {mode}, at most {self.settings.max_tokens} token{'s' * (self.settings.max_tokens != 1)}"]


def describe_sampling(sampling: Any) -> str:
    """``greedy`` or ``T 0.8 p 0.95 k 40``: a reply's sampling, in a few characters."""
    if sampling.greedy:
        return "greedy"
    text = f"T {sampling.temperature:g}"
    if sampling.top_p < 1:
        text += f" p {sampling.top_p:g}"
    if sampling.top_k:
        text += f" k {sampling.top_k}"
    return text


def load_profiles_checked(profile: str, profiles: dict[str, Profile] | None = None) -> dict[str, Profile]:
    """Read the profiles now (a broken file is one clear error; `profiles`: already read),
    check a profile name, and return them (reading them takes ~5 ms: a caller that needs
    them again keeps these)."""
    from pardec_cli.selection.profiles import get_profile, load_profiles

    profiles = load_profiles() if profiles is None else profiles
    if profile != AUTO:
        get_profile(profile, profiles)
    return profiles


def plan_reply(
    text: str,
    *,
    method: str,
    options: Mapping[str, Any],
    profile: str,
    settings: Settings,
    user_set: Collection[str],
    profiles: Mapping[str, Any],
    selector: Any = None,
    recommended: Mapping[str, Any] | None = None,
) -> Plan:
    """Plan the reply to `text`.

    `user_set` names the settings of PROFILE_SAMPLING_KEYS the user set (the others take
    the profile's value); `profiles` is `load_profiles()`; `selector` an `AutoSelector`,
    needed when `method` is "auto"; `recommended` the model's `recommended_sampling`.
    """
    from pardec_cli.selection.tasks import detect_task

    task = detect_task(text) if profile == AUTO else None
    name = task.profile if task else profile
    settings = profile_settings(settings, profiles[name], user_set, recommended)
    if method == AUTO:
        if selector is None:
            raise ValueError("method auto needs a selector")
        choice = replace(selector.choose(text, name, greedy=settings.sampling.greedy), task=task)
        sampling = settings.sampling
        repeatable = not sampling.greedy and sampling.seed is not None
        method, knobs, adapt_lines = auto_method(choice, options, repeatable=repeatable)
        return Plan(settings, method, knobs, name, (*choice.reasons(), *adapt_lines), choice)
    given = f"{name} (detected: {'; '.join(task.reasons)})" if task else f"{name} (given)"
    return Plan(settings, method, dict(options), name, (f"method    {method} (given)", f"profile   {given}"))


def auto_method(choice: Any, options: Mapping[str, Any], *, repeatable: bool = False) -> tuple[str, dict[str, Any], list[str]]:
    """How auto's `choice` (a `selection.selector.Choice`) is run, given auto's own knobs
    (`methods.registry.AUTO_OPTIONS`): (method, knobs, lines for --explain).

    With `adapt` on (the default) as method `adaptive`, whose arms are the choice at its
    size and at others (`methods.adaptive.sibling_arms`: half its size, or a quarter where
    half verifies for more than 1.5 plain steps; larger where the choice itself verifies
    that cheaply or its method can be dry-run) and plain decoding (not for a method that drafts only what it rates likely,
    `MethodSpec.sure_or_plain`: its unsure steps are plain already): the choice runs
    first and keeps running while it measures fastest. When auto expects nothing to beat
    plain decoding by adaptive's `margin` (5%), plain decoding runs first and the best other
    candidate (the choice, where it was expected to gain less than that) gets a chance to
    prove the estimate wrong, at a size whose junk drafts cost little (both sizes:
    `methods.adaptive.challenger_arm`).

    `repeatable` (a sampled reply with a seed): `adapt` is off unless given. Which arm drafts
    depends on measured time, and a sampled reply's tokens on what was drafted, so a
    switching reply would not repeat for its seed. A choice that sizes its drafts itself
    (`MethodSpec.self_sizing`: pld's fit, which drafts nothing where drafting does not pay
    by the reply's own step times) runs alone unless `adapt` is given.
    """
    from pardec_cli.methods.adaptive import ARM_SEPARATOR, arm_label, challenger_arm, sibling_arms, size_free
    from pardec_cli.methods.options import resolve_options
    from pardec_cli.methods.registry import AUTO_OPTIONS, dry_runs, get_spec, sizes_itself

    method, knobs = choice.method, dict(choice.knobs)
    adapt = resolve_options(AUTO, AUTO_OPTIONS, options)["adapt"]
    if repeatable and "adapt" not in options:
        return method, knobs, [f"adapt     off: a seeded sampled reply keeps {arm_label(method, knobs)} so that the seed "
                               "repeats it (switching depends on measured time; -O adapt=on switches anyway)"]
    if not adapt:
        return method, knobs, []
    if "adapt" not in options and sizes_itself(method, knobs):
        return method, knobs, [f"adapt     {arm_label(method, knobs)} sizes each draft itself by measured step times, down "
                               "to none where drafting does not pay: no arms to switch among (-O adapt=on adds them)"]
    # A choice expected to gain less than the margin an arm must win by to take over
    # starts behind plain decoding, as its challenger: it must prove that margin here.
    margin = resolve_options("adaptive", get_spec("adaptive").options, {})["margin"]
    slim = method != "vanilla" and choice.estimate.score < 1 + margin
    if method == "vanilla" or slim:
        other = choice.estimate if slim else next((e for e in choice.ranking if e.method != "vanilla"), None)
        if other is None:
            return method, knobs, []
        arms = ["vanilla", challenger_arm(other.method, dict(other.knobs), choice.curve.relative)]
        arms += _runner_up(choice, size_free(other.method, dict(other.knobs)), arms)
    else:
        arms = [arm_label(method, knobs), *sibling_arms(method, knobs, choice.curve.relative, dry=dry_runs(method))]
        arms = list(dict.fromkeys(arms))
        arms += _runner_up(choice, size_free(method, knobs), arms)
        if len(arms) < 2 or not all(get_spec(part).sure_or_plain for part in method.split("+")):
            arms.append("vanilla")
    lines = [f"adapt     while decoding, switch among {', '.join(arms)} by measured tokens/s "
             f"(-O adapt=off keeps {arm_label(method, knobs)})"]
    if slim:
        lines.append(f"adapt     plain decoding first: {arm_label(method, knobs)} is expected at "
                     f"{choice.estimate.score:.2f}x, within the {margin:.0%} an arm must win by")
    return "adaptive", {"arms": f" {ARM_SEPARATOR} ".join(arms)}, lines


#: A candidate of another configuration than the arms' (not just another size) estimated
#: at least this share of the choice's speed-up (or of plain decoding's, if more) also
#: runs as an arm where its method can be dry-run (an idle arm costs only its drafting).
#: Estimates that close are within what the cost curve's noise moves them by: on a Zen 4
#: EPYC, 2 rows measured 1.03x one in one run and 1.17x in the next, and the candidate
#: auto ranked third on chat prompts, pld[num_draft=2], was the best fixed configuration
#: in 10 of 13 Spec-Bench categories (docs/adaptive.md, session 27).
RUNNER_UP_SHARE = 0.9


def _runner_up(choice: Any, sized: tuple[str, tuple[tuple[str, str], ...]], arms: list[str]) -> list[str]:
    """[the best candidate unlike the arms (`size_free` of theirs is `sized`) estimated
    within `RUNNER_UP_SHARE` of the choice, whose method dry-runs], or []."""
    from pardec_cli.methods.adaptive import arm_label, size_free
    from pardec_cli.methods.registry import dry_runs

    bar = RUNNER_UP_SHARE * max(choice.estimate.score, 1.0)
    for estimate in choice.ranking:
        if estimate.method == "vanilla" or size_free(estimate.method, dict(estimate.knobs)) == sized:
            continue
        if arm_label(estimate.method, dict(estimate.knobs)) in arms:
            continue
        if estimate.score < bar:
            return []  # best first: none further is closer
        if dry_runs(estimate.method):
            return [arm_label(estimate.method, dict(estimate.knobs))]
    return []


def profile_settings(settings: Settings, profile: Any, user_set: Collection[str],
                     recommended: Mapping[str, Any] | None = None) -> Settings:
    """`settings` with the profile's sampling defaults for the options the user left unset.

    A profile that samples (its temperature above 0: the chat profile) takes the model's
    `recommended` temperature, top_p and top_k, where it has them, over its own generic
    ones; a greedy profile (code, extraction) stays greedy whatever the model suggests.
    """
    table = dict(profile.sampling)
    if recommended and table.get("temperature", 0) > 0:
        table.update({key: value for key, value in recommended.items() if key in RECOMMENDED_KEYS})
    defaults = {key: value for option, key in PROFILE_SAMPLING_KEYS.items()
                if option not in user_set and (value := table.get(key)) is not None}
    if not defaults:
        return settings
    sampling_keys = {k: v for k, v in defaults.items() if k != "max_tokens"}
    return replace(
        settings,
        max_tokens=int(defaults.get("max_tokens", settings.max_tokens)),
        sampling=replace(settings.sampling, **sampling_keys),
    )


def planned_settings(text: str, profile: str, settings: Settings, user_set: Collection[str],
                     recommended: Mapping[str, Any] | None = None) -> tuple[str, Settings]:
    """(profile used, settings) for `text` without a loaded model: the given profile, or the
    one detected from the prompt, and its sampling defaults (as `plan_reply` applies them)."""
    from pardec_cli.selection.profiles import load_profiles
    from pardec_cli.selection.tasks import detect_task

    name = detect_task(text).profile if profile == AUTO else profile
    return name, profile_settings(settings, load_profiles()[name], user_set, recommended)


def build_selector(session: Any, drafters: Sequence[str] = (), profiles: Mapping[str, Profile] | None = None) -> Any:
    """auto's `AutoSelector` for a loaded session: its hardware, profiles (`profiles`, else
    read now), installed accelerators plus `drafters` (models given with --draft-model,
    which auto may then choose) and tuned results. `Session.auto_selector` keeps one per
    set of drafters."""
    from pardec_cli.selection.selector import AutoSelector

    return AutoSelector.for_session(session, drafters=tuple(drafters), profiles=profiles)


class Planner:
    """`plan_reply` for many prompts with the same request (a `gen` run, a benchmark's
    `auto` rows): the profiles and auto's selector are gathered once.

    With `apply=True` (gen) each plan becomes the session's method; with `apply=False`
    (bench, which interleaves methods) the caller builds the plan's proposer itself.
    """

    def __init__(self, session: Any, *, method: str, options: Mapping[str, Any], profile: str, settings: Settings,
                 user_set: Collection[str], drafters: Sequence[str] = (), apply: bool = True) -> None:
        from pardec_cli.selection.profiles import load_profiles

        self.session = session
        self.method, self.options, self.profile = method, dict(options), profile
        self.settings, self.user_set = settings, set(user_set)
        self.apply = apply
        self.profiles = load_profiles()
        # What the model's own files recommend for sampling (a session that cannot say: nothing).
        self.recommended: dict[str, Any] = dict(getattr(session, "recommended_sampling", None) or {})
        self.selector = None
        if method == AUTO:
            self.selector = session.auto_selector(tuple(drafters))
        elif apply:
            session.set_method(method, self.options)  # a bad knob fails before the first prompt
        self.profile_used: str | None = None
        self.warned_seed = False  # the front end says once per run that a greedy --seed does nothing

    def plan(self, text: str) -> Plan:
        """The plan for `text`; with auto (and `apply`), its method becomes the session's."""
        plan = plan_reply(text, method=self.method, options=self.options, profile=self.profile,
                          settings=self.settings, user_set=self.user_set, profiles=self.profiles,
                          selector=self.selector, recommended=self.recommended)
        self.profile_used = plan.profile
        if self.selector is not None and self.apply:
            self.session.set_method(plan.method, plan.knobs)
        return plan
