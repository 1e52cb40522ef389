"""vLLM's engine for one pardec command: streamed text and speculative decoding counters.

The only module that imports vLLM (on first use). It drives `vllm.LLMEngine` step by
step, so text reaches the terminal as vLLM accepts it, and reads vLLM's own
speculative decoding metrics (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos`) before and after each
request: their difference is that request's (one request runs at a time here).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count, zip_longest
from time import perf_counter
from typing import Any

from pardec_cli.engine.events import GenerationStats
from pardec_cli.errors import PardecError
from pardec_cli.vllm_engine.plan import require_vllm

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def quiet_vllm_logs() -> None:
    """Send vLLM's log to stderr, warnings and up, unless the user configured it.

    stdout holds only the reply (or the JSON). vLLM reads these variables once, when it
    is imported, in this process and in the engine processes it spawns (which inherit
    the environment): so they are set here, just before the first import.
    """
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's cumulative speculative decoding counters at one moment."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: tuple[int, ...] = ()

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        """The counts since `earlier` (one request's, when it ran alone)."""
        per_position = tuple(a - b for a, b in zip_longest(self.per_position, earlier.per_position, fillvalue=0))
        return SpecCounters(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                            self.accepted - earlier.accepted, per_position)


def read_counters(metrics: Sequence[Any]) -> SpecCounters:
    """The speculative counters among `LLMEngine.get_metrics()`'s (summed over engines)."""
    totals = {DRAFTS: 0, DRAFT_TOKENS: 0, ACCEPTED: 0}
    per_position: list[int] = []
    for metric in metrics:
        name = getattr(metric, "name", "")
        if name in totals:
            totals[name] += int(metric.value)
        elif name == PER_POSITION:
            per_position = [a + int(b) for a, b in zip_longest(per_position, metric.values, fillvalue=0)]
    return SpecCounters(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], tuple(per_position))


@dataclass
class VllmStats:
    """One request's numbers, under the names of pardec's `GenerationStats.to_dict()`."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0  # engine steps that gave this request tokens, after the first
    ttft_s: float = 0.0
    total_s: float = 0.0
    spec: SpecCounters = field(default_factory=SpecCounters)

    @property
    def drafted_tokens(self) -> int:
        return self.spec.draft_tokens

    @property
    def accepted_tokens(self) -> int:
        return self.spec.accepted

    def as_generation_stats(self) -> GenerationStats:
        """The same numbers as pardec's own `GenerationStats`, whose rates (tokens/s, tokens
        per step, acceptance) are then computed by the one definition both engines share."""
        return GenerationStats(
            prompt_tokens=self.prompt_tokens, generated_tokens=self.generated_tokens, steps=self.steps,
            drafted_tokens=self.drafted_tokens, accepted_tokens=self.accepted_tokens,
            ttft_s=self.ttft_s, total_s=self.total_s,
        )

    @property
    def tokens_per_s(self) -> float:
        return self.as_generation_stats().tokens_per_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.as_generation_stats().decode_tokens_per_s

    @property
    def mean_tokens_per_step(self) -> float:
        return self.as_generation_stats().mean_tokens_per_step

    @property
    def acceptance_rate(self) -> float:
        return self.as_generation_stats().acceptance_rate

    @property
    def acceptance_per_position(self) -> list[float]:
        """Share of drafts whose token at position i was accepted (vLLM's per-position counter / drafts)."""
        return [round(n / self.spec.drafts, 4) for n in self.spec.per_position] if self.spec.drafts else []

    def to_dict(self) -> dict[str, Any]:
        """pardec's --json "stats" fields that vLLM reports, plus its per-position acceptance.

        (propose_s / verify_s are left out: vLLM does not time drafting and verification apart.)
        """
        data = self.as_generation_stats().to_dict()
        del data["propose_s"], data["verify_s"]
        return {**data, "drafts": self.spec.drafts, "acceptance_per_position": self.acceptance_per_position}


@dataclass
class VllmStream:
    """One request: iterate for text deltas; afterwards it holds the text, ids and stats."""

    chunks: Iterator[str]
    stats: VllmStats
    token_ids: list[int] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def __iter__(self) -> Iterator[str]:
        return self.chunks


class VllmEngine:
    """vLLM's `LLMEngine` started with pardec's engine keywords."""

    def __init__(self, args: Mapping[str, Any]) -> None:
        require_vllm()
        quiet_vllm_logs()
        try:
            from vllm import EngineArgs, LLMEngine
        except ImportError as exc:  # installed but broken (a torch it was not built for...)
            raise PardecError(f"vLLM is installed but cannot be imported: {exc}") from None
        self.args = dict(args)
        try:
            self.engine = LLMEngine.from_engine_args(EngineArgs(**self.args))
        except (ValueError, RuntimeError, TypeError, ImportError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PardecError(f"vLLM could not start: {first}") from None
        self.tokenizer = self.engine.get_tokenizer()
        self._ids = count()

    def close(self) -> None:
        """Stop vLLM's engine processes (and free the memory they hold)."""
        self.engine.engine_core.shutdown()

    def counters(self) -> SpecCounters:
        return read_counters(self.engine.get_metrics())

    def stream(
        self, prompt_ids: Sequence[int], *, max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
        top_k: int = 0, seed: int | None = None, stop: Sequence[str] = (),
    ) -> VllmStream:
        """Start one request; iterate the returned stream for its text as vLLM accepts it."""
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else -1,
            seed=seed, stop=list(stop) or None, output_kind=RequestOutputKind.DELTA,
        )
        stats = VllmStats(prompt_tokens=len(prompt_ids))
        stream = VllmStream(iter(()), stats)
        stream.chunks = self._run(stream, TokensPrompt(prompt_token_ids=list(prompt_ids)), params)
        return stream

    def _run(self, stream: VllmStream, prompt: Any, params: Any) -> Iterator[str]:
        request_id = f"pardec-{next(self._ids)}"
        before = self.counters()
        start = perf_counter()
        self.engine.add_request(request_id, prompt, params)
        stats = stream.stats
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.request_id != request_id or not output.outputs:
                        continue
                    completion = output.outputs[0]
                    new_ids = list(completion.token_ids)
                    if new_ids:
                        if stats.generated_tokens == 0:
                            stats.ttft_s = perf_counter() - start
                        else:
                            stats.steps += 1
                        stats.generated_tokens += len(new_ids)
                        stream.token_ids += new_ids
                    stats.total_s = perf_counter() - start
                    if completion.text:
                        stream.parts.append(completion.text)
                        yield completion.text
                    if output.finished:
                        stream.finish_reason = completion.finish_reason or "stop"
        finally:
            if stream.finish_reason is None:  # stopped early (Ctrl-C, a closed pipe)
                self.engine.abort_request([request_id])
                stream.finish_reason = "cancelled"
            stats.total_s = perf_counter() - start
            stats.spec = self.counters().minus(before)
