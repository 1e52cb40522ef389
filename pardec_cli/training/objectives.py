"""What a head learns, as a loss over batches of precomputed target features.

The labels are the target's own next-token distributions, read off the features with its
LM head (after position j the target predicts softmax(LMhead(h[j]))); the loss is the KL
divergence from them, 0 for a head that guesses exactly like the target. So every
position of every sequence teaches what the target itself would say there -- in a
prompt as in a reply, in any text given with --data -- and for the target's own greedy
replies the most likely label is exactly the token that follows. Distributions are over
the draft vocabulary (the tokens the heads will draft from), which keeps the output
layer small enough to train on a CPU and matches what the heads score when drafting.
The held-out metric is the top-1 agreement with the target on reply positions (the
text the heads will face when drafting).

- Medusa: head k at position i guesses the token after position i+1+k from the
  target's final state h[i] (Medusa-1: only the residual blocks learn, the LM head is
  the target's), losses weighted 0.8^k.
- EAGLE: at position i the head reads (h[i], x[i+1]) and outputs a guess of h[i+1];
  EAGLE-1 learns it by regression (smooth L1, weight 1) plus the cross-entropy of the
  target's LM head on it against the target's distribution after i+1 (weight 0.1), as
  in the paper; EAGLE-3 by the cross-entropy of its own head alone. Training-time test
  (EAGLE-3, HASS): `unroll` steps; step j feeds the head its own step j-1 output from
  position i-1 in place of h[i], attending exactly as a depth-j node of a draft tree
  does (to the real positions up to i-j+1 and to its own ancestors), so deeper guesses
  are trained too.
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


def divergence(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(target || head), mean over rows; both [N, Vd] (the cross-entropy minus the target's
    entropy: the same gradients, and 0 when the head guesses exactly like the target)."""
    target = torch.log_softmax(target_logits, -1)
    return (target.exp() * (target - torch.log_softmax(logits, -1))).sum(-1).mean()


class MedusaObjective:
    """Every head against the target's distribution at the position it guesses, over single positions."""

    def __init__(self, heads: MedusaHeads, vocab: DraftVocab, *, batch_positions: int = 1024) -> None:
        self.heads, self.vocab = heads, vocab  # vocab: the target's LM head on the draft vocabulary
        self.batch_positions = batch_positions
        self.weights = torch.tensor([0.8**k for k in range(heads.num_heads)])

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.heads.parameters()

    def _flatten(self, data: FeatureSet, replies_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """All states [N, h] and, per position and head, the row of the state whose prediction it guesses [N, H] (-1: none)."""
        features, sources, offset = [], [], 0
        for feats, start in zip(data.features, data.learn_from):
            n = feats.shape[0]
            rows = torch.full((n, self.heads.num_heads), -1, dtype=torch.long)
            for k in range(self.heads.num_heads):
                shift = 1 + k  # head k at position i guesses what the target predicts after position i + 1 + k
                if n > shift:
                    rows[: n - shift, k] = torch.arange(shift, n) + offset
                    if replies_only:  # count only guesses of reply tokens (the token after i+1+k is at i+2+k)
                        rows[torch.arange(n) + shift + 1 < start, k] = -1
            features.append(feats)
            sources.append(rows)
            offset += n
        return torch.cat(features), torch.cat(sources)

    def bind(self, train: FeatureSet, held_out: FeatureSet) -> None:
        self.train_x, self.train_src = self._flatten(train, replies_only=False)
        keep = (self.train_src >= 0).any(dim=1)
        self.train_rows = keep.nonzero().squeeze(1)
        self.eval_x, self.eval_src = self._flatten(held_out, replies_only=True) if len(held_out) else (None, None)

    def _loss(self, x: torch.Tensor, features: torch.Tensor, src: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weighted loss, top-1 agreement per head [H]) for the positions `rows` of `x`."""
        logits = self.vocab.logits(self.heads(x[rows]))  # [N, H, Vd]
        losses, agree = [], []
        for k in range(self.heads.num_heads):
            sources = src[rows, k]
            valid = sources >= 0
            if not valid.any():
                losses.append(logits.sum() * 0)
                agree.append(torch.tensor(0.0))
                continue
            with torch.no_grad():
                target = self.vocab.logits(features[sources[valid]])  # [n_k, Vd]
            mine = logits[valid, k]
            losses.append(divergence(mine, target))
            agree.append((mine.argmax(-1) == target.argmax(-1)).float().mean())
        return (torch.stack(losses) * self.weights).sum() / self.weights.sum(), torch.stack(agree)

    def step_loss(self, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        count = min(self.batch_positions, self.train_rows.shape[0])
        pick = self.train_rows[torch.randint(0, self.train_rows.shape[0], (count,), generator=generator)]
        loss, agree = self._loss(self.train_x, self.train_x, self.train_src, pick)
        return loss, float(agree[0])

    def evaluate(self) -> dict[str, Any]:
        """Top-1 agreement of each head with the target on held-out reply positions."""
        if self.eval_x is None:
            return {}
        with torch.no_grad():
            rows = (self.eval_src >= 0).any(dim=1).nonzero().squeeze(1)
            hits = torch.zeros(self.heads.num_heads)
            count = torch.zeros(self.heads.num_heads)
            for start in range(0, rows.shape[0], 2048):
                chunk = rows[start : start + 2048]
                logits = self.vocab.logits(self.heads(self.eval_x[chunk]))
                for k in range(self.heads.num_heads):
                    sources = self.eval_src[chunk, k]
                    valid = sources >= 0
                    if valid.any():
                        target = self.vocab.logits(self.eval_x[sources[valid]]).argmax(-1)
                        hits[k] += (logits[valid, k].argmax(-1) == target).sum()
                        count[k] += valid.sum()
        return {"top1_per_head": [round(float(h / max(c, 1)), 4) for h, c in zip(hits, count)]}

    def score(self, evaluation: dict[str, Any]) -> float:
        """One number to keep the best heads by: the 0.8^k-weighted mean top-1."""
        values = evaluation.get("top1_per_head") or [0.0]
        weights = self.weights[: len(values)].tolist()
        return sum(v * w for v, w in zip(values, weights)) / sum(weights)

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.heads.state_dict().items()}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.heads.load_state_dict(state)


class EagleObjective:
    """EAGLE's losses over whole sequences (windows), with `unroll` training-time-test steps.

    `vocab`: what the draft scores with (EAGLE-1: the target's LM head on the draft
    vocabulary; EAGLE-3: its own head); `target_vocab`: the target's LM head on the
    draft vocabulary, for the labels. Features are [L, F_in (+ h)]: for EAGLE-3 the
    last h columns are the target's final state, the labels' source.
    """

    def __init__(
        self, drafter: EagleDrafter, vocab: DraftVocab, target_vocab: DraftVocab, *, batch_sequences: int = 4,
        max_len: int = 256, unroll: int = 2, regression: bool = True, noise: float = 0.05,
    ) -> None:  # fmt: skip
        self.drafter, self.vocab, self.target_vocab = drafter, vocab, target_vocab
        self.batch_sequences, self.max_len, self.unroll = batch_sequences, max_len, max(1, unroll)
        self.regression, self.noise = regression, noise
        self.split = drafter.config.target_hidden_size * 3 if drafter.config.version == 3 else None

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.drafter.parameters() if p.requires_grad)

    def bind(self, train: FeatureSet, held_out: FeatureSet) -> None:
        self.train, self.held_out = train, held_out
        sample = torch.cat([f[:64] for f in train.features]) if len(train) else torch.ones(1, 1)
        self.feature_scale = float(sample[:, : self.split].std())

    def _batch(self, data: FeatureSet, indices: Sequence[int], generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        """Padded windows: features [B, L, F], tokens [B, L], lengths [B], reply starts [B]."""
        windows = []
        for i in indices:
            tokens, feats, start = data.tokens[i], data.features[i], data.learn_from[i]
            n = tokens.shape[0]
            offset = 0
            if n > self.max_len:  # a random window when training, else the one where the reply starts
                last = n - self.max_len
                offset = int(torch.randint(0, last + 1, (1,), generator=generator)) if generator is not None else min(start, last)
            end = min(n, offset + self.max_len)
            windows.append((tokens[offset:end], feats[offset:end], max(0, start - offset)))
        width = max(w[0].shape[0] for w in windows)
        out = {
            "tokens": torch.zeros(len(windows), width, dtype=torch.long),
            "features": torch.zeros(len(windows), width, windows[0][1].shape[1]),
            "lengths": torch.tensor([w[0].shape[0] for w in windows]),
            "learn_from": torch.tensor([w[2] for w in windows]),
        }
        for b, (tokens, feats, _) in enumerate(windows):
            out["tokens"][b, : tokens.shape[0]] = tokens
            out["features"][b, : feats.shape[0]] = feats
        return out

    def _forward(self, batch: dict[str, torch.Tensor], train: bool) -> tuple[torch.Tensor, list[float]]:
        """(loss, top-1 agreement with the target per unrolled step) of a padded batch.

        Training counts every position; evaluation only guesses of reply tokens.
        """
        tokens, features, lengths = batch["tokens"], batch["features"], batch["lengths"]
        b, width = tokens.shape
        n = width - 1  # pairs (h[i], x[i+1]) for i < width - 1
        position = torch.arange(n)
        in_seq = position[None, :] + 1 < lengths[:, None]  # the pair exists, and so does h[i+1]: [B, n]
        counted = in_seq if train else in_seq & (position[None, :] + 2 >= batch["learn_from"][:, None])
        inputs = features[:, :n, : self.split]
        final = features[:, 1 : n + 1, self.split :] if self.split else features[:, 1 : n + 1]  # h[i+1]: [B, n, h]
        if train and self.noise:
            inputs = inputs + torch.randn_like(inputs) * (self.noise * self.feature_scale)
        with torch.no_grad():
            target_logits = self.target_vocab.logits(final)  # what the target predicts after x[i+1]: [B, n, Vd]
        positions = position[None, :].expand(b, n)
        step_tokens = tokens[:, 1 : n + 1]
        cache = DraftCache()
        total, agreement = torch.zeros(()), []
        hidden = inputs
        for step in range(1, self.unroll + 1):
            mask = _unrolled_mask(step, n, in_seq)  # [B, 1, n, step * n]
            out = self.drafter(hidden, step_tokens, positions, cache=cache, mask=mask)  # [B, n, h]
            valid = counted & (position[None, :] >= step - 1)
            weight = 0.8 ** (step - 1)
            if valid.any():
                logits = self.vocab.logits(self.drafter.head_input(out[valid]))  # [N, Vd]
                ce = divergence(logits, target_logits[valid])
                total = total + weight * (0.1 * ce + F.smooth_l1_loss(out[valid], final[valid]) if self.regression else ce)
                with torch.no_grad():
                    agreement.append(float((logits.argmax(-1) == target_logits[valid].argmax(-1)).float().mean()))
            else:
                agreement.append(0.0)
            # Next step: position i reads this step's output at i - 1 (a zero row at 0, never counted).
            hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        return total, agreement

    def step_loss(self, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        count = min(self.batch_sequences, len(self.train))
        indices = torch.randint(0, len(self.train), (count,), generator=generator).tolist()
        loss, agreement = self._forward(self._batch(self.train, indices, generator), train=True)
        return loss, agreement[0]

    def evaluate(self) -> dict[str, Any]:
        """Top-1 agreement with the target on held-out reply positions, per unrolled step (step j: a depth-j guess)."""
        if not len(self.held_out):
            return {}
        totals = [0.0] * self.unroll
        batches = 0
        with torch.no_grad():
            for start in range(0, len(self.held_out), self.batch_sequences):
                indices = list(range(start, min(start + self.batch_sequences, len(self.held_out))))
                _, agreement = self._forward(self._batch(self.held_out, indices, None), train=False)
                totals = [t + a for t, a in zip(totals, agreement)]
                batches += 1
        return {"top1_per_depth": [round(t / batches, 4) for t in totals]}

    def score(self, evaluation: dict[str, Any]) -> float:
        values = evaluation.get("top1_per_depth") or [0.0]
        weights = [0.8**j for j in range(len(values))]
        return sum(v * w for v, w in zip(values, weights)) / sum(weights)

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.drafter.load_state_dict(state)


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
