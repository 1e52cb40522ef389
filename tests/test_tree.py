"""Tree verification: masks and positions, KV compaction, the greedy walk and exact tree sampling."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from pardec_cli.engine.cache import cache_length, keep_path, rollback_to
from pardec_cli.engine.model import LanguageModel
from pardec_cli.engine.proposal import Draft
from pardec_cli.engine.sampling import sample_from
from pardec_cli.engine.tree import ROOT, TreeBuilder, ancestor_matrix, children_by_row, depths, kept_along, tree_attention
from pardec_cli.engine.verify import LazyRows, Verdict, verify_greedy, verify_sampling
from pardec_cli.errors import CacheRollbackError
from tests.stats_helpers import chi_square_p_value
from tests.tiny_models import tiny_llama

# root -> 10 -> 20 -> 30 ; root -> 11 -> 12 ; 10 -> 40 -> 41 ; 11 -> 13
TOKENS = (10, 20, 30, 11, 12, 40, 41, 13)
PARENTS = (-1, 0, 1, -1, 3, 0, 5, 3)
PATHS = {0: [10], 1: [10, 20], 2: [10, 20, 30], 3: [11], 4: [11, 12], 5: [10, 40], 6: [10, 40, 41], 7: [11, 13]}
PROMPT = [5, 9, 11, 4, 7, 3]


def test_ancestors_depths_and_children():
    seen = ancestor_matrix(PARENTS)
    for node, path in PATHS.items():
        row = seen[node + 1]
        assert row[0]  # everyone sees the root
        ancestors = {i + 1 for i, _ in enumerate(TOKENS) if row[i + 1]}
        expected = {n + 1 for n, p in PATHS.items() if path[: len(p)] == p}  # prefixes of its path
        assert ancestors == expected
    assert depths(PARENTS) == [len(PATHS[i]) for i in range(len(TOKENS))]
    assert children_by_row(PARENTS, len(TOKENS)) == [[0, 3], [1, 5], [2], [], [4, 7], [], [6], [], []]
    assert children_by_row(None, 3) == [[0], [1], [2], []]


@pytest.mark.parametrize(
    ("following", "kept"),
    [
        ((10, 40, 41, 7), 3),  # the deepest path of the second branch under 10
        ((10, 20, 30, 7), 3),  # a whole branch, then past the tree's depth
        ((11, 13), 2),
        ((11, 99, 1), 1),  # off the tree after one node
        ((12,), 0),  # no child of the root holds it
        ((10, 40), None),  # 41 might follow: undecided yet
        ((), None),
    ],
)
def test_kept_along_walks_the_tree_as_greedy_verification_would(following, kept):
    assert kept_along(Draft.tree(TOKENS, PARENTS), following) == kept


def test_kept_along_a_chain_and_an_empty_draft():
    assert kept_along(Draft((4, 5, 6)), (4, 5, 9)) == 2
    assert kept_along(Draft((4, 5, 6)), (4, 5, 6)) == 3
    assert kept_along(Draft((4, 5, 6)), (4,)) is None
    assert kept_along(Draft(), ()) == 0


def test_mask_and_positions_layout():
    mask, positions = tree_attention(PARENTS, past=4, dtype=torch.float32, device="cpu")
    n = len(TOKENS)
    assert mask.shape == (1, 1, n + 1, 4 + n + 1)
    assert positions.tolist() == [[4, *(4 + len(PATHS[i]) for i in range(n))]]
    assert (mask[0, 0, :, :4] == 0).all()  # the cache is visible to every node
    blocked = mask[0, 0, :, 4:] < 0
    assert torch.equal(~blocked, torch.from_numpy(ancestor_matrix(PARENTS)))
    assert float(mask.min()) == torch.finfo(torch.float32).min
    bf16_mask, _ = tree_attention(PARENTS, past=0, dtype=torch.bfloat16, device="cpu")
    assert bf16_mask.dtype == torch.bfloat16


@pytest.mark.parametrize("seed", [0, 1])
def test_every_node_is_scored_like_its_path_decoded_sequentially(seed):
    model = LanguageModel(tiny_llama(seed))
    with torch.inference_mode():
        cache = model.new_cache()
        model.forward(PROMPT[:-1], cache)
        logits = model.forward([PROMPT[-1], *TOKENS], cache, parents=PARENTS)  # [n+1, V]
        assert cache_length(cache) == len(PROMPT) + len(TOKENS)

        def sequential(path):
            return model.forward(PROMPT + path, model.new_cache())[-1]

        torch.testing.assert_close(logits[0], sequential([]), rtol=0, atol=2e-5)
        for node, path in PATHS.items():
            torch.testing.assert_close(logits[node + 1], sequential(path), rtol=0, atol=2e-5)


def test_a_chain_through_the_tree_path_equals_the_plain_causal_forward():
    model = LanguageModel(tiny_llama(2))
    chain = [10, 20, 30, 40]
    with torch.inference_mode():
        plain = model.forward(PROMPT + chain, model.new_cache())[len(PROMPT) - 1 :]
        cache = model.new_cache()
        model.forward(PROMPT[:-1], cache)
        masked = model.forward([PROMPT[-1], *chain], cache, parents=(-1, 0, 1, 2))
    torch.testing.assert_close(masked, plain, rtol=0, atol=2e-5)


# --- KV compaction ------------------------------------------------------------------


def _cache_after(model, tokens):
    cache = model.new_cache()
    with torch.inference_mode():
        model.forward(tokens, cache)
    return cache


@pytest.mark.parametrize("path", [(0, 5, 6), (3, 7), (3, 4), (0, 1, 2), (3,), (0, 5), ()], ids=str)
def test_keep_path_leaves_the_cache_of_the_kept_path(path):
    model = LanguageModel(tiny_llama(3))
    with torch.inference_mode():
        cache = _cache_after(model, PROMPT[:-1])
        model.forward([PROMPT[-1], *TOKENS], cache, parents=PARENTS)
        keep_path(cache, len(PROMPT), path)
        kept_tokens = [TOKENS[i] for i in path]
        assert cache_length(cache) == len(PROMPT) + len(path)
        reference = _cache_after(model, PROMPT + kept_tokens)
        for ours, theirs in zip(cache.layers, reference.layers):
            torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=2e-5)
            torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=2e-5)
        # Decoding goes on as if only the kept path had ever been fed.
        after = model.forward([50, 51], cache)
        expected = model.forward(PROMPT + kept_tokens + [50, 51], model.new_cache())[-2:]
        torch.testing.assert_close(after, expected, rtol=0, atol=2e-5)


def test_keep_path_of_a_prefix_is_a_plain_crop():
    model = LanguageModel(tiny_llama(4))
    with torch.inference_mode():
        cache = _cache_after(model, PROMPT + [10, 20, 30])
        before = [layer.keys for layer in cache.layers]
        keep_path(cache, len(PROMPT), (0, 1))
    assert cache_length(cache) == len(PROMPT) + 2
    for layer, old in zip(cache.layers, before):
        assert layer.keys.data_ptr() == old.data_ptr()  # a view: nothing was copied


def test_keep_path_on_a_cache_without_layers_fails_loudly():
    class CropOnly:
        def get_seq_length(self):
            return 8

        def crop(self, n):
            pass

    with pytest.raises(CacheRollbackError):
        keep_path(CropOnly(), 4, (1,))
    keep_path(CropOnly(), 4, (0, 1, 2, 3))  # a prefix only crops


def test_rollback_still_refuses_to_grow():
    model = LanguageModel(tiny_llama(4))
    cache = _cache_after(model, [1, 2])
    with pytest.raises(ValueError):
        rollback_to(cache, 3)


# --- trees as built by proposers ------------------------------------------------------


def test_tree_builder_merges_shared_prefixes_and_respects_caps():
    builder = TreeBuilder(max_depth=3)
    assert builder.path([1, 2, 3, 4]) == [0, 1, 2]  # depth 4 is cut
    assert builder.path([1, 2, 5]) == [0, 1, 3]  # shares 1, 2
    assert builder.path([6]) == [4]
    draft = builder.draft()
    assert draft.tokens == (1, 2, 3, 5, 6) and draft.parents == (-1, 0, 1, 1, -1)
    capped = TreeBuilder(max_nodes=2)
    assert capped.path([1, 2, 3]) == [0, 1]
    assert capped.child(ROOT, 1) == 0  # existing nodes are still found when full
    assert capped.child(ROOT, 9) is None


def test_graft_maps_every_node_and_a_one_branch_tree_is_a_chain():
    builder = TreeBuilder()
    builder.path([7, 8])
    ids = builder.graft((7, 9, 8, 4), (-1, 0, -1, 2))
    assert ids == [0, 2, 3, 4]
    assert builder.draft().parents == (-1, 0, 0, -1, 3)
    chain = TreeBuilder()
    chain.path([3, 4, 5])
    assert chain.draft() == Draft((3, 4, 5))
    assert Draft.tree([3, 4], [-1, 0]).is_chain
    with pytest.raises(ValueError):
        Draft.tree([3, 4], [-1, 1])


# --- greedy walk ------------------------------------------------------------------------


def _logits_preferring(next_token: dict[int, int], rows: int, vocab: int = 64) -> torch.Tensor:
    logits = torch.zeros(rows, vocab)
    for row, token in next_token.items():
        logits[row, token] = 5.0
    return logits


# Row by row (a CPU) or every row's argmax at once (an accelerator): the same walk.
@pytest.mark.parametrize("all_rows", [False, True])
def test_greedy_walk_follows_the_targets_argmax_through_the_tree(all_rows):
    draft = Draft(TOKENS, parents=PARENTS)
    # The target wants 11 after the root, then 13 after node 3, then 33 after node 7.
    logits = _logits_preferring({0: 11, 4: 13, 8: 33, 1: 20, 2: 30}, len(TOKENS) + 1)
    assert verify_greedy(draft, logits, all_rows=all_rows) == Verdict(2, (11, 13, 33), (3, 7))
    # Nothing matches at the root: only the target's token.
    assert verify_greedy(draft, _logits_preferring({0: 60}, len(TOKENS) + 1), all_rows=all_rows) == Verdict(0, (60,), ())


@pytest.mark.parametrize("all_rows", [False, True])
def test_greedy_chain_keeps_the_longest_agreeing_prefix(all_rows):
    chain = Draft((4, 5, 6))
    logits = _logits_preferring({0: 4, 1: 5, 2: 9, 3: 7}, 4)
    assert verify_greedy(chain, logits, all_rows=all_rows) == Verdict(2, (4, 5, 9), (0, 1))
    assert verify_greedy(Draft(), _logits_preferring({0: 3}, 1), all_rows=all_rows) == Verdict(0, (3,), ())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_greedy_walk_takes_the_first_of_tied_maxima_and_nans_on_any_layout(dtype):
    """On a CPU float32 rows are read through numpy all at once, other dtypes row by row by
    `greedy_token`: either way the first of tied maxima, a NaN above everything, as
    generate()'s argmax; strided rows (a padded step's first rows, every other word) and
    rows that require grad alike."""
    logits = torch.zeros(5, 64, dtype=dtype)
    logits[0, [4, 9]] = 5.0  # tied: 4
    logits[1, [30, 5]] = float("nan")  # the first NaN: 5
    logits[2, [9, 60]] = 3.0  # tied: 9
    chain = Draft((4, 5, 9, 1))
    assert verify_greedy(chain, logits[:4]) == Verdict(3, (4, 5, 9, 0), (0, 1, 2))
    assert verify_greedy(Draft((2, 15)), logits[:3, ::2]) == Verdict(2, (2, 15, 30), (0, 1))  # words 0, 2, 4, ...
    grad = logits.float().requires_grad_()
    assert verify_greedy(chain, grad[:4]) == verify_greedy(chain, logits[:4])


# --- exact sampling over trees ------------------------------------------------------------

P0 = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10])  # target after the root
P_AFTER = {  # target after each first token (its row for the drafted ones)
    0: torch.tensor([0.10, 0.50, 0.10, 0.20, 0.10]),
    1: torch.tensor([0.40, 0.10, 0.10, 0.10, 0.30]),
    2: torch.tensor([0.20, 0.20, 0.20, 0.20, 0.20]),
    3: torch.tensor([0.05, 0.05, 0.60, 0.20, 0.10]),
    4: torch.tensor([0.25, 0.25, 0.25, 0.15, 0.10]),
}
EXACT = {(a, b): float(P0[a] * P_AFTER[a][b]) for a in range(5) for b in range(5)}
# Root children 1, 3, 0 (tried in that order); node 0 (token 1) has children 4 and 1.
TREE = Draft((1, 3, 0, 4, 1), parents=(-1, -1, -1, 0, 0))


def _tree_rows(draft: Draft) -> torch.Tensor:
    rows = [P0]
    for token in draft.tokens:  # depth-1 nodes: the target after that token
        rows.append(P_AFTER[token])
    # depth-2 rows are never used for the first two tokens' distribution beyond the bonus;
    # give them a distribution anyway so a walk that goes there can sample.
    return torch.stack(rows)


def _two_tokens(rule, draft: Draft, n: int, seed: int = 0) -> Counter:
    generator = torch.Generator().manual_seed(seed)
    rows = _tree_rows(draft)
    counts: Counter = Counter()
    for _ in range(n):
        verdict = rule(draft, rows, generator)
        first = verdict.tokens[0]
        # The second token: from the verdict when it has one, else sampled from the target.
        second = verdict.tokens[1] if len(verdict.tokens) > 1 else sample_from(P_AFTER[first], generator)
        counts[(first, second)] += 1
    return counts


def _rule_without_residual(draft, target_probs, generator):
    """A plausible bug: after a rejected sibling, try the next one against the unchanged p."""
    children = children_by_row(draft.parents, len(draft.tokens))
    row, path, p = 0, [], target_probs[0]
    while True:
        kept = None
        for child in children[row]:
            if float(torch.rand(1, generator=generator)) < float(p[draft.tokens[child]]):
                kept = child
                break
        if kept is None:
            residual = p.clone()
            for child in children[row]:
                residual[draft.tokens[child]] = 0
            return Verdict(len(path), (*(draft.tokens[i] for i in path), sample_from(residual, generator)), tuple(path))
        path.append(kept)
        row, p = kept + 1, target_probs[kept + 1]


@pytest.mark.slow  # statistical
def test_tree_sampling_keeps_the_target_distribution():
    counts = _two_tokens(verify_sampling, TREE, 30000)
    assert chi_square_p_value(counts, EXACT) > 0.001


def test_tree_sampling_with_lazy_rows_is_the_same_rule():
    rows = _tree_rows(TREE)
    lazy = LazyRows(torch.log(rows), lambda row: torch.softmax(row, -1))
    for seed in range(20):
        a = verify_sampling(TREE, rows, torch.Generator().manual_seed(seed))
        b = verify_sampling(TREE, lazy, torch.Generator().manual_seed(seed))
        assert a == b


@pytest.mark.slow  # statistical
def test_the_tree_statistical_test_catches_a_wrong_rule():
    counts = _two_tokens(_rule_without_residual, TREE, 30000)
    assert chi_square_p_value(counts, EXACT) < 1e-6


@pytest.mark.slow  # statistical
def test_sampled_siblings_use_the_multi_candidate_residual():
    """Two siblings drawn i.i.d. from q (they may coincide): SpecInfer's rule stays exact."""
    q = torch.tensor([0.05, 0.05, 0.30, 0.30, 0.30])
    generator = torch.Generator().manual_seed(3)
    counts: Counter = Counter()
    rows = torch.stack([P0, P0, P0])
    for _ in range(30000):
        a, b = torch.multinomial(q, 2, replacement=True, generator=generator).tolist()
        draft = Draft((a, b), torch.stack([q, q]), parents=(-1, -1))
        counts[verify_sampling(draft, rows, generator).tokens[0]] += 1
    assert chi_square_p_value(counts, dict(enumerate(P0.tolist()))) > 0.001


def _classic_chain_rule(draft_tokens, draft_probs, target_probs, generator):
    """The vectorised chain rule this engine used before trees (kept here as the reference)."""
    k = draft_tokens.shape[0]
    if k == 0:
        return Verdict(0, (sample_from(target_probs[0], generator),))
    rows = torch.arange(k)
    p_draft = target_probs[rows, draft_tokens]
    q_draft = draft_probs[rows, draft_tokens] if draft_probs is not None else torch.ones_like(p_draft)
    accept_prob = torch.clamp(p_draft / q_draft, max=1.0)
    uniforms = torch.rand(k, generator=generator)
    rejected = (uniforms >= accept_prob).nonzero()
    accepted = int(rejected[0, 0]) if rejected.numel() else k
    kept = draft_tokens[:accepted].tolist()
    if accepted == k:
        return Verdict(k, (*kept, sample_from(target_probs[k], generator)), tuple(range(k)))
    p = target_probs[accepted]
    if draft_probs is not None:
        residual = torch.clamp(p - draft_probs[accepted], min=0.0)
    else:
        residual = p.clone()
        residual[draft_tokens[accepted]] = 0.0
    return Verdict(accepted, (*kept, sample_from(residual / residual.sum(), generator)), tuple(range(accepted)))


@pytest.mark.parametrize("with_q", [False, True], ids=["deterministic", "sampled"])
def test_a_chain_is_verified_exactly_as_by_the_classic_chain_rule(with_q):
    """Same seed, same tokens: chains consume the generator as before trees existed."""
    probs = torch.softmax(torch.randn(5, 6, generator=torch.Generator().manual_seed(0)), -1)
    q = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(1)), -1) if with_q else None
    for seed in range(200):
        tokens = torch.randint(0, 6, (4,), generator=torch.Generator().manual_seed(seed + 1000))
        ours = verify_sampling(Draft(tuple(tokens.tolist()), q), probs, torch.Generator().manual_seed(seed))
        theirs = _classic_chain_rule(tokens, q, probs, torch.Generator().manual_seed(seed))
        assert ours == theirs


def test_ancestor_matrix_is_lower_triangular_with_a_full_diagonal():
    seen = ancestor_matrix(PARENTS)
    assert np.array_equal(seen, np.tril(seen))
    assert seen.diagonal().all()
