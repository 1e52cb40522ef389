"""pardec's Python API: load a model, generate or stream with a method (or auto), read the stats.

    from pardec_cli import api

    model = api.load()                                   # the embedded SmolLM2-135M
    reply = api.generate(model, "Write a haiku about fast decoding.", max_tokens=48)
    print(reply.text)
    print(reply.method, f"{reply.stats.tokens_per_s:.1f} tok/s")

    stream = api.stream(model, "Explain the KV cache.", method="pld", max_tokens=64)
    for piece in stream:
        print(piece, end="", flush=True)
    print(stream.reply.stats.mean_tokens_per_step)

Every reply is planned as `pardec gen` plans it (`pardec_cli.planning.plan_reply`): the
task profile is given or detected from the prompt, the profile's sampling defaults fill
in what the call leaves as None, and ``method="auto"`` lets pardec choose the method
and its knobs for this prompt, model and machine. The model is a
`pardec_cli.session.Session`, the object the CLI, the chat and the server use; this
module only wraps it. docs/python-api.md documents it with examples.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pardec_cli.engine.events import GenerationStats
    from pardec_cli.session import Session

__all__ = ["Reply", "Stream", "generate", "load", "methods", "stream"]

def load(model: str | None = None, *, dtype: str = "auto", device: str = "auto", offline: bool | None = None,
         compile: str = "auto", weights: str = "auto") -> Session:  # fmt: skip
    """Load a model for generation; returns the `Session` to pass to `generate`/`stream`.

    `model` is what ``pardec gen -m`` takes: None for the embedded SmolLM2-135M (converted
    once on first use), a catalog alias (``"qwen2.5-1.5b"``), a Hub id (``org/name``,
    downloaded into the Hugging Face cache unless `offline`), or a model directory.
    `dtype` ("auto", "float32", "bfloat16", "float16"), `device` ("auto", "cpu", "cuda",
    "cuda:1", "mps"), `weights` ("auto", "full", "int8", "int4", "q4q8") and `compile` ("off",
    "on", "auto") mean what the CLI's flags of the same names mean; `compile="auto"` decides
    as `pardec gen` does for a reply of `generate`'s default length: the native step where
    the model takes it (nothing to compile: the embedded model on an AVX2 CPU), else eager
    steps, never minutes of compiling on load. Raises a `pardec_cli.errors.PardecError`
    with a one-line message when the model cannot be found or loaded.
    """
    from pardec_cli.session import DEFAULT_MAX_TOKENS, Session

    return Session.load(model, dtype=dtype, device=device, offline=offline, compile=compile, weights=weights,
                        expected_tokens=DEFAULT_MAX_TOKENS)  # fmt: skip


def methods() -> list[str]:
    """The names `method=` accepts besides "auto" ("vanilla", "pld", "suffix", ...)."""
    from pardec_cli.methods.registry import method_names

    return list(method_names())


@dataclass
class Reply:
    """A finished generation.

    `text` is the reply (stop strings removed); `method` and `knobs` what decoded it
    (auto's choice when method="auto"); `profile` the task profile used; `finish_reason`
    "stop" (end of text or a stop string), "length" (max_tokens reached) or "cancelled";
    `stats` the engine's `GenerationStats`: ``tokens_per_s``, ``mean_tokens_per_step``,
    ``acceptance_rate``, ``generated_tokens``, ``steps``, ``ttft_s``, ``total_s``.
    """

    text: str
    method: str
    knobs: dict[str, Any]
    profile: str
    finish_reason: str
    stats: GenerationStats
    token_ids: list[int] = field(default_factory=list, repr=False)


class Stream:
    """An ongoing generation: iterate it for text pieces as the steps accept them;
    `reply` is the finished `Reply` once the iteration ended (None before)."""

    def __init__(self, text_stream: Any, plan: Any) -> None:
        self._stream, self._plan = text_stream, plan
        self.method, self.knobs, self.profile = plan.method, dict(plan.knobs), plan.profile
        self.reply: Reply | None = None

    def __iter__(self) -> Iterator[str]:
        for chunk in self._stream:
            if chunk.text:
                yield chunk.text
        self.reply = self._reply()

    def cancel(self) -> Reply:
        """Stop early (after a `break`, say): the reply so far, finish_reason "cancelled"."""
        self._stream.finish()
        self.reply = self._reply()
        return self.reply

    def _reply(self) -> Reply:
        s = self._stream
        return Reply(s.text, self.method, self.knobs, self.profile, s.finish_reason or "", s.stats, list(s.token_ids))

    @property
    def stats(self) -> GenerationStats:
        """The statistics so far (final once the iteration ended)."""
        return self._stream.stats


def stream(session: Session, prompt: str | Sequence[Mapping[str, str]], *, method: str = "auto",
           knobs: Mapping[str, Any] | None = None, profile: str = "auto", max_tokens: int | None = None,
           temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
           seed: int | None = None, stop: Sequence[str] = (), system: str | None = None,
           raw: bool = False) -> Stream:  # fmt: skip
    """Start generating a reply to `prompt`; iterate the returned `Stream` for text.

    `prompt` is a string (sent through the model's chat template, unless `raw`) or a
    list of chat messages ``{"role": "user" | "assistant" | "system", "content": ...}``.
    `method` is "auto" (pardec chooses, per prompt) or a name from `methods()` with
    optional `knobs` (``method="pld", knobs={"num_draft": 8}``). `profile` is "code",
    "chat", "extraction" or "auto" (detected from the prompt). Sampling settings left
    as None take the profile's defaults (greedy, temperature 0, unless the profile says
    otherwise); a temperature above 0 samples, and `seed` makes it repeatable. Greedy
    output of every method equals plain decoding's.
    """
    from pardec_cli.engine.sampling_params import SamplingParams
    from pardec_cli.planning import PROFILE_SAMPLING_KEYS, Settings, load_profiles_checked, plan_reply

    profiles = load_profiles_checked(profile, session.profiles())
    given = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k}
    user_set = {key for key in PROFILE_SAMPLING_KEYS if given[key] is not None}
    settings = Settings(
        max_tokens=256 if max_tokens is None else max_tokens,
        sampling=SamplingParams(temperature=temperature or 0.0, top_p=1.0 if top_p is None else top_p,
                                top_k=top_k or 0, seed=seed),  # fmt: skip
        stop=tuple(stop), system=system, raw=raw,
    )
    text = prompt if isinstance(prompt, str) else _last_user_text(prompt)
    selector = session.auto_selector() if method == "auto" else None
    plan = plan_reply(text, method=method, options=dict(knobs or {}), profile=profile, settings=settings,
                      user_set=user_set, profiles=profiles, selector=selector)  # fmt: skip
    session.set_method(plan.method, plan.knobs)
    ids = session.encode(prompt, system=system, raw=raw)
    s = plan.settings
    return Stream(session.stream(ids, max_new_tokens=s.max_tokens, sampling=s.sampling, stop=s.stop), plan)


def generate(session: Session, prompt: str | Sequence[Mapping[str, str]], **options: Any) -> Reply:
    """Generate a whole reply to `prompt` and return it (`stream`'s options apply)."""
    running = stream(session, prompt, **options)
    for _ in running:
        pass
    assert running.reply is not None
    return running.reply


def _last_user_text(messages: Sequence[Mapping[str, str]]) -> str:
    """What auto and the profile detection read from a conversation: its last user turn."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content", ""))
    return ""
