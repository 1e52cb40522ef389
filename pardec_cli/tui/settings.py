"""How the chat generates: method, knobs, task profile and sampling, validated without torch.

`ChatSettings` is immutable: every change (side panel, command palette, `/method`,
`/set`) builds a new one through `with_method` / `with_values`, which check the input
the same way `pardec gen` does and raise `PardecUsageError` with a clear message.

`method_for_reply` is the one place where the chat decides how the next reply is
decoded: the method the user named, or with "auto" the choice of `pardec_cli.selection.selector`
for the last user message, the profile and this machine (as `pardec gen` makes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pardec_cli.engine.sampling_params import SamplingParams
from pardec_cli.errors import PardecUsageError

AUTO = "auto"  # as a method: chosen per reply; as a profile: detected from the message


def profile_choices() -> list[str]:
    """Task profiles a user can pick (`-P`, the side panel, `/profile`): auto, then the
    built-in and the user's own profiles."""
    from pardec_cli.selection.profiles import profile_names

    return [AUTO, *profile_names()]


@dataclass(frozen=True)
class ChatSettings:
    """Everything that decides how a reply is generated (the conversation is separate)."""

    method: str
    options: Mapping[str, Any] = field(default_factory=dict)  # knobs as given (-O, k=v), validated
    profile: str = AUTO
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def sampling(self) -> SamplingParams:
        """The engine's sampling parameters (validated when built)."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed)

    def describe_sampling(self) -> str:
        """``greedy`` or ``temp 0.7 top-p 0.9 top-k 40 seed 1``, plus the token limit."""
        if self.temperature == 0:
            text = "greedy"
        else:
            text = f"temp {self.temperature:g}"
            if self.top_p < 1:
                text += f" top-p {self.top_p:g}"
            if self.top_k:
                text += f" top-k {self.top_k}"
            if self.seed is not None:
                text += f" seed {self.seed}"
        return f"{text} · -n {self.max_tokens}"

    def with_method(self, name: str, options: Mapping[str, Any] | None = None) -> ChatSettings:
        """The same settings with another method; its name and knobs are checked first."""
        name = name.strip()
        options = dict(options or {})
        check_method(name, options)
        return replace(self, method=name, options=options)

    def with_values(self, values: Mapping[str, Any]) -> ChatSettings:
        """The same settings with some sampling values changed (strings are parsed).

        Keys: temp/temperature, top_p, top_k, seed ("none" clears it), max_tokens/n, profile.
        """
        changes: dict[str, Any] = {}
        for raw_key, raw in values.items():
            key = SETTING_ALIASES.get(raw_key.strip().lower().replace("-", "_"))
            if key is None:
                raise PardecUsageError(f"unknown setting {raw_key!r} (settings: {', '.join(SETTING_NAMES)})")
            changes[key] = _parse_setting(key, raw)
        updated = replace(self, **changes)
        updated.sampling()  # validate the combination (ranges)
        if updated.max_tokens < 1:
            raise PardecUsageError(f"max_tokens must be at least 1, got {updated.max_tokens}")
        if updated.profile != self.profile and updated.profile not in (choices := profile_choices()):
            raise PardecUsageError(f"unknown profile {updated.profile!r} (profiles: {', '.join(choices)})")
        return updated


SETTING_ALIASES = {
    "temp": "temperature", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
    "seed": "seed", "max_tokens": "max_tokens", "n": "max_tokens", "profile": "profile",
}
SETTING_NAMES = ("temp", "top_p", "top_k", "seed", "max_tokens", "profile")
_SETTING_TYPES: dict[str, type] = {"temperature": float, "top_p": float, "top_k": int, "seed": int, "max_tokens": int,
                                   "profile": str}


def _parse_setting(key: str, raw: Any) -> Any:
    kind = _SETTING_TYPES[key]
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if key == "seed" and text.lower() in {"", "none", "random"}:
        return None
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
    """``["pld", "num_draft=4"]`` -> ("pld", {"num_draft": "4"}) (values parsed when the method is built)."""
    from pardec_cli.methods.options import parse_assignments

    if not words:
        raise PardecUsageError("name a method, e.g. /method pld num_draft=8")
    return words[0], dict(parse_assignments(tuple(words[1:])))


def method_for_reply(session: Any, settings: ChatSettings,
                     messages: Sequence[Mapping[str, str]]) -> tuple[str, dict[str, Any]]:
    """The method and knobs that decode the next reply to `messages` on `session`.

    The one place where the chat chooses how to decode (the model loader, every reply,
    and so the status lines and the saved conversation follow it): the method the user
    picked, or with "auto" the selector's choice for the last user message (its task
    detected when the profile is "auto"), greedy or sampled as the settings say, run
    as `planning.auto_method` says (adaptive unless adapt=off).
    """
    from pardec_cli.planning import auto_method

    if settings.method != AUTO:
        return settings.method, dict(settings.options)
    last_user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    choice = session.auto_selector().choose(last_user, settings.profile, greedy=settings.temperature == 0)
    method, knobs, _ = auto_method(choice, settings.options)
    return method, knobs
