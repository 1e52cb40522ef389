"""A scripted stand-in for `Session`, for fast and deterministic TUI tests.

It has the surface the chat uses (model_name, dtype, device, method_name,
method_options, proposer.knobs(), set_method, encode, stream; no recommended sampling) and replies from a
script. The text goes through the real `TextStream` (stop strings, stats,
cancellation) over scripted step events with fixed timings, so the stats shown are
the same on every run. Methods and knobs are checked by the real registry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pardec_cli.engine.events import FINISH_EOS, FINISH_LENGTH, StepEvent
from pardec_cli.errors import ContextOverflowError
from pardec_cli.methods.options import resolve_options
from pardec_cli.methods.registry import get_spec
from pardec_cli.session import TextStream

EOS = 0


class CharTokenizer:
    """One token per character: id = code point (0 is EOS)."""

    eos_token_id = EOS
    chat_template = "scripted"

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


class FakeProposer:
    def __init__(self, knobs: dict[str, Any]) -> None:
        self._knobs = knobs

    def knobs(self) -> dict[str, Any]:
        return dict(self._knobs)


class ScriptedSession:
    """Replies with `replies[i]` to the i-th message (the last one repeats).

    Step sizes cycle through `tokens_per_step` (the prefill emits one token). With
    `hold_after=N` each stream stops after N steps until `release` is set, so a test
    can act in the middle of a reply. Timings: TTFT 100 ms, then 50 ms per step.
    """

    model_name = "scripted-model"
    dtype = "float32"
    device = "cpu"

    def __init__(self, replies: Sequence[str] = ("Hello! How can I help?",), *,
                 tokens_per_step: Sequence[int] = (1, 3, 2, 4), context: int = 4096, hold_after: int | None = None,
                 finish: str = FINISH_EOS) -> None:
        self.replies = list(replies)
        self.tokens_per_step = list(tokens_per_step)
        self.context = context
        self.hold_after = hold_after
        self.finish = finish
        self.release = threading.Event()
        self.held = threading.Event()  # set when a stream is waiting on `release`
        self.tokenizer = CharTokenizer()
        self.encoded: list[tuple[list[dict[str, str]], str | None]] = []
        self.streams: list[dict[str, Any]] = []
        self.method_calls: list[tuple[str, dict[str, Any]]] = []
        self.method_name = "vanilla"
        self.method_options: dict[str, Any] = {}
        self.proposer = FakeProposer({})

    def set_method(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        knobs = resolve_options(name, get_spec(name).options, options)  # raises like the real one
        self.method_calls.append((name, options))
        self.method_name, self.method_options, self.proposer = name, options, FakeProposer(knobs)

    def encode(self, messages: Sequence[Mapping[str, str]], *, system: str | None = None) -> list[int]:
        self.encoded.append(([dict(m) for m in messages], system))
        text = (system or "") + "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return [ord(c) for c in text]

    def stream(self, prompt_ids: Sequence[int], *, max_new_tokens: int, sampling: Any, stop: Sequence[str] = (),
               repetition_guard: bool = False) -> TextStream:
        self.streams.append({"max_new_tokens": max_new_tokens, "sampling": sampling, "stop": tuple(stop),
                             "method": self.method_name, "repetition_guard": repetition_guard})
        reply = self.replies[min(len(self.streams) - 1, len(self.replies) - 1)]
        return TextStream(self._events(len(prompt_ids), reply, max_new_tokens), self.tokenizer, stop, len(prompt_ids),
                          repetition_guard=repetition_guard)

    def _events(self, prompt_len: int, reply: str, limit: int) -> Iterator[StepEvent]:
        if prompt_len >= self.context:  # like the engine: raised on the first step
            raise ContextOverflowError(
                f"the prompt is {prompt_len} tokens but the model's context holds {self.context}",
                hint="shorten the prompt")
        tokens = [ord(c) for c in reply][:limit]
        ends_with_eos = len(reply) < limit and self.finish == FINISH_EOS
        if ends_with_eos:
            tokens.append(EOS)
        cuts = [1]
        index = 0
        while sum(cuts) < len(tokens):
            cuts.append(self.tokens_per_step[index % len(self.tokens_per_step)])
            index += 1
        start = 0
        for step, size in enumerate(cuts):
            if self.hold_after is not None and step == self.hold_after:
                self.held.set()
                assert self.release.wait(10), "test never released the stream"
            chunk = tuple(tokens[start : start + size])
            start += len(chunk)
            done = start >= len(tokens)
            reason = (FINISH_EOS if ends_with_eos else FINISH_LENGTH) if done else None
            drafted = 0 if step == 0 else max(len(chunk) - 1, 0) + 1
            accepted = 0 if step == 0 else len(chunk) - 1
            yield StepEvent(step, chunk, drafted, accepted, 0.0, 0.05, 0.1 + 0.05 * step, reason)
            if done:
                return
