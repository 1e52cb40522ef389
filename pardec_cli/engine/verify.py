"""Verification rules: which drafted tokens the target keeps, and its own next token.

Both rules take the target's output for the positions [last, d_1, ..., d_k]: row i is
the target's prediction for the token after d_i (row 0: after the last context token).

- Greedy: keep the longest prefix where d_{i+1} == argmax(row i); the bonus token is the
  argmax after the last kept token. Output equals plain greedy decoding exactly.
- Sampling (Leviathan et al. / Chen et al. 2023): keep d_i with probability
  min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from the normalised residual
  max(0, p_i - q_i); if all k survive sample the bonus from p_k. The emitted tokens are
  distributed exactly as sampling from the target one token at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pardec_cli.engine.sampling import sample_from


@dataclass(frozen=True)
class Verdict:
    """accepted: how many drafted tokens were kept; tokens: those plus the target's next token."""

    accepted: int
    tokens: tuple[int, ...]


def verify_greedy(draft_tokens: torch.Tensor, logits: torch.Tensor) -> Verdict:
    """draft_tokens: [k] long; logits: [k+1, V]."""
    predicted = logits.argmax(dim=-1)  # [k+1]
    k = draft_tokens.shape[0]
    if k == 0:
        return Verdict(0, (int(predicted[0]),))
    matches = (draft_tokens == predicted[:k]).int()  # [k]
    accepted = int(matches.cumprod(dim=0).sum())
    kept = predicted[: accepted + 1].tolist()  # equal to the draft where accepted
    return Verdict(accepted, tuple(kept))


def verify_sampling(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Exact speculative sampling for a chain.

    draft_tokens: [k] long; draft_probs: [k, V] (q) or None for a deterministic draft
    (q is then a point mass on d_i); target_probs: [k+1, V] (p), already processed by
    temperature/top-k/top-p.
    """
    k = draft_tokens.shape[0]
    if k == 0:
        return Verdict(0, (sample_from(target_probs[0], generator),))
    rows = torch.arange(k, device=target_probs.device)
    p_draft = target_probs[rows, draft_tokens]  # [k]: p_i(d_i)
    q_draft = draft_probs[rows, draft_tokens] if draft_probs is not None else torch.ones_like(p_draft)
    accept_prob = torch.clamp(p_draft / q_draft, max=1.0)
    uniforms = torch.rand(k, generator=generator, device=target_probs.device)
    rejected = (uniforms >= accept_prob).nonzero()
    accepted = int(rejected[0, 0]) if rejected.numel() else k
    kept = draft_tokens[:accepted].tolist()
    if accepted == k:
        return Verdict(k, (*kept, sample_from(target_probs[k], generator)))
    # Residual distribution at the rejected position: norm(max(0, p - q)).
    p = target_probs[accepted]
    if draft_probs is not None:
        residual = torch.clamp(p - draft_probs[accepted], min=0.0)
    else:
        residual = p.clone()
        residual[draft_tokens[accepted]] = 0.0
    total = residual.sum()
    # total == 0 only if p == q (then rejection had probability 0): guard against rounding.
    fallback = sample_from(p, generator) if float(total) <= 0.0 else sample_from(residual / total, generator)
    return Verdict(accepted, (*kept, fallback))
