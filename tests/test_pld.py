"""Prompt lookup's n-gram index: which earlier text it proposes to copy."""

from __future__ import annotations

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.pld import FIT_PRIOR, LengthFit, NgramIndex, PromptLookup

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


def test_match_names_the_length_of_the_suffix_it_matched():
    assert index("first").match(3) == (2, [7, 1, 5])  # (5, 6) matched, (9, 5, 6) did not
    assert NgramIndex(1, 3, "first").match(3) == (0, [])


@pytest.mark.parametrize("knobs", [dict(prefer="oldest"), dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(num_draft=0),
                                   dict(fit=True, branches=2)])
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


# --- fit: the length of each copy chosen per step ---------------------------------------


def per_row(cost: float):
    """A step's time: one, plus `cost` per row verified beyond the first."""
    return lambda rows, context: 1.0 + cost * (rows - 1)


def test_fit_drafts_what_the_prior_says_pays_before_the_reply_shows_anything():
    copy = list(range(16))
    free = LengthFit(16, per_row(0.0))
    assert free.choose(1, 0, copy, 16) == 16, "rows that cost nothing: copy everything"
    dear = LengthFit(16, per_row(1.0))
    assert [dear.choose(n, 0, copy, 16) for n in (1, 2, 3)] == [0, 0, 0], "a row costs a step: no copy pays"
    fit = LengthFit(16, per_row(0.1))
    lengths = [fit.choose(n, 0, copy, 16) for n in (1, 2, 3, 5)]
    assert 0 < lengths[0] < lengths[1] < lengths[2] == lengths[3], "longer matches, longer copies; 3 or more alike"
    assert fit.choose(3, 0, copy, 2) == 2 and fit.choose(3, 0, copy[:1], 16) == 1, "never past the limit or the copy"


def scored(fit: LengthFit, matched: int, right: int, times: int, length: int = 8) -> None:
    """`times` copies after `matched`-token matches whose first `right` tokens were right."""
    for _ in range(times):
        copy = list(range(100, 100 + length))
        text = [7] * 50
        fit.choose(matched, len(text), copy, length)
        fit.observe(text + copy[:right] + [0] * (length - right + 1))


def test_fit_follows_how_this_replys_copies_held():
    holding, failing = LengthFit(8, per_row(0.1)), LengthFit(8, per_row(0.1))
    before = LengthFit(8, per_row(0.1)).choose(1, 0, list(range(8)), 8)
    scored(holding, 1, right=8, times=40)
    scored(failing, 1, right=0, times=40)
    assert holding.choose(1, 0, list(range(8)), 8) == 8 > before
    assert failing.choose(1, 0, list(range(8)), 8) == 0 < before
    assert failing.choose(3, 0, list(range(8)), 8) > 0, "what one match length showed does not move another's"


def test_fit_scores_a_copy_once_its_fate_is_written_and_up_to_its_first_wrong_token():
    fit = LengthFit(4, per_row(0.1))
    fit.choose(2, 3, [5, 6, 7, 8], 4)
    fit.observe([0, 0, 0, 5, 6])  # right so far, the rest not written yet: not scored
    assert fit._tries[2] == [0, 0, 0, 0, 0] and len(fit._pending) == 1
    fit.observe([0, 0, 0, 5, 6, 9, 8])  # wrong at depth 3: depths 1-3 tried, 1-2 right; depth 4 never reached
    assert fit._tries[2] == [0, 1, 1, 1, 0] and fit._hits[2] == [0, 1, 1, 0, 0] and not fit._pending
    fit.choose(5, 1, [3, 4], 4)
    fit.observe([0, 3, 4])  # a whole copy right: scored at once, filed under 3 or more
    assert fit._tries[max(FIT_PRIOR)][:3] == [0, 1, 1] and fit._hits[max(FIT_PRIOR)][:3] == [0, 1, 1]


def test_fit_drafts_from_the_env_cost_curve_and_starts_afresh_each_generation():
    from pardec_cli.engine.proposal import Outcome, StartContext
    from pardec_cli.methods.base import MethodEnv

    asked = []

    def step_ms(rows: int, context: int) -> float:
        asked.append((rows, context))
        return 1.0 + 0.05 * (rows - 1)

    pld = PromptLookup(MethodEnv(target=None, tokenizer=None, step_ms=step_ms), max_ngram=3, min_ngram=1, num_draft=6, fit=True)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    pld.start(StartContext(target=None, prompt_ids=tuple(text), sampling=None, generator=None))
    assert asked == [(rows, 12) for rows in range(1, 8)], "the cost of every length it may draft, after the prompt"
    draft = pld.propose(text, 16)
    assert draft.tokens == (4, 5, 6, 7, 8, 9)  # a 3-token match on cheap rows: the whole copy
    pld.update([*text, 4, 5, 0], draft, Outcome(accepted=2))
    assert pld._length is not None and pld._length._tries[3][1:4] == [1, 1, 1]
    pld.propose([*text, 4, 5, 0], 16)
    assert len(asked) == 7, "priced again only as the text grows by CONTEXT_STEP tokens"
    pld.start(StartContext(target=None, prompt_ids=tuple(text), sampling=None, generator=None))
    assert pld._length._tries[3] == [0] * 7 and pld.knobs()["fit"] is True


def test_fit_drafts_less_after_a_long_text_where_each_row_costs_more():
    def curve(rows: int, context: int) -> float:  # each row 0.05 of a step, plus 0.2 per 1000 tokens of text
        return 1.0 + 0.05 * (rows - 1) + rows * 0.2 * context / 1000

    copy = list(range(16))
    short, long = LengthFit(16, curve), LengthFit(16, curve)
    assert short.choose(2, 100, copy, 16) > long.choose(2, 3000, copy, 16) > 0
    assert short.choose(1, 100, copy, 16) > 0 == long.choose(1, 3000, copy, 16)


def test_fit_prices_rows_by_this_replys_timed_steps_once_it_has_enough_of_them():
    """After a long text every row attends to all of it: the curve, measured after a short
    one, prices rows too low there; the reply's own steps say what they cost."""
    copy = list(range(8))
    fit = LengthFit(8, per_row(0.0))  # the curve: rows free
    assert fit.choose(2, 0, copy, 8) == 8
    for step in range(6):  # too few to go by
        fit.timed(1 + step % 3, (1.0 + 0.5 * (step % 3)) / 1000)
    assert fit.choose(2, 0, copy, 8) == 8
    for step in range(20):  # each row costs half a step here: short copies only
        fit.timed(1 + step % 3, (1.0 + 0.5 * (step % 3)) / 1000)
    assert 0 < fit.choose(2, 0, copy, 8) <= 2
    assert fit.choose(1, 0, copy, 8) == 0


def test_fit_keeps_the_curve_while_every_timed_step_had_one_size():
    fit = LengthFit(8, per_row(0.0))
    for _ in range(30):
        fit.timed(1, 0.004)  # plain steps only: nothing says what a row costs
    assert fit.choose(2, 0, list(range(8)), 8) == 8
