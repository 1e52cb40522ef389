"""Sampling: the processed distribution, and speculative sampling keeps the target's distribution."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from pardec_cli.engine import verify as verify_module
from pardec_cli.engine.loop import decode
from pardec_cli.engine.proposal import Draft
from pardec_cli.engine.sampling import SamplingParams, greedy_token, logits_to_probs, sample_from
from pardec_cli.engine.verify import HeadRows, LazyRows, verify_greedy, verify_sampling
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods import registry
from tests.stats_helpers import chi_square_p_value
from tests.test_exactness import make_env
from tests.tiny_models import peaked, tiny_llama


def test_temperature_top_k_top_p_define_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    full = logits_to_probs(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(full, torch.softmax(logits, -1))
    top2 = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert top2[2] == 0 and top2[3] == 0 and torch.isclose(top2.sum(), torch.tensor(1.0))
    # top-p 0.7: the first token has 0.64 < 0.7, so the second is kept too, the rest dropped.
    nucleus = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert (nucleus > 0).tolist() == [True, True, False, False]
    cold = logits_to_probs(logits, SamplingParams(temperature=0.1))
    assert cold[0] > 0.99


def _nucleus_by_full_sort(scores, top_p):
    """The definition, spelled out: sort everything, drop a token once the mass before it reaches top_p."""
    probs = torch.softmax(scores, -1)
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    drop = (torch.cumsum(ordered, -1) - ordered) >= top_p
    return torch.zeros_like(drop).scatter(-1, order, drop)


@pytest.mark.parametrize("spread", [0.3, 3.0, 12.0])  # a flat nucleus of thousands of tokens .. a peaked one of a few
@pytest.mark.parametrize("top_p", [0.5, 0.95, 0.999])
def test_top_p_equals_the_full_sort_whatever_the_nucleus_size(spread, top_p):
    generator = torch.Generator().manual_seed(int(spread * 10) + int(top_p * 1000))
    logits = torch.randn(3, 49152, generator=generator) * spread  # float32: no ties
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
    assert torch.equal(probs == 0, _nucleus_by_full_sort(logits, top_p))
    assert torch.allclose(probs.sum(-1), torch.ones(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_token_is_the_first_of_tied_maxima_as_in_generate(dtype):
    logits = torch.zeros(49152, dtype=dtype)
    logits[[7, 300, 40000]] = 5.0  # 16-bit logits tie often
    assert greedy_token(logits) == 7
    logits[300] = 5.5
    assert greedy_token(logits) == 300
    assert greedy_token(logits[::2]) == 150  # a strided row
    logits[[900, 1200]] = float("nan")  # as torch's argmax: the first NaN, above everything
    assert greedy_token(logits) == int(logits.float().argmax()) == 900
    assert greedy_token(torch.full((4,), float("-inf"), dtype=dtype)) == 0


def test_sample_from_follows_the_distribution_and_never_draws_an_impossible_token():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    generator = torch.Generator().manual_seed(3)
    counts = Counter(sample_from(probs, generator) for _ in range(6000))
    assert set(counts) <= {1, 3, 4}
    assert chi_square_p_value(counts, {1: 0.5, 3: 0.3, 4: 0.2}) > 1e-3
    # A point mass at either end of the vocabulary.
    for token in (0, 5):
        point = torch.zeros(6)
        point[token] = 1.0
        assert {sample_from(point, generator) for _ in range(50)} == {token}


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)])
def test_bad_sampling_settings_are_usage_errors(bad):
    with pytest.raises(PardecUsageError):
        SamplingParams(**bad)


def _wrong_rule(draft, target_probs, generator):
    """A classic bug: on rejection, resample from p instead of the residual max(0, p - q). (Chains only.)"""
    k, draft_probs = len(draft.tokens), draft.probs
    for i in range(k):
        p, q = target_probs[i], draft_probs[i] if draft_probs is not None else None
        token = draft.tokens[i]
        q_token = float(q[token]) if q is not None else 1.0
        if float(torch.rand(1, generator=generator)) >= min(1.0, float(p[token]) / q_token):
            resampled = int(torch.multinomial(p, 1, generator=generator))
            return verify_module.Verdict(i, (*draft.tokens[:i], resampled), tuple(range(i)))
    last = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return verify_module.Verdict(k, (*draft.tokens, last), tuple(range(k)))


def _draw_one_token(rule, p, q, n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(n):
        token = int(torch.multinomial(q, 1, generator=generator))  # the drafter samples d ~ q
        verdict = rule(Draft((token,), q.unsqueeze(0)), torch.stack([p, p]), generator)
        counts[verdict.tokens[0]] += 1
    return counts


P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
Q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])


@pytest.mark.slow  # statistical
def test_speculative_sampling_rule_outputs_the_target_distribution():
    counts = _draw_one_token(verify_sampling, P, Q, 20000)
    assert chi_square_p_value(counts, dict(enumerate(P.tolist()))) > 0.001


@pytest.mark.slow  # statistical
def test_the_statistical_test_catches_a_wrong_rule():
    counts = _draw_one_token(_wrong_rule, P, Q, 20000)
    assert chi_square_p_value(counts, dict(enumerate(P.tolist()))) < 1e-6


@pytest.mark.slow  # statistical
def test_a_deterministic_draft_is_handled_exactly():
    """q = point mass: accept with p(d); on rejection sample p with d removed."""
    generator = torch.Generator().manual_seed(1)
    counts = Counter()
    for _ in range(20000):
        verdict = verify_sampling(Draft((3,)), torch.stack([P, P]), generator)
        counts[verdict.tokens[0]] += 1
    assert chi_square_p_value(counts, dict(enumerate(P.tolist()))) > 0.001


# --- end to end through the loop, on a tiny model --------------------------------------

VOCAB = 4
PROMPT = [1, 3, 2, 3]
SAMPLING = SamplingParams(temperature=1.0)


def exact_joint(model, steps: int, sampling: SamplingParams = SAMPLING) -> dict[tuple[int, ...], float]:
    """P(t1..t_steps | PROMPT) under `sampling`, computed by brute force, one full forward per prefix."""
    probs: dict[tuple[int, ...], float] = {}
    with torch.inference_mode():
        for seq in itertools.product(range(VOCAB), repeat=steps):
            p = 1.0
            for i in range(steps):
                logits = model(torch.tensor([PROMPT + list(seq[:i])])).logits[0, -1]
                p *= float(logits_to_probs(logits, sampling)[seq[i]])
            probs[seq] = p
    return probs


def _sample_joint(method: str, options: dict, target, drafter, n: int) -> Counter:
    env = make_env(target, drafter)
    proposer = registry.create(method, options, env)
    counts = Counter()
    for i in range(n):
        params = SamplingParams(temperature=1.0, seed=i)
        tokens = [t for e in decode(env.target, proposer, PROMPT, max_new_tokens=3, sampling=params) for t in e.tokens]
        counts[tuple(tokens)] += 1
    return counts


@pytest.fixture(scope="module")
def models():
    target = peaked(tiny_llama(11, vocab=VOCAB, layers=2), scale=3.0)
    drafter = peaked(tiny_llama(12, vocab=VOCAB, layers=1), scale=3.0)
    return target, drafter, exact_joint(target, 3)


@pytest.mark.slow  # statistical
@pytest.mark.parametrize("method,options", [
    ("draft", {"model": "drafter", "k": 2, "adaptive": False}),
    ("layerskip", {"layers": 1, "k": 2, "adaptive": False}),
    ("pld", {"min_ngram": 1, "max_ngram": 1}),
    ("pld", {"min_ngram": 1, "max_ngram": 1, "fit": True, "num_draft": 3}),  # lengths chosen per step
    # Trees: several candidates per node, so the multi-candidate rule runs end to end.
    ("recycling", {"topk": 3, "nodes": 6, "depth": 2}),
    ("lookahead+pld", {"window": 2, "ngram": 3, "guesses": 2, "pld.branches": 2}),
])
def test_generations_follow_the_target_distribution(models, method, options):
    target, drafter, exact = models
    counts = _sample_joint(method, options, target, drafter, 800)
    assert chi_square_p_value(counts, exact) > 0.001


@pytest.mark.slow  # statistical
def test_end_to_end_test_catches_a_wrong_rule(models, monkeypatch):
    from pardec_cli.engine import loop

    monkeypatch.setattr(loop, "verify_sampling", _wrong_rule)
    target, drafter, exact = models
    counts = _sample_joint("draft", {"model": "drafter", "k": 2, "adaptive": False}, target, drafter, 2000)
    assert chi_square_p_value(counts, exact) < 1e-4


@pytest.mark.slow  # statistical
def test_end_to_end_test_catches_a_wrong_tree_rule(models, monkeypatch):
    """Trying the next sibling against the unchanged p (no residual) skews a tree method's output."""
    from pardec_cli.engine import loop
    from tests.test_tree import _rule_without_residual

    monkeypatch.setattr(loop, "verify_sampling", _rule_without_residual)
    target, drafter, exact = models
    counts = _sample_joint("recycling", {"topk": 3, "nodes": 6, "depth": 2}, target, drafter, 2000)
    assert chi_square_p_value(counts, exact) < 1e-4


def test_verification_over_head_rows_computes_the_rows_it_reads_and_decides_as_over_all_logits():
    """`HeadRows` (a step whose head runs for the rows read): greedy and sampling walks give
    the verdicts they give over the whole logits tensor; the head ran for the first tile,
    and for the other rows in one more pass once the walk read past it."""
    torch.manual_seed(0)
    vocab, width, rows, tile = 50, 8, 11, 4
    weight, normed = torch.randn(vocab, width), torch.randn(rows, width)
    calls: list[int] = []

    def head(x: torch.Tensor) -> torch.Tensor:  # each row alone: the same bits in any tile
        calls.append(x.shape[0])
        return torch.stack([weight @ row for row in x])

    full = head(normed)
    best = full.argmax(-1).tolist()
    # The target's own tokens for 5 nodes, then one it would not pick: greedy keeps 5, reading rows 0-5.
    tokens = (*best[:5], (best[5] + 1) % vocab, *best[6:10])
    for parents in (None, (-1, 0, 1, 2, 3, 4, 4, 6, 7, 8)):  # a chain; a tree with a sibling at the 7th node
        draft = Draft(tokens=tokens, parents=parents)
        calls.clear()
        verdict = verify_greedy(draft, HeadRows(normed, head, tile))
        assert verdict == verify_greedy(draft, full) and verdict.accepted == 5 and calls == [tile, rows - tile]
    calls.clear()
    draft = Draft(tokens=((best[0] + 1) % vocab, *tokens[1:]))  # rejected at once: the first tile only
    assert verify_greedy(draft, HeadRows(normed, head, tile)) == verify_greedy(draft, full) and calls == [tile]
    params = SamplingParams(temperature=0.7, top_p=0.9)

    def process(row: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(row, params)

    draft = Draft(tokens=tokens)
    for seed in range(20):
        lazy = verify_sampling(draft, LazyRows(HeadRows(normed, head, tile), process), torch.Generator().manual_seed(seed))
        assert lazy == verify_sampling(draft, LazyRows(full, process), torch.Generator().manual_seed(seed))


def test_same_seed_same_text():
    target = tiny_llama(13)
    env = make_env(target)
    proposer = registry.create("pld", {}, env)

    def sample(seed):
        params = SamplingParams(temperature=0.8, top_k=20, seed=seed)
        return [t for e in decode(env.target, proposer, PROMPT, max_new_tokens=20, sampling=params) for t in e.tokens]

    assert sample(5) == sample(5)
    assert sample(5) != sample(6)
