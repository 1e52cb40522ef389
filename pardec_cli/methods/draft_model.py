"""Speculative decoding with a separate draft model (Leviathan et al., Chen et al. 2023).

A small model that shares the target's tokenizer drafts k tokens one by one; the target
verifies them in one forward. Greedy: exact match. Sampling: the engine's exact
speculative sampling, using the drafter's own distributions q.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Outcome, StartContext
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import AdaptiveLength, MethodEnv, ProposerBase
from pardec_cli.methods.drafter import ModelDrafter


class DraftModel(ProposerBase):
    """Chain drafts from a small model; draft length adapts to recent acceptance."""

    name = "draft"

    def __init__(
        self, env: MethodEnv, *, model: str | None, k: int, min_k: int, max_k: int, adaptive: bool
    ) -> None:
        if not model:
            raise PardecUsageError(
                "method 'draft' needs a draft model",
                hint="pass --draft-model NAME (a smaller model with the same tokenizer)",
            )
        if env.load_model is None:
            raise PardecUsageError("method 'draft' cannot load a draft model in this context")
        drafter, _ = env.load_model(model)  # the loader checked that it shares the target's tokenizer
        self.model_name = model
        self.length = AdaptiveLength(k, min_k, max_k, adaptive)
        self.drafter = ModelDrafter(drafter, env.target.vocab_size)

    def start(self, ctx: StartContext) -> None:
        self.drafter.start(ctx)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        k = min(self.length.k, max_tokens)
        return self.drafter.draft(context, k) if k > 0 else EMPTY_DRAFT

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        self.length.update(len(draft), outcome.accepted)

    def knobs(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "k": self.length.k,
            "min_k": self.length.min_k,
            "max_k": self.length.max_k,
            "adaptive": self.length.adaptive,
        }
