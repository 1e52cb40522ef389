"""The draft-free tree methods: jacobi, lookahead, recycling, suffix, pld trees and `a+b` combinations.

Greedy exactness against plain decoding and Hugging Face generate() on tiny random float32
Llamas (several seeds) and on the real SmolLM2 model; then each method's own machinery.
"""

from __future__ import annotations

import functools

import pytest
import torch

from pardec_cli.engine import cache as cache_module
from pardec_cli.engine import loop as loop_module
from pardec_cli.engine.events import FINISH_EOS, FINISH_LENGTH
from pardec_cli.engine.proposal import Draft, Outcome, StartContext
from pardec_cli.engine.sampling import SamplingParams
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods import registry
from pardec_cli.methods.lookahead import NgramPool
from pardec_cli.methods.pld import MultiNgramIndex
from pardec_cli.methods.recycling import tree_template
from pardec_cli.methods.suffix import SuffixTrie
from tests.test_exactness import hf_greedy, make_env, random_prompt, run
from tests.tiny_models import tiny_llama

TREE_CASES = [
    ("jacobi", {}),
    ("jacobi", {"window": 3}),
    ("lookahead", {}),
    ("lookahead", {"window": 3, "ngram": 3, "guesses": 2, "prompt_pool": False}),
    ("recycling", {}),
    ("recycling", {"topk": 2, "nodes": 6, "depth": 3}),
    ("suffix", {}),
    ("suffix", {"factor": 1.0, "max_nodes": 4, "min_prob": 0.0}),
    ("pld", {"branches": 4}),
    ("pld", {"branches": 2, "max_ngram": 1, "num_draft": 3}),
    ("pld", {"branches": 3, "prefer": "recent"}),
    ("suffix+recycling", {}),
    ("lookahead+pld", {"pld.branches": 3, "window": 4}),
    ("jacobi+suffix+recycling", {"nodes": 12}),
]
IDS = [f"{m}{o}" if o else m for m, o in TREE_CASES]


@functools.lru_cache(maxsize=None)
def _model(seed: int):
    return tiny_llama(seed)


@functools.lru_cache(maxsize=None)
def _reference(seed: int, limit: int) -> tuple[int, ...]:
    return tuple(hf_greedy(_model(seed), random_prompt(seed), limit))


@pytest.fixture
def non_prefix_paths(monkeypatch):
    """Counts the steps whose kept path was not the draft's first branch (a real tree compaction)."""
    seen = []
    original = cache_module.keep_path

    def spy(cache, start, path):
        if any(node != i for i, node in enumerate(path)):
            seen.append(path)
        return original(cache, start, path)

    monkeypatch.setattr(loop_module, "keep_path", spy)
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("method,options", TREE_CASES, ids=IDS)
def test_greedy_equals_vanilla_and_hf_generate(method, options, seed):
    model, prompt = _model(seed), random_prompt(seed)
    expected = list(_reference(seed, 40))
    tokens, events = run(method, options, model, prompt, max_new_tokens=40)
    assert tokens == expected
    assert run("vanilla", {}, model, prompt, max_new_tokens=40)[0] == expected
    assert events[-1].finish_reason == FINISH_LENGTH
    for event in events[1:]:
        assert 0 <= event.accepted <= event.drafted
        assert len(event.tokens) == event.accepted + 1 or event.finish_reason is not None


def test_tree_methods_accept_paths_off_the_first_branch(non_prefix_paths):
    """The exactness runs above must exercise real compaction, not only chain-like prefixes."""
    accepted = 0
    for method, options in [("suffix+recycling", {}), ("recycling", {}), ("lookahead", {})]:
        for seed in (0, 1):
            tokens, events = run(method, options, _model(seed), random_prompt(seed), max_new_tokens=40)
            assert tokens == list(_reference(seed, 40))
            accepted += sum(e.accepted for e in events)
    assert non_prefix_paths, "no step kept a path off the first branch"
    assert accepted > 20


@pytest.mark.parametrize("method,options", TREE_CASES, ids=IDS)
def test_eos_inside_a_tree_ends_the_generation_there(method, options):
    model, prompt = _model(0), random_prompt(0)
    free_run = list(_reference(0, 40))
    eos_token = free_run[17]
    cut = free_run.index(eos_token) + 1
    tokens, events = run(method, options, model, prompt, max_new_tokens=40, eos=(eos_token,))
    assert tokens == free_run[:cut]
    assert events[-1].finish_reason == FINISH_EOS


@pytest.mark.parametrize("limit", [1, 2, 7])
@pytest.mark.parametrize("method,options", TREE_CASES, ids=IDS)
def test_token_limit_is_exact(method, options, limit):
    tokens, events = run(method, options, _model(1), random_prompt(1), max_new_tokens=limit)
    assert tokens == list(_reference(1, limit))
    assert events[-1].finish_reason == FINISH_LENGTH


# --- the real model, float32 ------------------------------------------------------------

REAL_PROMPTS = [
    "Return this code unchanged:\n```python\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n```",
    "List three uses of a hash map.",
]
REAL_CASES = [
    ("jacobi", {}),
    ("lookahead", {}),
    ("recycling", {}),
    ("suffix", {}),
    ("pld", {"branches": 4}),
    ("suffix+recycling", {}),
]


@pytest.fixture(scope="module")
def real_session(embedded_model_dir):
    from pardec_cli.session import Session

    return Session.load(str(embedded_model_dir), dtype="float32", device="cpu", offline=True)


@pytest.mark.real_model
def test_real_model_greedy_is_exact_in_float32(real_session):
    session = real_session
    for text in REAL_PROMPTS:
        ids = session.encode(text)
        vanilla = session.generate(ids, max_new_tokens=24, proposer=session.build_proposer("vanilla"))
        with torch.inference_mode():
            hf = session.target.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=24,
                do_sample=False, eos_token_id=sorted(session.eos_token_ids), pad_token_id=0,
            )[0, len(ids):].tolist()
        assert vanilla.token_ids == hf[: len(vanilla.token_ids)]
        for method, options in REAL_CASES:
            result = session.generate(ids, max_new_tokens=24, proposer=session.build_proposer(method, options))
            assert result.token_ids == vanilla.token_ids, (method, text)


# --- each method's machinery --------------------------------------------------------------


def _start(proposer, prompt, target=None):
    proposer.start(StartContext(target, tuple(prompt), SamplingParams(), None))


def _path_tokens(draft: Draft, node: int) -> list[int]:
    tokens = []
    while node != -1:
        tokens.append(draft.tokens[node])
        node = draft.parents[node] if draft.parents is not None else node - 1
    return tokens[::-1]


def _outcome_predicting(draft: Draft, predict) -> Outcome:
    """An Outcome whose top-1 row after each input is predict(path tokens of that input)."""
    rows = [predict([])] + [predict(_path_tokens(draft, i)) for i in range(len(draft))]
    return Outcome(0, (), torch.tensor(rows).unsqueeze(1))


def test_jacobi_takes_the_predictions_after_the_kept_prefix_as_its_next_window():
    env = make_env(_model(0))
    jacobi = registry.create("jacobi", {"window": 4}, env)
    _start(jacobi, [1, 2, 3, 1, 2])
    draft = jacobi.propose([1, 2, 3, 1, 2], 10)
    assert draft.tokens == (3, 1, 2, 3)  # bigram guesses from the context
    top = torch.tensor([[3], [1], [7], [8], [9]])  # target agrees with 3, 1; then wants 7
    jacobi.update([1, 2, 3, 1, 2, 3, 1, 7], draft, Outcome(2, (0, 1), top))
    assert jacobi.propose([1, 2, 3, 1, 2, 3, 1, 7], 10).tokens == (8, 9, 9, 9)
    assert jacobi.propose([1, 2, 3, 1, 2, 3, 1, 7], 2).tokens == (8, 9)


def test_lookahead_window_is_a_tree_with_the_lookahead_mask():
    env = make_env(_model(0))
    la = registry.create("lookahead", {"window": 3, "ngram": 4, "guesses": 2}, env)
    context = [5, 6, 7, 8, 5]
    _start(la, context)
    # Warm up to N-1 = 3 levels with a target that always predicts 40 + depth.
    for _ in range(2):
        draft = la.propose(context, 20)
        la.update(context, draft, _outcome_predicting(draft, lambda path: 40 + len(path)))
    assert len(la.levels) == 3
    draft = la.propose(context, 20)
    for level, row in enumerate(la.cells):
        for column, node in enumerate(row):
            # Level l of column j sees level 0 up to column j, then column j's levels above it.
            expected = la.levels[0][: column + 1] + [la.levels[i][column] for i in range(1, level + 1)]
            assert _path_tokens(draft, node) == expected
    # The verification branch: the pooled 3-gram after the last token (5 -> 6 7 8).
    assert any(_path_tokens(draft, i) == [6, 7, 8] for i in range(len(draft)))
    oldest = [list(level) for level in la.levels]
    la.update(context, draft, _outcome_predicting(draft, lambda path: 90))
    assert la.levels[:2] == oldest[1:] and la.levels[2] == [90, 90, 90]
    for column in range(3):  # each column became a 4-gram: oldest token -> the three after it
        gram = (oldest[1][column], oldest[2][column], 90)
        assert gram in la.pool.grams[oldest[0][column]]


def test_ngram_pool_keeps_the_most_recent_grams_per_key():
    pool = NgramPool(per_key=2)
    for gram in [(1,), (2,), (1,), (3,)]:
        pool.add(7, gram)
    assert pool.lookup(7, 5) == [(3,), (1,)]
    assert pool.lookup(8, 5) == []


def test_pld_tree_drafts_several_earlier_matches_preferred_first():
    context = [1, 2, 7, 8, 9, 1, 2, 5, 6, 1, 2, 7, 4, 1, 2]
    first = MultiNgramIndex(1, 2, keep=2)
    first.extend_to(context)
    # "1 2" ended at 2, 7, 12 (the match at the end does not count): first ones, then the latest.
    assert first.continuations(2, 3) == [[7, 8], [5, 6], [7, 4]]
    recent = MultiNgramIndex(1, 2, keep=2, prefer="recent")
    recent.extend_to(context)
    assert recent.continuations(2, 3) == [[7, 4], [5, 6], [7, 8]]
    env = make_env(_model(0))
    pld = registry.create("pld", {"branches": 3, "num_draft": 2, "max_ngram": 2}, env)
    _start(pld, context)
    draft = pld.propose(context, 10)
    assert draft.tokens == (7, 8, 5, 6, 4) and draft.parents == (-1, 0, -1, 2, 0)  # 7 8 and 7 4 share 7
    assert registry.create("pld", {}, env).propose(context, 10).is_chain


def test_trees_need_an_attention_that_takes_a_custom_mask():
    from pardec_cli.engine.model import LanguageModel

    model = tiny_llama(0)
    model.config._attn_implementation = "flash_attention_2"
    target = LanguageModel(model)
    with pytest.raises(PardecUsageError, match="4-D mask"):
        target.forward([1, 2, 3], target.new_cache(), parents=(-1, -1))


def test_recycling_template_is_best_first_and_bounded():
    template = tree_template(nodes=20, depth=3, topk=4)
    assert len(template) == 20
    assert template[0] == (-1, 0) and (0, 0) in template[:3]  # the top-1 chain comes early
    depth = []
    for index, (parent, rank) in enumerate(template):
        assert parent < index and 0 <= rank < 4
        depth.append(1 if parent == -1 else depth[parent] + 1)
    assert max(depth) <= 3
    assert len(set(template)) == len(template)


def test_recycling_reads_its_table_and_learns_from_every_input():
    env = make_env(_model(0))
    rec = registry.create("recycling", {"topk": 2, "nodes": 6, "depth": 2}, env)
    _start(rec, [3, 9, 3, 4, 5, 3])  # seeds rank 0 with the latest bigrams: 3 -> 4, 4 -> 5, 5 -> 3
    draft = rec.propose([3, 9, 3, 4, 5, 3], 10)
    assert draft.tokens == (4, 5)  # 3 -> 4 -> 5 (rank 0 only: rank 1 is unknown; depth 2)
    top = torch.tensor([[14, 15], [12, 13], [3, 10]])  # rows: root 3, node 4, node 5
    rec.update([3, 9, 3, 4, 5, 3, 14], draft, Outcome(0, (), top, (3, 4, 5), top))
    assert rec.table[4].tolist() == [12, 13] and rec.table[5].tolist() == [3, 10]
    assert rec.table[3].tolist() == [14, 15]
    # The table survives the next generation.
    _start(rec, [9, 9])
    assert rec.table[3].tolist() == [14, 15]
    tree = rec.propose([3], 10)
    assert set(tree.tokens) >= {14, 15} and len(tree) <= 6


def test_suffix_trie_counts_substrings_and_finds_the_longest_earlier_match():
    trie = SuffixTrie(depth=3)
    trie.extend([1, 2, 3, 1, 2, 4, 1, 2])
    assert trie.count[trie.find([1, 2])] == 3
    assert trie.count[trie.find([2, 3])] == 1
    assert trie.find([1, 2, 3, 1]) is None  # longer than the depth
    node, length = trie.longest_match([9, 4, 1, 2], max_match=5)
    assert length == 2 and node == trie.find([1, 2])
    assert [trie.token[c] for c in trie.children(node)] in ([3, 4], [4, 3])
    assert trie.open_suffixes == [trie.find([2]), trie.find([1, 2])]


def test_suffix_drafts_frequent_continuations_and_remembers_earlier_outputs():
    env = make_env(_model(0))
    suffix = registry.create("suffix", {"depth": 8, "max_match": 4, "factor": 4.0, "min_prob": 0.0}, env)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 4, 7]
    _start(suffix, prompt)
    draft = suffix.propose([*prompt, 1, 2], 10)
    # "1 2" continued with 3 twice and with 4 once: 3 is the first child.
    assert draft.parents is not None
    assert [t for t, parent in zip(draft.tokens, draft.parents) if parent == -1] == [3, 4]
    assert len(draft) <= 8  # factor x match length
    # The output of one generation is remembered for the next, with a different prompt.
    suffix.update([*prompt, 1, 2, 3, 50, 51, 52], draft, Outcome(1, (0,)))
    _start(suffix, [60, 61])
    follow = suffix.propose([60, 61, 50, 51], 10)
    assert follow.tokens[0] == 52


@pytest.mark.parametrize("method", ["suffix", "pld"])
def test_indexes_catch_up_at_start_and_update_so_that_a_draft_only_reads_them(method):
    """An idle arm of adaptive drafts now and then, unverified, timed to space its next dry
    run: a draft that indexed the tokens since the last one (the whole prompt, at first)
    timed as 50 plain steps' worth and was not tried again within a reply."""
    env = make_env(_model(0))
    proposer = registry.create(method, {}, env)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    _start(proposer, prompt)
    index = proposer.trie if method == "suffix" else proposer.index
    indexed = []  # tokens newly indexed per call: propose, update, propose
    if method == "suffix":
        extend = index.extend
        index.extend = lambda tokens: (indexed.append(len(tokens)), extend(tokens))
    else:
        extend_to = index.extend_to
        index.extend_to = lambda context: (indexed.append(len(context) - len(index.tokens)), extend_to(context))
    proposer.propose(prompt, 8)  # the prompt was indexed at start
    context = [*prompt, 3, 4]
    proposer.update(context, Draft((3,)), Outcome(1, (0,)))  # the step's tokens are indexed here
    draft = proposer.propose(context, 8)
    assert indexed == [0, 2, 0]
    assert draft.tokens[0] == 1  # "3 4" was followed by 1 in the prompt


def test_combined_options_and_errors():
    env = make_env(_model(0))
    combo = registry.create("suffix+recycling", {"recycling.nodes": 5, "depth": 5}, env)
    assert combo.knobs()["recycling.nodes"] == 5
    assert combo.knobs()["recycling.depth"] == 5 and combo.knobs()["suffix.depth"] == 5  # a plain knob goes to both
    assert registry.get_spec("suffix+recycling").options
    with pytest.raises(PardecUsageError, match="cannot be combined"):
        registry.create("suffix+draft", {}, env)
    with pytest.raises(PardecUsageError, match="no option"):
        registry.create("suffix+recycling", {"num_draft": 3}, env)
    with pytest.raises(PardecUsageError, match="names no part"):
        registry.create("suffix+recycling", {"pld.num_draft": 3}, env)
    with pytest.raises(PardecUsageError, match="twice"):
        registry.create("pld+pld", {}, env)
    with pytest.raises(PardecUsageError, match="unknown method"):
        registry.create("suffix+nope", {}, env)


def test_combined_gives_each_part_its_own_view_of_the_outcome():
    env = make_env(_model(0))
    combo = registry.create("pld+recycling", {"topk": 2, "nodes": 3, "depth": 3}, env)
    pld, rec = combo.parts
    seen = {}
    for part in (pld, rec):
        def spy(context, draft, outcome, _name=part.name):
            seen[_name] = (draft, outcome)
        part.update = spy
    prompt = [3, 4, 5, 3]
    _start(combo, prompt)
    rec.table[3] = [4, 6]
    rec.table[4] = [9, 8]
    merged = combo.propose(prompt, 10)  # pld: 4 5 3 ...; recycling: 3 -> 4 -> 9, 3 -> 6
    top = torch.arange(2 * (len(merged) + 1)).reshape(-1, 2)
    path = (0, 1)  # tokens 4, 5: along pld's chain, which recycling shares for one node
    combo.update([*prompt, 4, 5, 77], merged, Outcome(2, path, top, (3, *merged.tokens), top))
    pld_draft, pld_outcome = seen["pld"]
    rec_draft, rec_outcome = seen["recycling"]
    assert pld_outcome.accepted == 2 and pld_outcome.top_tokens is None
    assert rec_outcome.accepted == 1 and rec_outcome.path == (0,)
    assert rec_outcome.top_tokens.shape == (len(rec_draft) + 1, 2)
    assert rec_outcome.top_tokens[0].tolist() == top[0].tolist()  # the root's row
    assert rec_outcome.step_inputs == (3, *merged.tokens)  # recycling learns from pld's nodes too


def test_suffix_drafts_nothing_after_a_match_shorter_than_min_match():
    env = make_env(_model(0))
    prompt = [1, 2, 3, 9, 8, 7, 5]
    one = registry.create("suffix", {"min_prob": 0.0}, env)
    _start(one, prompt)
    assert one.propose([*prompt, 9], 10).tokens[0] == 8  # "9" was followed by 8 once
    def with_min_match_2(context):
        two = registry.create("suffix", {"min_prob": 0.0, "min_match": 2, "history_tokens": 0}, env)
        _start(two, prompt)
        return two, two.propose(context, 10)

    assert len(with_min_match_2([*prompt, 9])[1]) == 0  # a one-token match: nothing
    two, draft = with_min_match_2([*prompt, 3, 9])
    assert draft.tokens[0] == 8  # "3 9": two tokens
    assert two.knobs()["min_match"] == 2
    with pytest.raises(PardecUsageError, match="min_match"):
        registry.create("suffix", {"min_match": 0}, env)


def test_suffix_with_min_gain_stops_drafting_after_matches_whose_drafts_keep_little():
    """Drafts after one-token matches that keep nothing stop (a plain step instead), retried
    every GAIN_RETRY-th time; drafts after longer matches go on; a new generation forgets."""
    from pardec_cli.methods.suffix import GAIN_RETRY

    env = make_env(_model(0))
    prompt = [1, 2, 3, 9, 8, 7, 5]
    suffix = registry.create("suffix", {"min_prob": 0.0, "min_gain": 0.5, "history_tokens": 0}, env)
    _start(suffix, prompt)
    context = [*prompt, 9]
    for _ in range(2):  # two rejected drafts after "9" (a one-token match)
        draft = suffix.propose(context, 10)
        assert draft.tokens
        suffix.update(context, draft, Outcome(0))
    drafted = [len(suffix.propose(context, 10)) > 0 for _ in range(GAIN_RETRY)]
    assert drafted == [False] * (GAIN_RETRY - 1) + [True]  # gated, then one retry
    assert suffix.propose([*context, 8], 10).tokens[0] == 7  # "9 8", a two-token match: its own estimate
    _start(suffix, prompt)
    assert suffix.propose(context, 10).tokens
    assert suffix.knobs()["min_gain"] == 0.5
    with pytest.raises(PardecUsageError, match="min_gain"):
        registry.create("suffix", {"min_gain": -1}, env)
