"""Drafts fitted to the target's row tiles: a lone row past a tile is not verified.

torch's CPU int4 kernel multiplies rows in tiles of 4, so a step of 5 rows costs about as
much as one of 8 (`quant.CPU_INT4_ROW_TILE`). The loop then drops a draft's last node when
that node alone would start a new tile; the output stays exactly plain decoding's.
"""

from __future__ import annotations

import pytest
import torch

from pardec_cli.engine.loop import decode
from pardec_cli.engine.proposal import Draft, fit_to_tiles
from pardec_cli.methods import registry
from pardec_cli.quant import CPU_INT4_ROW_TILE, quantize_linears, row_tile
from tests.test_exactness import METHOD_CASES, hf_greedy, make_env, random_prompt
from tests.test_methods_draftfree import TREE_CASES
from tests.tiny_models import peaked, tiny_llama


@pytest.mark.parametrize("nodes,tile,kept", [
    (4, 4, 3), (8, 4, 7), (12, 4, 11), (3, 4, 3), (5, 4, 5), (6, 4, 6), (7, 4, 7), (0, 4, 0), (1, 4, 1),
    (4, 1, 4), (2, 2, 1), (3, 2, 3),
])  # fmt: skip
def test_a_draft_loses_its_last_node_only_when_that_node_alone_starts_a_tile(nodes, tile, kept) -> None:
    draft = Draft(tuple(range(10, 10 + nodes)))
    assert fit_to_tiles(draft, tile).tokens == draft.tokens[:kept]


def test_a_fitted_tree_keeps_its_parents_and_a_sampled_draft_its_probabilities() -> None:
    tree = Draft.tree([5, 6, 7, 8], [-1, -1, 0, 1])
    assert fit_to_tiles(tree, 4) == Draft.tree([5, 6, 7], [-1, -1, 0])
    assert fit_to_tiles(Draft.tree([5, 6, 7, 8], [-1, 0, 1, 0]), 4).is_chain  # one branch left
    sampled = Draft((5, 6, 7, 8), probs=torch.rand(4, 10), arm="pld")
    fitted = fit_to_tiles(sampled, 4)
    assert fitted.tokens == (5, 6, 7) and torch.equal(fitted.probs, sampled.probs[:3]) and fitted.arm == "pld"


def test_int4_layers_on_a_cpu_declare_the_kernel_s_tile() -> None:
    model = tiny_llama(layers=1, hidden=64)
    assert row_tile(model) == 1
    quantize_linears(model, "int8")
    assert row_tile(model) == 1
    quantize_linears(tiny := tiny_llama(layers=1, hidden=64), "int4")
    assert row_tile(tiny) == CPU_INT4_ROW_TILE


CASES = METHOD_CASES + TREE_CASES + [("adaptive", {"arms": "suffix+recycling | pld[num_draft=8] | vanilla", "probe": 2})]


@pytest.mark.parametrize("method,options", CASES, ids=str)
def test_every_method_on_a_tiled_target_equals_plain_decoding_and_verifies_no_lone_row(method, options) -> None:
    for seed in (0, 1):
        target, drafter = peaked(tiny_llama(seed)), tiny_llama(seed + 100, layers=2)
        env = make_env(target, drafter)
        env.target.row_tile = 4
        prompt = random_prompt(seed) * 2  # repeats give the lookup methods something to draft
        proposer = registry.create(method, options, env)
        events = list(decode(env.target, proposer, prompt, max_new_tokens=40))
        assert [t for e in events for t in e.tokens] == hf_greedy(target, prompt, 40)
        assert all(e.drafted + 1 <= 4 or (e.drafted + 1) % 4 != 1 for e in events)


@pytest.mark.parametrize("method,options", [("medusa", {}), ("eagle", {}), ("eagle3", {"topk": 3, "depth": 3, "nodes": 8})], ids=str)
def test_heads_on_a_tiled_target_equal_plain_decoding(tmp_path, method, options) -> None:
    from tests.head_helpers import head_env, write_eagle1, write_eagle3, write_medusa

    model = peaked(tiny_llama(2))
    folders = {kind: tmp_path / kind for kind in ("medusa", "eagle", "eagle3")}
    write_medusa(folders["medusa"], model, seed=2)
    write_eagle1(folders["eagle"], model, seed=2)
    write_eagle3(folders["eagle3"], model, seed=2)
    env = head_env(model, folders)
    env.target.row_tile = 4
    prompt = random_prompt(2)
    events = list(decode(env.target, registry.create(method, options, env), prompt, max_new_tokens=40))
    assert [t for e in events for t in e.tokens] == hf_greedy(model, prompt, 40)
    assert all(e.drafted + 1 <= 4 or (e.drafted + 1) % 4 != 1 for e in events) and sum(e.drafted for e in events) > 0


@pytest.mark.slow  # statistical
def test_sampled_drafts_fitted_to_tiles_keep_the_target_distribution() -> None:
    """Tiles of 2: a 2-token draft of the draft model loses its last token (and that
    token's proposal probabilities); speculative sampling must still sample the target."""
    from collections import Counter

    from pardec_cli.engine.sampling import SamplingParams
    from tests.test_sampling import PROMPT, VOCAB, chi_square_p_value, exact_joint

    target = peaked(tiny_llama(11, vocab=VOCAB, layers=2), scale=3.0)
    drafter = peaked(tiny_llama(12, vocab=VOCAB, layers=1), scale=3.0)
    env = make_env(target, drafter)
    env.target.row_tile = 2
    proposer = registry.create("draft", {"model": "drafter", "k": 2, "adaptive": False}, env)
    counts: Counter = Counter()
    fitted = 0
    for i in range(800):
        events = list(decode(env.target, proposer, PROMPT, max_new_tokens=4, sampling=SamplingParams(temperature=1.0, seed=i)))
        counts[tuple(t for e in events for t in e.tokens)] += 1
        fitted += events[1].drafted == 1  # step 1 may draft 2 tokens: 3 rows, fitted to 2
    assert fitted == 800
    assert chi_square_p_value(counts, exact_joint(target, 4)) > 0.001
