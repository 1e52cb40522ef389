"""Sampling settings and the target distribution they define.

Every rule in the engine (greedy matching, speculative sampling) works on the
distribution *after* temperature, top-k and top-p: that processed distribution is
"the target's distribution" that speculative sampling must preserve.
"""

from __future__ import annotations

import torch

from pardec_cli.engine.sampling_params import SamplingParams

__all__ = ["SamplingParams", "logits_to_probs", "make_generator", "sample_from"]


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """A private RNG for one generation, so `--seed` reproduces it and nothing global is touched."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(params.seed)
    else:
        generator.seed()
    return generator


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed next-token distribution(s).

    logits: [..., V] (any float dtype) -> probs: [..., V] float32, rows summing to 1.
    Applies temperature, then top-k, then top-p (the order Hugging Face uses).
    """
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p
        # (the most likely token always survives).
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
