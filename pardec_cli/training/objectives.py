"""What a head learns, as a loss over batches of precomputed target features.

Labels are the corpus' own next tokens (for self-distilled replies: exactly the target's
greedy choices). Cross-entropies are over the draft vocabulary (the tokens the heads
will draft from; labels outside it are skipped), which keeps the output layer small
enough to train on a CPU and matches what the heads score at generation time.

- Medusa: head k at position i guesses x[i+2+k] from the target's final state h[i];
  only the residual blocks learn (the LM head stays the target's), losses weighted
  0.8^k (Medusa-1).
- EAGLE: at position i the head reads (h[i], x[i+1]) and outputs a guess of h[i+1];
  EAGLE-1 learns it by regression (smooth L1, weight 1) plus the cross-entropy of the
  target's LM head on it against x[i+2] (weight 0.1), as in the paper; EAGLE-3 by the
  cross-entropy of its own head alone. Training-time test (EAGLE-3, HASS): `unroll`
  steps; step j feeds the head its own step j-1 output from position i-1 in place of
  h[i], attending exactly as a depth-j node of a draft tree does (to the real
  positions up to i-j+1 and to its own ancestors), so deeper guesses are trained too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn import functional as F

from pardec_cli.heads.eagle import DraftCache, EagleDrafter
from pardec_cli.heads.medusa import MedusaHeads
from pardec_cli.heads.vocab import DraftVocab
from pardec_cli.training.features import FeatureSet

IGNORE = -100


def draft_index(vocab_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    """[V] long: target id -> its draft vocabulary index, IGNORE where it has none."""
    index = torch.full((vocab_size,), IGNORE, dtype=torch.long)
    index[torch.tensor(list(vocab_ids), dtype=torch.long)] = torch.arange(len(vocab_ids))
    return index


class MedusaObjective:
    """Cross-entropy of every head against the token it guesses, over single positions."""

    def __init__(self, heads: MedusaHeads, vocab: DraftVocab, to_draft: torch.Tensor, *, batch_positions: int = 1024) -> None:
        self.heads, self.vocab, self.to_draft = heads, vocab, to_draft
        self.batch_positions = batch_positions
        self.weights = torch.tensor([0.8**k for k in range(heads.num_heads)])

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.heads.parameters()

    def _flatten(self, data: FeatureSet) -> tuple[torch.Tensor, torch.Tensor]:
        """All positions: features [N, h] and labels [N, H] (draft indices, IGNORE where none)."""
        features, labels = [], []
        for tokens, feats, start in zip(data.tokens, data.features, data.learn_from):
            n = tokens.shape[0]
            rows = torch.full((n, self.heads.num_heads), IGNORE, dtype=torch.long)
            for k in range(self.heads.num_heads):
                shift = 2 + k  # head k at position i guesses x[i + 2 + k]
                if n > shift:
                    target = self.to_draft[tokens[shift:]]
                    target[torch.arange(shift, n) < start] = IGNORE
                    rows[: n - shift, k] = target
            keep = (rows != IGNORE).any(dim=1)
            features.append(feats[keep])
            labels.append(rows[keep])
        return torch.cat(features), torch.cat(labels)

    def bind(self, train: FeatureSet, held_out: FeatureSet) -> None:
        self.train_x, self.train_y = self._flatten(train)
        self.eval_x, self.eval_y = self._flatten(held_out) if len(held_out) else (self.train_x[:0], self.train_y[:0])

    @property
    def positions(self) -> int:
        return int(self.train_x.shape[0])

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weighted loss, top-1 accuracy per head [H]) for features x [N, h], labels y [N, H]."""
        logits = self.vocab.logits(self.heads(x))  # [N, H, Vd]
        per_head = torch.stack([
            F.cross_entropy(logits[:, k], y[:, k], ignore_index=IGNORE) if (y[:, k] != IGNORE).any() else logits.sum() * 0
            for k in range(self.heads.num_heads)
        ])  # fmt: skip
        valid = y != IGNORE
        hits = (logits.argmax(-1) == y) & valid
        accuracy = hits.sum(0) / valid.sum(0).clamp(min=1)
        return (per_head * self.weights).sum() / self.weights.sum(), accuracy

    def step_loss(self, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        pick = torch.randint(0, self.positions, (min(self.batch_positions, self.positions),), generator=generator)
        loss, accuracy = self.loss(self.train_x[pick], self.train_y[pick])
        return loss, float(accuracy[0])

    def evaluate(self) -> dict[str, Any]:
        """Top-1 accuracy of each head on the held-out positions."""
        if self.eval_x.shape[0] == 0:
            return {}
        with torch.no_grad():
            hits = torch.zeros(self.heads.num_heads)
            count = torch.zeros(self.heads.num_heads)
            for start in range(0, self.eval_x.shape[0], 4096):
                x, y = self.eval_x[start : start + 4096], self.eval_y[start : start + 4096]
                logits = self.vocab.logits(self.heads(x))
                valid = y != IGNORE
                hits += ((logits.argmax(-1) == y) & valid).sum(0)
                count += valid.sum(0)
        return {"top1_per_head": [round(float(h / max(c, 1)), 4) for h, c in zip(hits, count)]}


class EagleObjective:
    """EAGLE's losses over whole sequences (windows), with `unroll` training-time-test steps."""

    def __init__(
        self, drafter: EagleDrafter, vocab: DraftVocab, to_draft: torch.Tensor, *, batch_sequences: int = 4,
        max_len: int = 256, unroll: int = 2, regression: bool = True, noise: float = 0.05,
    ) -> None:  # fmt: skip
        self.drafter, self.vocab, self.to_draft = drafter, vocab, to_draft
        self.batch_sequences, self.max_len, self.unroll = batch_sequences, max_len, max(1, unroll)
        self.regression, self.noise = regression, noise

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.drafter.parameters() if p.requires_grad)

    def bind(self, train: FeatureSet, held_out: FeatureSet) -> None:
        self.train, self.held_out = train, held_out
        self.feature_scale = float(torch.cat([f[:64] for f in train.features]).std()) if len(train) else 1.0

    @property
    def positions(self) -> int:
        return self.train.num_tokens

    def _batch(self, data: FeatureSet, indices: Sequence[int], generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        """Padded windows: features [B, L, F], tokens [B, L], lengths [B], label starts [B]."""
        windows = []
        for i in indices:
            tokens, feats, start = data.tokens[i], data.features[i], data.learn_from[i]
            n = tokens.shape[0]
            offset = 0
            if n > self.max_len:  # a random window when training, else the one where the labels start
                last = n - self.max_len
                offset = int(torch.randint(0, last + 1, (1,), generator=generator)) if generator is not None else min(start, last)
            end = min(n, offset + self.max_len)
            windows.append((tokens[offset:end], feats[offset:end], max(0, start - offset)))
        width = max(w[0].shape[0] for w in windows)
        fdim = windows[0][1].shape[1]
        out = {
            "tokens": torch.zeros(len(windows), width, dtype=torch.long),
            "features": torch.zeros(len(windows), width, fdim),
            "lengths": torch.tensor([w[0].shape[0] for w in windows]),
            "learn_from": torch.tensor([w[2] for w in windows]),
        }
        for b, (tokens, feats, _) in enumerate(windows):
            out["tokens"][b, : tokens.shape[0]] = tokens
            out["features"][b, : feats.shape[0]] = feats
        return out

    def _forward(self, batch: dict[str, torch.Tensor], train: bool) -> tuple[torch.Tensor, list[float]]:
        """(loss, top-1 accuracy per unrolled step) of a padded batch."""
        tokens, features, lengths, learn_from = batch["tokens"], batch["features"], batch["lengths"], batch["learn_from"]
        b, width = tokens.shape
        n = width - 1  # pairs (h[i], x[i+1]) for i < width - 1
        position = torch.arange(n)
        in_seq = position[None, :] + 1 < lengths[:, None]  # the pair exists: [B, n]
        # Label of pair i: x[i+2] (as a draft index), when inside the sequence and in the reply.
        labels = torch.full((b, n), IGNORE, dtype=torch.long)
        labels[:, : n - 1] = self.to_draft[tokens[:, 2:]]
        labels[~((position[None, :] + 2 < lengths[:, None]) & (position[None, :] + 2 >= learn_from[:, None]))] = IGNORE
        inputs = features[:, :n]
        if train and self.noise:
            inputs = inputs + torch.randn_like(inputs) * (self.noise * self.feature_scale)
        next_state = features[:, 1 : n + 1]  # regression target of pair i: h[i+1] (EAGLE-1)
        positions = position[None, :].expand(b, n)
        step_tokens = tokens[:, 1 : n + 1]
        cache = DraftCache()
        total, accuracies = torch.zeros(()), []
        hidden = inputs
        for step in range(1, self.unroll + 1):
            mask = _unrolled_mask(step, n, in_seq)  # [B, 1, n, step * n]
            out = self.drafter(hidden, step_tokens, positions, cache=cache, mask=mask)  # [B, n, h]
            valid = in_seq & (position[None, :] >= step - 1)
            step_labels = labels.masked_fill(~valid, IGNORE)
            logits = self.vocab.logits(self.drafter.head_input(out))  # [B, n, Vd]
            weight = 0.8 ** (step - 1)
            if (step_labels != IGNORE).any():
                total = total + weight * (0.1 if self.regression else 1.0) * F.cross_entropy(
                    logits.flatten(0, 1), step_labels.flatten(), ignore_index=IGNORE
                )
            if self.regression:
                reg_valid = valid & (position[None, :] + 2 >= learn_from[:, None])
                if reg_valid.any():
                    total = total + weight * F.smooth_l1_loss(out[reg_valid], next_state[reg_valid])
            with torch.no_grad():
                counted = step_labels != IGNORE
                hits = ((logits.argmax(-1) == step_labels) & counted).sum()
                accuracies.append(float(hits / counted.sum().clamp(min=1)))
            # Next step: position i reads this step's output at i - 1 (a zero row at 0, never a label).
            hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        return total, accuracies

    def step_loss(self, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        count = min(self.batch_sequences, len(self.train))
        indices = torch.randint(0, len(self.train), (count,), generator=generator).tolist()
        loss, accuracies = self._forward(self._batch(self.train, indices, generator), train=True)
        return loss, accuracies[0]

    def evaluate(self) -> dict[str, Any]:
        """Top-1 accuracy on the held-out sequences, per unrolled step (step j: a depth-j guess)."""
        if not len(self.held_out):
            return {}
        totals = [0.0] * self.unroll
        batches = 0
        with torch.no_grad():
            for start in range(0, len(self.held_out), self.batch_sequences):
                indices = list(range(start, min(start + self.batch_sequences, len(self.held_out))))
                _, accuracies = self._forward(self._batch(self.held_out, indices, None), train=False)
                totals = [t + a for t, a in zip(totals, accuracies)]
                batches += 1
        return {"top1_per_depth": [round(t / batches, 4) for t in totals]}


def _unrolled_mask(step: int, n: int, in_seq: torch.Tensor) -> torch.Tensor:
    """Bool [B, 1, n, step * n]: what unrolled step `step`'s query i may attend (see the module docstring).

    Block 1 (the real features): keys i' <= i - step + 1 that exist; block l (2..step):
    the key at i - (step - l), its depth-l ancestor; the last block is the query itself.
    """
    position = torch.arange(n)
    blocks = [(position[None, :] <= position[:, None] - step + 1)[None].expand(in_seq.shape[0], n, n) & in_seq[:, None, :]]
    for level in range(2, step + 1):
        blocks.append((position[None, :] == position[:, None] - (step - level))[None].expand(in_seq.shape[0], n, n))
    return torch.cat(blocks, dim=-1)[:, None]
