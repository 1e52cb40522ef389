"""The frozen target's hidden states over a corpus, computed once and kept for every epoch.

One forward per sequence (no LM head: only the last position's logits are formed), under
no_grad (not inference mode: the states are later inputs of ops that autograd records); the chosen states are kept in memory, as [L, F] float tensors. A corpus
whose states would not fit `max_bytes` is cut (the report says how much was used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pardec_cli.training.corpus import TrainingSequence


@dataclass
class FeatureSet:
    """Per sequence: its tokens [L] (long), the target's features [L, F], and where its labels start."""

    tokens: list[torch.Tensor]
    features: list[torch.Tensor]
    learn_from: list[int]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(int(t.shape[0]) for t in self.tokens)

    def split(self, every: int) -> tuple[FeatureSet, FeatureSet]:
        """(train, held out): every `every`-th sequence is held out (at least one when there are two or more)."""
        held = [i for i in range(len(self)) if i % every == every - 1] or ([len(self) - 1] if len(self) > 1 else [])
        keep = [i for i in range(len(self)) if i not in set(held)]

        def pick(indices: list[int]) -> FeatureSet:
            return FeatureSet([self.tokens[i] for i in indices], [self.features[i] for i in indices],
                              [self.learn_from[i] for i in indices])  # fmt: skip

        return pick(keep), pick(held)


def compute_features(
    target: object,
    sequences: Sequence[TrainingSequence],
    layers: Sequence[int],
    *,
    max_bytes: int = 3 << 30,
    report: Callable[[int, int], None] | None = None,
) -> FeatureSet:
    """Run the target (a LanguageModel) over each sequence and keep the hidden states `layers` names."""
    out = FeatureSet([], [], [])
    used = 0
    with torch.no_grad():
        for index, seq in enumerate(sequences):
            cache = target.new_cache()  # type: ignore[attr-defined]
            _, features = target.forward_features(seq.tokens, cache, layers, last_only=True)  # type: ignore[attr-defined]
            size = features.numel() * 4
            if used + size > max_bytes and out.tokens:
                break
            used += size
            out.tokens.append(torch.tensor(seq.tokens, dtype=torch.long))
            out.features.append(features.float().cpu().clone())
            out.learn_from.append(seq.learn_from)
            if report:
                report(index + 1, len(sequences))
    return out
