"""The output layer a draft head scores with, over the whole vocabulary or a draft vocabulary.

Drafting on a CPU is dominated by the LM head: for SmolLM2-135M its 49152 x 576 matrix
is a fifth of the model's weights, read again for every drafted level. A draft
vocabulary (the tokens a corpus actually uses, most frequent first; EAGLE-3 ships one
as `d2t`) keeps only those rows, so drafting reads a fraction of it. Verification is by
the full target, so a smaller draft vocabulary can only lower acceptance, never change
the output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DraftVocab:
    """Scores hidden states [n, h] over draft tokens; reports target token ids.

    weight: [Vd, h], one row per draft token; ids: [Vd] long, the target token id of each
    row, or None when the rows are the target's vocabulary in order.
    """

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor | None = None) -> None:
        if ids is not None and ids.shape != (weight.shape[0],):
            raise ValueError(f"{weight.shape[0]} rows but {tuple(ids.shape)} ids")
        self.weight = weight
        self.ids = ids

    @classmethod
    def restricted(cls, lm_head: torch.Tensor, token_ids: Sequence[int] | None) -> DraftVocab:
        """An LM head [V, h] cut to `token_ids` (None or empty: all of it, shared, not copied)."""
        if not token_ids:
            return cls(lm_head)
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=lm_head.device)
        return cls(lm_head.index_select(0, ids).contiguous(), ids)

    def __len__(self) -> int:
        return int(self.weight.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., h] -> scores [..., Vd] (row j scores draft token j)."""
        return torch.nn.functional.linear(hidden, self.weight)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft token indices (any shape) -> target token ids."""
        return draft_ids if self.ids is None else self.ids[draft_ids]

    def top(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely draft tokens of each row: (log-probabilities [n, k], target ids [n, k]), best first."""
        log_probs = torch.log_softmax(self.logits(hidden).float(), dim=-1)
        values, indices = torch.topk(log_probs, min(k, len(self)), dim=-1)
        return values, self.to_target(indices)
