"""How the chat generates: method, knobs, task profile and sampling, validated without torch.

`ChatSettings` is immutable: every change (side panel, command palette, `/method`,
`/set`) builds a new one through `with_method` / `with_values` (or `apply_command` for a
slash command, shared by the full-screen and the line-mode chat), which check the input
the same way `pardec gen` does and raise `PardecUsageError` with a clear message.

A sampling value left at None is one the user did not set: the task profile gives it
(and a sampling profile the model's recommended values), exactly as in `pardec gen`;
`planning_settings` and `user_set` hand the settings to `pardec_cli.planning`, which
plans every reply (see backend.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pardec_cli.engine.sampling_params import SamplingParams
from pardec_cli.errors import PardecUsageError
from pardec_cli.planning import AUTO, PROFILE_SAMPLING_KEYS

# Built-in values for what neither the user nor the profile sets (as `pardec gen`'s options).
BUILTIN = {"max_tokens": 256, "temperature": 0.0, "top_p": 1.0, "top_k": 0}


def profile_choices() -> list[str]:
    """Task profiles a user can pick (`-P`, the side panel, `/profile`): auto, then the
    built-in and the user's own profiles."""
    from pardec_cli.selection.profiles import profile_names

    return [AUTO, *profile_names()]


@dataclass(frozen=True)
class ChatSettings:
    """Everything that decides how a reply is generated (the conversation is separate).

    max_tokens, temperature, top_p and top_k are None until the user sets them: the
    profile (and the model's recommendation) decides them per reply.
    """

    method: str
    options: Mapping[str, Any] = field(default_factory=dict)  # knobs as given (-O, k=v), validated
    profile: str = AUTO
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    drafters: tuple[str, ...] = ()  # --draft-model with method auto: drafters auto may choose
    repetition_guard: bool = True  # end a reply caught in a loop (engine.text.RepetitionGuard)

    @property
    def user_set(self) -> frozenset[str]:
        """The settings of `planning.PROFILE_SAMPLING_KEYS` the user set."""
        return frozenset(key for key in PROFILE_SAMPLING_KEYS if getattr(self, key) is not None)

    def value(self, key: str) -> Any:
        """The user's value for `key`, else the built-in one (the profile may replace it)."""
        given = getattr(self, key)
        return BUILTIN[key] if given is None else given

    def sampling(self) -> SamplingParams:
        """The engine's sampling parameters before the profile fills in (validated when built)."""
        return SamplingParams(temperature=self.value("temperature"), top_k=self.value("top_k"),
                              top_p=self.value("top_p"), seed=self.seed)

    def planning_settings(self, system: str | None = None) -> Any:
        """`planning.Settings` for `plan_reply` (with `user_set`, the profile fills in the rest)."""
        from pardec_cli.planning import Settings

        return Settings(max_tokens=self.value("max_tokens"), sampling=self.sampling(), stop=self.stop,
                        system=system, raw=False)

    def describe_sampling(self) -> str:
        """What the user set: ``greedy``, ``temp 0.7 top-p 0.9 top-k 40 seed 1``, ``-n 64``;
        ``sampling per profile`` for what the profile decides."""
        if self.temperature == 0:
            text = "greedy"
        else:
            parts = [f"temp {self.temperature:g}"] if self.temperature is not None else []
            if self.top_p is not None:
                parts.append(f"top-p {self.top_p:g}")
            if self.top_k is not None:
                parts.append(f"top-k {self.top_k}")
            if self.seed is not None:
                parts.append(f"seed {self.seed}")
            text = " ".join(parts) if parts else "sampling per profile"
        return text + (f" · -n {self.max_tokens}" if self.max_tokens is not None else "")

    def with_method(self, name: str, options: Mapping[str, Any] | None = None) -> ChatSettings:
        """The same settings with another method; its name and knobs are checked first."""
        name = name.strip()
        options = dict(options or {})
        check_method(name, options)
        return replace(self, method=name, options=options)

    def with_values(self, values: Mapping[str, Any]) -> ChatSettings:
        """The same settings with some sampling values changed (strings are parsed).

        Keys: temp/temperature, top_p, top_k, seed, max_tokens/n, profile, guard. A value
        "default" (or empty) gives a setting back to the profile; seed "none" clears it.
        """
        changes: dict[str, Any] = {}
        for raw_key, raw in values.items():
            key = SETTING_ALIASES.get(raw_key.strip().lower().replace("-", "_"))
            if key is None:
                raise PardecUsageError(f"unknown setting {raw_key!r} (settings: {', '.join(SETTING_NAMES)})")
            changes[key] = _parse_setting(key, raw)
        updated = replace(self, **changes)
        updated.sampling()  # validate the combination (ranges)
        if updated.max_tokens is not None and updated.max_tokens < 1:
            raise PardecUsageError(f"max_tokens must be at least 1, got {updated.max_tokens}")
        if updated.profile != self.profile and updated.profile not in (choices := profile_choices()):
            raise PardecUsageError(f"unknown profile {updated.profile!r} (profiles: {', '.join(choices)})")
        return updated

    def apply_command(self, name: str, argument: str) -> ChatSettings:
        """The settings after the slash command `/name argument` (method, set, profile), as
        both chats carry it out."""
        from pardec_cli.methods.options import parse_assignments

        words = argument.split()
        if name == "method":
            return self.with_method(*parse_method_words(words))
        if name == "set":
            if not words:
                raise PardecUsageError("/set KEY=VALUE ... (" + ", ".join(SETTING_NAMES) + ")")
            return self.with_values(parse_assignments(tuple(words)))
        if name == "profile":
            return self.with_values({"profile": argument})
        raise ValueError(f"/{name} does not change the settings")


SETTING_ALIASES = {
    "temp": "temperature", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
    "seed": "seed", "max_tokens": "max_tokens", "n": "max_tokens", "profile": "profile",
    "guard": "repetition_guard", "repetition_guard": "repetition_guard",
}
SETTING_NAMES = ("temp", "top_p", "top_k", "seed", "max_tokens", "profile", "guard")
_SETTING_TYPES: dict[str, type] = {"temperature": float, "top_p": float, "top_k": int, "seed": int, "max_tokens": int,
                                   "profile": str, "repetition_guard": bool}


def _parse_setting(key: str, raw: Any) -> Any:
    kind = _SETTING_TYPES[key]
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if key == "seed" and text.lower() in {"", "none", "random"}:
        return None
    if key in PROFILE_SAMPLING_KEYS and text.lower() in {"", "default", "profile"}:
        return None  # back to the profile's value
    if kind is bool:
        if text.lower() in {"on", "true", "yes", "1"}:
            return True
        if text.lower() in {"off", "false", "no", "0"}:
            return False
        raise PardecUsageError(f"{key} expects on or off, got {raw!r}")
    if kind is str:
        return text
    try:
        return kind(text)
    except ValueError:
        raise PardecUsageError(f"{key} expects {'a number' if kind is float else 'an integer'}, got {raw!r}") from None


def check_method(name: str, options: Mapping[str, Any]) -> None:
    """Raise PardecUsageError unless `name` is a method and `options` are knobs it has."""
    from pardec_cli.methods.options import resolve_options
    from pardec_cli.methods.registry import AUTO_OPTIONS, get_spec

    if name == AUTO:
        own = {option.name for option in AUTO_OPTIONS}
        if set(options) - own:
            raise PardecUsageError(f"with method auto the knobs are chosen too (auto's own: {', '.join(sorted(own))}); "
                                   "name a method to set them")
        resolve_options(AUTO, AUTO_OPTIONS, options)
        return
    spec = get_spec(name)
    if "+" not in name:  # a combination routes its knobs to its parts when it is built
        resolve_options(name, spec.options, options)


def parse_method_words(words: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """``["pld", "num_draft=4"]`` or ``["pld[num_draft=4]"]`` (a label as bench and --explain
    print it) -> ("pld", {"num_draft": "4"}) (values parsed when the method is built)."""
    from pardec_cli.methods.options import merge_label_knobs, parse_assignments

    if not words:
        raise PardecUsageError("name a method, e.g. /method pld num_draft=8")
    name, knobs = merge_label_knobs(words[0], words[1:], "after it")
    return name, dict(parse_assignments(knobs))
