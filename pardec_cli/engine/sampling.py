"""Sampling settings and the target distribution they define.

Every rule in the engine (greedy matching, speculative sampling) works on the
distribution *after* temperature, top-k and top-p: that processed distribution is
"the target's distribution" that speculative sampling must preserve.
"""

from __future__ import annotations

import torch

from pardec_cli.engine.sampling_params import SamplingParams

__all__ = ["SamplingParams", "greedy_token", "logits_to_probs", "make_generator", "sample_from"]


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


def greedy_token(logits_row: torch.Tensor) -> int:
    """The argmax of logits [V] (the first of tied maxima, a NaN above all, as generate()'s
    float32 argmax). In float32: a CPU's bf16 argmax over 49k logits costs 0.16 ms,
    converting first 0.03 ms; on a CPU numpy's argmax, ~0.01 ms against torch's ~0.1 ms
    (2% of a 5 ms decoding step)."""
    row = logits_row.detach().float()
    if row.device.type == "cpu":
        return int(row.numpy().argmax())
    return int(row.argmax())


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
        scores = _top_p(scores, params.top_p)
    return torch.softmax(scores, dim=-1)


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """scores [..., V] with the tokens outside the nucleus set to -inf: a token is dropped
    when the mass of the tokens more likely than it already reaches `top_p` (the most
    likely token always survives).

    The nucleus is found among the `size` most likely tokens, `size` growing from 64 until
    their mass reaches `top_p` (then every token past them is dropped too): a full sort of
    a 49k vocabulary costs ~2.7 ms on a CPU, the top 64 ~0.05 ms.
    """
    probs = torch.softmax(scores, dim=-1)
    vocab = probs.shape[-1]
    size = min(vocab, 64)
    while True:
        top, order = torch.topk(probs, size, dim=-1)  # [..., size], descending
        mass_through = torch.cumsum(top, dim=-1)
        if size == vocab or bool((mass_through[..., -1] >= top_p).all()):
            break
        size = min(vocab, size * 8)
    keep_top = (mass_through - top) < top_p
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, keep_top)
    return scores.masked_fill(~keep, float("-inf"))


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V] (inverse CDF in float64: one uniform number, where
    torch.multinomial draws one per token, ~0.75 ms for a 49k vocabulary on a CPU)."""
    cdf = probs.to(torch.float64).cumsum(0)
    u = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device)
    # The first token whose cumulative mass passes u * total: never a zero-probability one.
    token = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    if token >= cdf.shape[0]:  # u * total rounded up to the total itself
        token = int(torch.nonzero(probs)[-1])
    return token
