"""Prompt lookup's n-gram index: which earlier text it proposes to copy."""

from __future__ import annotations

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.pld import NgramIndex, PromptLookup

#          0  1  2  3  4  5  6  7  8  9
TOKENS = [5, 6, 7, 1, 5, 6, 8, 2, 9, 5, 6]


def index(prefer: str, min_n: int = 1, max_n: int = 3) -> NgramIndex:
    idx = NgramIndex(min_n, max_n, prefer)
    idx.extend_to(TOKENS)
    return idx


def test_first_occurrence_is_copied_by_default():
    # Suffix (9, 5, 6) never occurred; (5, 6) ended at 2 and at 6: first -> tokens[2:].
    assert index("first").continuation(3) == [7, 1, 5]


def test_recent_occurrence_on_request():
    assert index("recent").continuation(3) == [8, 2, 9]


def test_longest_ngram_wins_over_position():
    idx = NgramIndex(1, 3, "first")
    idx.extend_to([6, 4, 6, 9, 3, 6, 9, 3, 7, 6, 9])  # (7, 6, 9) is new; (6, 9) ended at 4 and 7
    assert idx.continuation(2) == [3, 6]


def test_no_match_gives_no_draft():
    idx = NgramIndex(2, 3, "first")
    idx.extend_to([1, 2, 3, 4])
    assert idx.continuation(5) == []


def test_the_suffix_never_matches_itself():
    idx = NgramIndex(1, 2, "recent")
    idx.extend_to([1, 2, 3])
    assert idx.continuation(4) == []  # (3,) and (2, 3) only occur at the very end


def test_index_catches_up_incrementally():
    idx = NgramIndex(1, 3, "recent")
    idx.extend_to(TOKENS[:6])
    idx.extend_to(TOKENS)
    assert idx.continuation(3) == index("recent").continuation(3)


def test_continuation_is_capped_at_the_text_end():
    idx = NgramIndex(1, 1, "first")
    idx.extend_to([4, 8, 4])
    assert idx.continuation(10) == [8, 4]


@pytest.mark.parametrize("knobs", [dict(prefer="oldest"), dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(num_draft=0)])
def test_bad_knobs_are_usage_errors(knobs):
    values = dict(max_ngram=3, min_ngram=1, num_draft=10, prefer="first") | knobs
    with pytest.raises(PardecUsageError):
        PromptLookup(None, **values)


def test_one_index_serves_proposers_of_any_shortest_ngram_and_rule_as_their_own_would():
    """Adaptive's arms see one text, so their n-gram indexes are one (`MethodEnv.indexes`):
    each arm's drafts must be what its own index would give, step after step."""
    import random

    from pardec_cli.engine.proposal import Outcome, StartContext
    from pardec_cli.methods.base import MethodEnv

    rng = random.Random(0)
    text = [rng.randrange(6) for _ in range(300)]  # a small vocabulary: many repeats
    settings = [dict(min_ngram=m, prefer=p, branches=b, num_draft=d)
                for m in (1, 2) for p in ("first", "recent") for b in (1, 3) for d in (2, 8)]
    shared_env = MethodEnv(target=None, tokenizer=None, indexes={})
    shared = [PromptLookup(shared_env, max_ngram=3, **s) for s in settings]
    alone = [PromptLookup(MethodEnv(target=None, tokenizer=None), max_ngram=3, **s) for s in settings]
    assert len({id(p.index) for p in shared}) == 2, "one index per max_ngram and number of branches"
    assert len({id(p.index) for p in alone}) == len(settings)
    for prompt_length in (40, 25):  # two generations: the second starts afresh
        ctx = StartContext(target=None, prompt_ids=tuple(text[:prompt_length]), sampling=None, generator=None)
        for p in shared + alone:
            p.start(ctx)
        for end in range(prompt_length, 200, 3):
            context = text[:end]
            assert [p.propose(context, 16) for p in shared] == [p.propose(context, 16) for p in alone]
            for p in shared + alone:
                p.update(context, p.propose(context, 16), Outcome(accepted=0))
