"""Run one candidate on one tuning prompt through the session, as `pardec gen` would.

Generation goes through `Session.stream` (the one decoding loop); the evaluator only
times it end to end and compares the tokens with vanilla's on the same prompt (greedy,
so they must be equal in float32). Vanilla's tokens for a prompt come from its own
measured run, or from an untimed reference generation when a candidate runs on the
prompt first (resumed tunes, rotating order).
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

from pardec_cli.tuning.prompts import TunePrompt
from pardec_cli.selection.tuned import Run
from pardec_cli.schedule import WARM_UP_TOKENS
from pardec_cli.tuning.search import VANILLA
from pardec_cli.tuning.space import TuneCandidate


class SessionEvaluator:
    """`measure(label, prompt_id) -> Run` for the candidates of one profile."""

    def __init__(self, session: Any, prompts: Sequence[TunePrompt], candidates: Sequence[TuneCandidate],
                 *, max_new_tokens: int) -> None:
        self.session = session
        self.max_new_tokens = max_new_tokens
        self.prompts = {p.prompt_id: p for p in prompts}
        self.candidates = {c.label: c for c in candidates}
        self._encoded: dict[str, list[int]] = {}
        self._reference: dict[str, list[int]] = {}
        self._proposers: dict[str, Any] = {}
        self._warm: set[str] = set()

    def encode(self, prompt_id: str) -> list[int]:
        if prompt_id not in self._encoded:
            self._encoded[prompt_id] = self.session.encode(self.prompts[prompt_id].text)
        return self._encoded[prompt_id]

    def proposer(self, label: str) -> Any:
        if label not in self._proposers:
            self._proposers[label] = self._build(label)
        return self._proposers[label]

    def _build(self, label: str) -> Any:
        if label == VANILLA:
            return self.session.build_proposer("vanilla")
        candidate = self.candidates[label]
        return self.session.build_proposer(candidate.method, candidate.knob_dict)

    def _generate(self, label: str, prompt_id: str) -> tuple[list[int], float, Any]:
        ids = self.encode(prompt_id)
        proposer = self.proposer(label)
        if label not in self._warm:
            # A method's first generation pays one-time costs (allocations, lazily built
            # tables): keep them out of its measurement, as `pardec bench` does.
            for _ in self.session.stream(ids, max_new_tokens=WARM_UP_TOKENS, proposer=proposer, record=False):
                pass
            self._warm.add(label)
            # ... on a proposer of its own: methods remember replies (suffix drafting's
            # history), and this one would copy the warm-up's start of the same prompt.
            proposer = self._proposers[label] = self._build(label)
        start = perf_counter()
        # record=False: tune keeps its own runs; they are not use (`selection.learned`).
        stream = self.session.stream(ids, max_new_tokens=self.max_new_tokens, proposer=proposer, record=False)
        for _ in stream:
            pass
        return stream.token_ids, perf_counter() - start, stream.stats

    def reference(self, prompt_id: str) -> list[int]:
        """Vanilla's tokens on this prompt (generated untimed if not measured yet)."""
        if prompt_id not in self._reference:
            self._reference[prompt_id] = self._generate(VANILLA, prompt_id)[0]
        return self._reference[prompt_id]

    def measure(self, label: str, prompt_id: str) -> Run:
        tokens, seconds, stats = self._generate(label, prompt_id)
        if label == VANILLA:
            self._reference.setdefault(prompt_id, tokens)
        match = tokens == self.reference(prompt_id)
        return Run(label, prompt_id, len(tokens), round(seconds, 5), stats.steps, stats.drafted_tokens,
                   round(stats.propose_s, 5), match)
