"""How one reply is decoded: its task profile, its sampling settings and its method.

`pardec gen` and `pardec serve` plan every prompt through `plan_reply`, so a prompt
sent to the server is decoded as `gen` would decode it (same profile, same sampling
defaults, same method and knobs): the server's greedy text equals gen's.

Per prompt: the profile is the one given, or detected from the text (`-P auto`); its
[sampling] table gives defaults for the settings the user left unset; the method is
the one given, or auto's choice for the text, the profile and greedy or sampled
decoding, run by default as method `adaptive` over the choice at two sizes and plain
decoding (`auto_method`; `-O adapt=off` keeps the choice). Torch-free until a selector
is built.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

AUTO = "auto"  # as a method: chosen per prompt; as a profile: detected from the prompt

# Settings a profile's [sampling] table gives defaults for (setting name -> profile key).
PROFILE_SAMPLING_KEYS = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}


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

    def explain_lines(self) -> list[str]:
        """The reasons, plus the sampling and token limit in effect."""
        sampling = self.settings.sampling
        mode = ("greedy" if sampling.greedy
                else f"temperature {sampling.temperature:g}, top_p {sampling.top_p:g}, top_k {sampling.top_k}")
        return [*self.reasons, f"sampling  {mode}, at most {self.settings.max_tokens} tokens"]


def load_profiles_checked(profile: str) -> None:
    """Read the profiles now (a broken file is one clear error) and check a profile name."""
    from pardec_cli.selection.profiles import get_profile, load_profiles

    load_profiles()
    if profile != AUTO:
        get_profile(profile)


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
) -> Plan:
    """Plan the reply to `text`.

    `user_set` names the settings of PROFILE_SAMPLING_KEYS the user set (the others take
    the profile's value); `profiles` is `load_profiles()`; `selector` an `AutoSelector`,
    needed when `method` is "auto".
    """
    from pardec_cli.selection.tasks import detect_task

    task = detect_task(text) if profile == AUTO else None
    name = task.profile if task else profile
    settings = profile_settings(settings, profiles[name], user_set)
    if method == AUTO:
        if selector is None:
            raise ValueError("method auto needs a selector")
        choice = replace(selector.choose(text, name, greedy=settings.sampling.greedy), task=task)
        method, knobs, adapt_lines = auto_method(choice, options)
        return Plan(settings, method, knobs, name, (*choice.reasons(), *adapt_lines))
    given = f"{name} (detected: {'; '.join(task.reasons)})" if task else f"{name} (given)"
    return Plan(settings, method, dict(options), name, (f"method    {method} (given)", f"profile   {given}"))


def auto_method(choice: Any, options: Mapping[str, Any]) -> tuple[str, dict[str, Any], list[str]]:
    """How auto's `choice` (a `selection.selector.Choice`) is run, given auto's own knobs
    (`methods.registry.AUTO_OPTIONS`): (method, knobs, lines for --explain).

    With `adapt` on (the default) as method `adaptive`, whose arms are the choice at two
    sizes and plain decoding: the choice runs first and keeps running while it measures
    fastest. When auto expects nothing to beat plain decoding, plain decoding runs first
    and the best other candidate gets a chance to prove the estimate wrong.
    """
    from pardec_cli.methods.adaptive import ARM_SEPARATOR, arm_label, arms_for
    from pardec_cli.methods.options import resolve_options
    from pardec_cli.methods.registry import AUTO_OPTIONS

    method, knobs = choice.method, dict(choice.knobs)
    if not resolve_options(AUTO, AUTO_OPTIONS, options)["adapt"]:
        return method, knobs, []
    if method == "vanilla":
        other = next((e for e in choice.ranking if e.method != "vanilla"), None)
        if other is None:
            return method, knobs, []
        arms = ["vanilla", arm_label(other.method, other.knobs)]
    else:
        arms = arms_for(method, knobs)
    line = (f"adapt     while decoding, switch among {', '.join(arms)} by measured tokens/s "
            f"(-O adapt=off keeps {arm_label(method, knobs)})")
    return "adaptive", {"arms": f" {ARM_SEPARATOR} ".join(arms)}, [line]


def profile_settings(settings: Settings, profile: Any, user_set: Collection[str]) -> Settings:
    """`settings` with the profile's sampling defaults for the options the user left unset."""
    defaults = {key: value for option, key in PROFILE_SAMPLING_KEYS.items()
                if option not in user_set and (value := profile.sampling.get(key)) is not None}
    if not defaults:
        return settings
    sampling_keys = {k: v for k, v in defaults.items() if k != "max_tokens"}
    return replace(
        settings,
        max_tokens=int(defaults.get("max_tokens", settings.max_tokens)),
        sampling=replace(settings.sampling, **sampling_keys),
    )


def planned_settings(text: str, profile: str, settings: Settings, user_set: Collection[str]) -> tuple[str, Settings]:
    """(profile used, settings) for `text` without a loaded model: the given profile, or the
    one detected from the prompt, and its sampling defaults (as `plan_reply` applies them)."""
    from pardec_cli.selection.profiles import load_profiles
    from pardec_cli.selection.tasks import detect_task

    name = detect_task(text).profile if profile == AUTO else profile
    return name, profile_settings(settings, load_profiles()[name], user_set)


class Planner:
    """`plan_reply` for many prompts with the same request (a `gen` run): the profiles and
    auto's selector are gathered once, and each plan becomes the session's method."""

    def __init__(self, session: Any, *, method: str, options: dict[str, Any], profile: str, settings: Settings,
                 user_set: Collection[str], drafters: list[str]) -> None:
        from pardec_cli.selection.profiles import load_profiles

        self.session = session
        self.method, self.options, self.profile = method, options, profile
        self.settings, self.user_set = settings, set(user_set)
        self.profiles = load_profiles()
        self.selector = None
        if method == AUTO:
            from pardec_cli.selection.selector import AutoSelector

            self.selector = AutoSelector.for_session(session, drafters=drafters)
        else:
            session.set_method(method, options)  # a bad knob fails before the first prompt
        self.profile_used: str | None = None
        self.warned_seed = False  # the front end says once per run that a greedy --seed does nothing

    def plan(self, text: str) -> Plan:
        """The plan for `text`; with auto, its method becomes the session's."""
        plan = plan_reply(text, method=self.method, options=self.options, profile=self.profile,
                          settings=self.settings, user_set=self.user_set, profiles=self.profiles,
                          selector=self.selector)
        self.profile_used = plan.profile
        if self.selector is not None:
            self.session.set_method(plan.method, plan.knobs)
        return plan
