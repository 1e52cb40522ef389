"""Where the chat's replies come from: a model loaded here, or a running `pardec serve`.

Both chats (the Textual app and the line mode) drive a reply the same way, whatever
generates it:

    reply = backend.start(messages, system, settings)   # planned, prefill not yet run
    reply.method, reply.knobs                            # what decodes it
    for piece in reply: ...                              # text, tokens per new step, live stats
    message = reply.finish()                             # the saved turn (cancelled if cut short)

`LocalChat` plans every reply through `pardec_cli.planning.Planner` (the last user
message is the text, as `pardec gen` plans its prompt): the profile's [sampling] table,
the model's recommended sampling and `--draft-model` drafters apply as in gen.
`RemoteChat` sends the turns to a server, whose worker plans them with the same
function; its stream's "pardec" field carries the tokens per step and the live stats.
Torch-free and Textual-free.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.planning import describe_sampling
from pardec_cli.tui.conversation import Message
from pardec_cli.tui.settings import ChatSettings


@dataclass(frozen=True)
class LiveStats:
    """A snapshot of a running generation, passed from the worker thread to the UI."""

    generated_tokens: int
    steps: int
    tokens_per_s: float
    mean_tokens_per_step: float
    ttft_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"generated_tokens": self.generated_tokens, "steps": self.steps, "tokens_per_s": self.tokens_per_s,
                "mean_tokens_per_step": self.mean_tokens_per_step, "ttft_s": self.ttft_s}

    @classmethod
    def of(cls, stats: Any) -> LiveStats:
        """From a `GenerationStats` (or a dict with its fields)."""
        get = stats.get if isinstance(stats, Mapping) else (lambda key, default=0: getattr(stats, key, default))
        return cls(int(get("generated_tokens", 0)), int(get("steps", 0)), float(get("tokens_per_s", 0.0)),
                   float(get("mean_tokens_per_step", 0.0)), float(get("ttft_s", 0.0)))


@dataclass(frozen=True)
class ReplyPiece:
    """What one step (or one server chunk) added: text, tokens of each new decoding step, stats."""

    text: str
    steps: list[int] = field(default_factory=list)
    stats: LiveStats | None = None


def last_user_message(messages: Sequence[Mapping[str, str]]) -> str:
    """The text a reply is planned for (its task profile is detected from it)."""
    return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


# -- a model loaded in this process ---------------------------------------------------------


class LocalChat:
    """Replies from a `Session` (or anything with its surface) in this process."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._planner: Any = None
        self._planned_for: tuple[Any, ...] | None = None

    @property
    def model_name(self) -> str:
        return self.session.model_name

    @property
    def where(self) -> str:
        return f"{self.session.dtype}, {self.session.device}"

    def planner(self, settings: ChatSettings) -> Any:
        """The `Planner` for `settings`, rebuilt when they change (a named method is built
        then, so a bad knob or a missing draft model is reported at once)."""
        from pardec_cli.planning import Planner

        key = (settings.method, tuple(sorted(settings.options.items())), settings.profile, settings.drafters,
               settings.planning_settings(), settings.user_set)
        if key != self._planned_for:
            self._planner = Planner(self.session, method=settings.method, options=dict(settings.options),
                                    profile=settings.profile, settings=settings.planning_settings(),
                                    user_set=settings.user_set, drafters=settings.drafters)
            self._planned_for = key
        return self._planner

    def apply(self, settings: ChatSettings) -> None:
        """Check `settings` now (builds a named method on the model)."""
        self.planner(settings)

    def start(self, messages: list[dict[str, str]], system: str | None, settings: ChatSettings) -> LocalReply:
        """Plan the reply to `messages` and start it (the prefill runs with the first piece)."""
        planner = self.planner(settings)
        plan = planner.plan(last_user_message(messages))
        if (self.session.method_name, self.session.method_options) != (plan.method, plan.knobs):
            self.session.set_method(plan.method, plan.knobs)  # a planner made before another one's switch
        prompt_ids = self.session.encode(messages, system=system)
        stream = self.session.stream(prompt_ids, max_new_tokens=plan.settings.max_tokens,
                                     sampling=plan.settings.sampling, stop=plan.settings.stop,
                                     repetition_guard=settings.repetition_guard)
        return LocalReply(stream, plan, self.session.proposer.knobs())


class LocalReply:
    """One reply decoding in this process."""

    def __init__(self, stream: Any, plan: Any, knobs: dict[str, Any]) -> None:
        self.stream, self.plan = stream, plan
        self.method, self.knobs, self.profile = plan.method, knobs, plan.profile
        self.tail = ""

    def __iter__(self) -> Iterator[ReplyPiece]:
        for chunk in self.stream:
            steps = [len(chunk.event.tokens)] if chunk.event.index > 0 else []  # step 0 is the prefill
            yield ReplyPiece(chunk.text, steps, LiveStats.of(self.stream.stats))

    def finish(self) -> Message:
        """The reply as a saved turn; a reply left early is marked cancelled (`tail` holds
        the text that was still held back)."""
        if self.stream.finish_reason is None:
            self.tail = self.stream.finish()
        return Message("assistant", self.stream.text, finish_reason=self.stream.finish_reason, method=self.method,
                       knobs=self.knobs, stats=self.stream.stats.to_dict(), profile=self.profile,
                       sampling=describe_sampling(self.plan.settings.sampling))


# -- a running `pardec serve` ---------------------------------------------------------------

class RemoteChat:
    """Replies from a running `pardec serve` at `url` (its model, its method choice)."""

    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None) -> None:
        from pardec_cli.client import ServerClient

        self.client = ServerClient(url, api_key=api_key)
        self.model_name = model or self.client.model()  # also checks that the server answers
        self.where = f"at {self.client.base}"

    def apply(self, settings: ChatSettings) -> None:
        """Settings the server cannot take are refused now (it checks the method per request)."""
        request_body([], None, settings, model=self.model_name)

    def start(self, messages: list[dict[str, str]], system: str | None, settings: ChatSettings) -> RemoteReply:
        body = request_body(messages, system, settings, model=self.model_name)
        events = self.client.stream("/chat/completions", body)
        first = next(events, None)  # the server answers once it has prefilled the prompt
        return RemoteReply(events, first or {})


def request_body(messages: list[dict[str, str]], system: str | None, settings: ChatSettings, *,
                 model: str) -> dict[str, Any]:
    """The chat request for the server: only what the user set (the server's planner fills
    in the profile's and the model's defaults, as a local chat's would)."""
    if settings.top_k is not None:
        raise PardecUsageError("top_k is not part of the OpenAI API, so it cannot be sent to a server",
                               hint="leave top_k unset (--top-k, /set top_k=default): the server's profile gives it")
    if settings.drafters:
        raise PardecUsageError("with --server, --draft-model needs --method draft")
    body: dict[str, Any] = {"model": model, "stream_options": {"include_usage": True}}
    for key in ("max_tokens", "temperature", "top_p"):
        if getattr(settings, key) is not None:
            body[key] = getattr(settings, key)
    if settings.seed is not None:
        body["seed"] = settings.seed
    if settings.stop:
        body["stop"] = list(settings.stop)
    extension: dict[str, Any] = {"method": settings.method, "profile": settings.profile,
                                 "repetition_guard": settings.repetition_guard}
    if settings.options:
        extension["knobs"] = dict(settings.options)
    body["pardec"] = extension
    body["messages"] = ([{"role": "system", "content": system}] if system else []) + list(messages)
    return body


class RemoteReply:
    """One reply streaming from the server (closing it cancels the generation there)."""

    def __init__(self, events: Iterator[dict[str, Any]], first: dict[str, Any]) -> None:
        self.events = events
        started = first.get("pardec") or {}
        self.method, self.knobs = started.get("method", "?"), dict(started.get("knobs") or {})
        self.profile = started.get("profile")
        self.parts: list[str] = [_delta_text(first)]
        self.end: dict[str, Any] = {}
        self.tail = ""
        self._stats: LiveStats | None = None

    def __iter__(self) -> Iterator[ReplyPiece]:
        for event in self.events:
            extension = event.get("pardec") or {}
            text = _delta_text(event)
            if "finish_reason" in extension:  # the last chunk: the reply's record
                self.end = extension
            self.parts.append(text)
            if "live" in extension:
                self._stats = LiveStats.of(extension["live"])
            if text or extension.get("steps"):
                yield ReplyPiece(text, [int(n) for n in extension.get("steps") or []], self._stats)

    def finish(self) -> Message:
        if not self.end:  # left early: closing the connection cancels the generation on the server
            close = getattr(self.events, "close", None)
            if close is not None:
                close()
        end = self.end
        return Message("assistant", "".join(self.parts), finish_reason=end.get("finish_reason", "cancelled"),
                       method=end.get("method", self.method), knobs=dict(end.get("knobs") or self.knobs),
                       stats=dict(end.get("stats") or (self._stats.to_dict() if self._stats else {})),
                       profile=end.get("profile", self.profile), sampling=end.get("sampling"))


def _delta_text(event: Mapping[str, Any]) -> str:
    for choice in event.get("choices") or []:
        return (choice.get("delta") or {}).get("content") or ""
    return ""


def as_backend(loaded: Any) -> Any:
    """What a chat's loader returned, as a backend: a `Session` is wrapped in `LocalChat`."""
    if isinstance(loaded, (LocalChat, RemoteChat)):
        return loaded
    return LocalChat(loaded)


def check_backend_error(exc: BaseException) -> str:
    """A one-line (plus hint) message for an error raised while generating."""
    if isinstance(exc, PardecError):
        return exc.message + (f"\nhint: {exc.hint}" if exc.hint else "")
    return f"unexpected error: {type(exc).__name__}: {exc}"
