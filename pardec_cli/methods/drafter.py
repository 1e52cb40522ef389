"""Drafting with a (smaller) causal LM that keeps its own KV cache.

Shared by `draft` (a separate small model) and `layerskip` (a view of the target's own
first layers). The drafter's cache is kept consistent with the target's rollbacks by
construction: before drafting, it is cut back to the longest prefix it shares with the
current context, then fed whatever context it has not seen.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pardec_cli.engine.cache import rollback_to
from pardec_cli.engine.model import LanguageModel
from pardec_cli.engine.proposal import Draft, StartContext
from pardec_cli.engine.sampling import greedy_token, logits_to_probs, sample_from


class ModelDrafter:
    """Autoregressively drafts k tokens with `model`, reusing its cache across steps."""

    def __init__(self, model: LanguageModel, target_vocab: int, cache_factory=None) -> None:
        self.model = model
        self.target_vocab = target_vocab
        self._cache_factory = cache_factory or model.new_cache
        self._ctx: StartContext | None = None
        self.cache = None
        self.cached_ids: list[int] = []  # the tokens whose positions the cache holds

    def start(self, ctx: StartContext) -> None:
        self._ctx = ctx
        self.cache = self._cache_factory()
        self.cached_ids = []

    def draft(self, context: Sequence[int], k: int) -> Draft:
        """Draft k tokens after `context`; under sampling, also return their distributions q."""
        assert self._ctx is not None, "start() must be called first"
        sampling, generator = self._ctx.sampling, self._ctx.generator
        # Keep the longest common prefix, but always re-feed at least the last context token
        # so there are logits to draft from.
        common = _common_prefix_length(self.cached_ids, context)
        common = min(common, len(context) - 1)
        rollback_to(self.cache, common)
        logits = self.model.forward(context[common:], self.cache, last_only=True)[-1]  # [V_draft]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            logits = self._to_target_vocab(logits)  # [V_target]
            if sampling.greedy:
                token = greedy_token(logits)
            else:
                q = logits_to_probs(logits, sampling)  # [V_target]
                token = sample_from(q, generator)
                probs.append(q)
            tokens.append(token)
            if i + 1 < k:
                logits = self.model.forward([token], self.cache)[-1]
        # The cache now holds context + tokens[:-1].
        self.cached_ids = [*context, *tokens[:-1]]
        return Draft(tuple(tokens), torch.stack(probs) if probs else None)

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Align a drafter's logits [V_draft] with the target's vocabulary size.

        Vocabularies of models sharing a tokenizer often differ only by padding rows;
        ids the target does not have are never drafted, missing ones get -inf.
        """
        size = logits.shape[-1]
        if size == self.target_vocab:
            return logits
        if size > self.target_vocab:
            return logits[: self.target_vocab]
        pad = logits.new_full((self.target_vocab - size,), float("-inf"))
        return torch.cat([logits, pad])


def _common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
