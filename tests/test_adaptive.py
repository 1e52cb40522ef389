"""Adaptive decoding (`--method auto`'s default): switching configurations while decoding.

The policy is tested with injected timings, the proposer through the real loop on tiny
float32 models with a fake clock (so switches happen where the test wants them, and no
assert reads the wall clock): the output stays token-for-token that of HF generate.
"""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from pardec_cli.engine.events import GenerationStats, StepEvent
from pardec_cli.engine.loop import decode
from pardec_cli.engine.sampling import SamplingParams
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods import registry
from pardec_cli.selection.costmodel import CostCurve
from pardec_cli.methods.adaptive import SwitchPolicy, parse_arms, size_free, sized_knobs
from pardec_cli.planning import auto_method
from tests.cli_helpers import invoke
from tests.stats_helpers import chi_square_p_value
from tests.test_exactness import hf_greedy, make_env, random_prompt
from tests.tiny_models import peaked, tiny_llama

# -- the policy, with injected timings -----------------------------------------------


def drive(policy: SwitchPolicy, steps: int, cost) -> list[int]:
    """Run `steps` steps; `cost(arm, step)` -> (tokens, seconds). Returns the arm of each step."""
    ran = []
    for step in range(steps):
        arm = policy.next_arm()
        policy.observe(arm, *cost(arm, step))
        ran.append(arm)
    return ran


def test_every_arm_is_measured_briefly_the_incumbent_first_then_the_fastest_dwells():
    policy = SwitchPolicy(3, dwell=4, probe=2, reprobe=100, margin=0.05)
    ran = drive(policy, 10, lambda arm, step: (2, 1.0))
    assert ran == [0, 0, 1, 1, 2, 2, 0, 0, 0, 0]


def test_a_slow_arm_loses_to_a_faster_one_and_the_winner_keeps_running():
    policy = SwitchPolicy(2, dwell=4, probe=2, reprobe=100, margin=0.05)
    # Arm 0 emits 3 tokens per step but a step costs 1 s: 3 tok/s against arm 1's 10 tok/s.
    ran = drive(policy, 30, lambda arm, step: (3, 1.0) if arm == 0 else (1, 0.1))
    assert ran[:4] == [0, 0, 1, 1]
    assert set(ran[4:]) == {1}, "10 tok/s beats 3 tok/s: arm 1 takes over"
    assert policy.incumbent == 1


def test_an_arm_within_the_margin_does_not_take_over():
    policy = SwitchPolicy(2, dwell=4, probe=2, reprobe=100, margin=0.10)
    ran = drive(policy, 30, lambda arm, step: (2, 1.0) if arm == 0 else (2, 0.95))  # 5% faster: noise
    assert ran[4:] == [0] * 26


def test_a_dropped_arm_is_measured_again_and_wins_when_the_text_changes():
    policy = SwitchPolicy(2, dwell=4, probe=2, reprobe=10, margin=0.05)

    def cost(arm, step):  # arm 0 (speculation) is slow on the first 20 steps, fast after (the text turns to copying)
        if arm == 1:
            return 1, 0.1
        return (1, 0.3) if step < 20 else (5, 0.12)

    ran = drive(policy, 60, cost)
    assert ran[4:12] == [1] * 8, "plain decoding takes over early"
    assert 0 in ran[12:18], "speculation is measured again"
    assert policy.incumbent == 0 and ran[40:].count(0) > 3 * ran[40:].count(1), "and wins back"


def test_a_dry_run_arm_wins_back_as_soon_as_its_would_be_drafts_pay_without_being_probed():
    # Both arms can be dry-run: while arm 1 (plain, 0.1 s a step) runs, arm 0's 6-node
    # drafts (0.2 s a step) are scored against the tokens that followed: 1 token per step
    # on prose, 5 once the text turns to copying.
    policy = SwitchPolicy(2, dwell=4, probe=2, reprobe=10, margin=0.05, dry=[True, True])
    ran = []
    for step in range(60):
        arm = policy.next_arm()
        emitted = 1 if step < 20 else 5
        if arm == 0:
            policy.observe(0, emitted, 0.2, drafted=6)
            policy.observe_dry(1, 1, drafted=0)
        else:
            policy.observe(1, 1, 0.1, drafted=0)
            policy.observe_dry(0, emitted, drafted=6)
        ran.append(arm)
    assert ran[:4] == [0, 0, 1, 1]
    assert ran[4:20] == [1] * 16, "no re-probe of speculation while its dry runs say it does not pay"
    assert ran[24:30] == [0] * 6, "it takes over at the first decision after the text turns (no probe needed)"
    assert policy.incumbent == 0


def test_a_dry_run_is_charged_the_cost_of_a_step_of_its_own_draft_size():
    # Arm 0 ran only plain steps (it had nothing to draft: 0.1 s, as plain decoding).
    # Its dry drafts of 16 nodes keep 1 token of 16, and 16-node steps cost 0.3 s (seen
    # from the arm that ran them): it must not look faster than plain decoding.
    policy = SwitchPolicy(3, dwell=4, probe=2, reprobe=1000, margin=0.05, dry=[True, True, True])
    for _ in range(4):
        policy.observe(0, 1, 0.1, drafted=0)
        policy.observe(1, 2, 0.3, drafted=16)
        policy.observe(2, 1, 0.1, drafted=0)
    for _ in range(10):
        policy.observe_dry(0, 2, drafted=16)
    assert policy.costs.estimate(16) == pytest.approx(0.3) and policy.costs.estimate(12) == pytest.approx(0.3)
    assert policy.stats[0].rate < policy.stats[2].rate
    # Sizes between those seen are interpolated (1 node: a fifth of the way from 0 to 9-16);
    # larger ones than any timed are guessed: an eighth of a plain step per extra node;
    # smaller ones than any timed are not.
    assert policy.costs.estimate(1) == pytest.approx(0.1 + 0.2 / 5)
    assert policy.costs.estimate(64) == pytest.approx(0.3 + 0.1 / 8 * (64 - 16))
    only_large = SwitchPolicy(2, dwell=4, probe=2, reprobe=10, margin=0.05)
    only_large.observe(0, 3, 0.3, drafted=16)
    assert only_large.costs.estimate(0) is None and only_large.costs.estimate(4) is None


def test_a_probe_lasts_probe_plain_steps_worth_of_an_arms_steps_when_its_dry_runs_go_on_scoring_it():
    policy = SwitchPolicy(2, dwell=4, probe=3, reprobe=1000, margin=0.05, dry=[True, True])
    assert policy._probe_steps(0) == 3  # nothing timed yet
    for _ in range(4):
        policy.observe(0, 2, 0.32, drafted=16)  # arm 0 drafts 16 nodes: 3.2 plain steps
        policy.observe(1, 1, 0.1, drafted=0)
    assert (policy._probe_steps(0), policy._probe_steps(1)) == (1, 3)
    policy.reset()  # a new generation: arm 0, the incumbent, probes first, once
    assert drive(policy, 4, lambda arm, step: (2, 0.32) if arm == 0 else (1, 0.1))[:2] == [0, 1]
    not_dry = SwitchPolicy(2, dwell=4, probe=3, reprobe=1000, margin=0.05)
    not_dry.observe(0, 2, 0.32, drafted=16)
    not_dry.observe(1, 1, 0.1, drafted=0)
    assert not_dry._probe_steps(0) == 3  # nothing scores it while idle: the full probe


def test_a_dry_run_arm_is_still_timed_again_now_and_then():
    policy = SwitchPolicy(2, dwell=4, probe=2, reprobe=5, margin=0.05, dry=[True, True])
    ran = drive(policy, 80, lambda arm, step: (1, 0.3) if arm == 0 else (1, 0.1))
    assert 0 in ran[6 : 6 + 4 * 5 + 8], "its cost is re-measured, 4x less often than a re-probe"
    assert ran[6:20].count(0) == 0


def test_bad_policy_settings_are_usage_errors():
    with pytest.raises(PardecUsageError):
        SwitchPolicy(2, dwell=0, probe=1, reprobe=1, margin=0.1)


# -- the proposer through the loop, with a fake clock -----------------------------------


class ArmClock:
    """A fake clock: a step drafted by arm LABEL (the arms' i-th) takes `cost(label, i, step)`
    seconds, or, `sized`, `cost(drafted)` for a step verifying `drafted` nodes (what real
    steps cost: a plain step costs the same whichever arm had nothing to draft).

    The adaptive proposer reads the clock when it proposes and when its update ends.
    """

    def __init__(self, cost, *, sized: bool = False) -> None:
        self.cost, self.sized, self.now, self.calls, self.proposer, self.drafted = cost, sized, 0.0, 0, None, 0

    def attach(self, proposer) -> None:
        proposer.clock, self.proposer = self, proposer
        propose = proposer.propose

        def recorded(context, max_tokens):  # the draft's size, for sized costs
            draft = propose(context, max_tokens)
            self.drafted = len(draft)
            return draft

        proposer.propose = recorded

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:
            label = self.proposer.active
            step = self.cost(self.drafted) if self.sized else self.cost(label, self.proposer.labels.index(label), self.calls // 2)
            self.now += step
        return self.now


def adaptive_run(arms: str, target, prompt, *, cost, sized=False, max_new_tokens: int = 48, eos=(), drafter=None, **policy):
    env = make_env(target, drafter)
    proposer = registry.create("adaptive", {"arms": arms, "dwell": 2, "probe": 1, "reprobe": 4, **policy}, env)
    ArmClock(cost, sized=sized).attach(proposer)
    events = list(decode(env.target, proposer, prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos))
    stats = GenerationStats()
    for event in events:
        stats.add(event)
    return [t for e in events for t in e.tokens], events, stats


def flipping(label: str, index: int, step: int) -> float:
    """Every arm is the fastest for a while, in turn: forces many switches."""
    return 0.1 if index % 3 == (step // 5) % 3 else 1.0


ARM_CASES = [
    "pld[num_draft=6] | pld[num_draft=2] | vanilla",
    "suffix+recycling[recycling.nodes=8,suffix.max_nodes=8] | recycling[nodes=4] | vanilla",
    "lookahead[window=4,guesses=3] | jacobi[window=4] | vanilla",
    "layerskip[layers=1] | draft[model=drafter,k=2] | vanilla",
    # three proposers over one shared suffix index (`MethodEnv.indexes`)
    "suffix[max_nodes=8,min_prob=0] | suffix[max_nodes=2] | suffix+recycling[suffix.max_nodes=4,recycling.nodes=4]",
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sharp", [True, False], ids=["peaked", "flat"])
@pytest.mark.parametrize("arms", ARM_CASES)
def test_greedy_output_equals_hf_generate_while_switching(arms, sharp, seed):
    target, drafter = tiny_llama(seed), tiny_llama(seed + 100, layers=2)
    if sharp:
        target, drafter = peaked(target), peaked(drafter)
    prompt = random_prompt(seed)
    tokens, events, stats = adaptive_run(arms, target, prompt, cost=flipping, drafter=drafter)
    assert tokens == hf_greedy(target, prompt, 48)
    assert stats.switches >= 3, "the fake clock must make it switch"
    assert {e.arm for e in events[1:]} == {label for label, _, _ in parse_arms(arms)}


def test_suffix_arms_share_one_index_that_remembers_each_output_once():
    """Each size of suffix would index the same prompt and output again; adaptive's arms
    see one text, so they share one index. Proposers built apart (a benchmark's methods)
    do not: one must not copy a prompt's output from another."""
    target = tiny_llama(0)
    env = make_env(target)
    arms = "suffix[max_nodes=8] | suffix[max_nodes=2] | suffix+recycling[suffix.max_nodes=4]"
    proposer = registry.create("adaptive", {"arms": arms}, env)
    indexes = {id(arm.index) for arm in proposer.arms[:2]} | {id(proposer.arms[2].parts[0].index)}
    assert len(indexes) == 1
    assert registry.create("suffix", {}, env).index is not proposer.arms[0].index
    first = list(decode(env.target, proposer, random_prompt(0), max_new_tokens=12))
    list(decode(env.target, proposer, random_prompt(1), max_new_tokens=4))
    history = proposer.arms[0].history
    assert history.tokens == sum(len(e.tokens) for e in first)  # the first reply, once


@pytest.mark.parametrize("limit", [1, 5, 13])
def test_eos_and_the_token_limit_inside_a_switching_generation(limit):
    target = peaked(tiny_llama(5))
    prompt = random_prompt(5)
    free_run = hf_greedy(target, prompt, 40)
    tokens, _, _ = adaptive_run(ARM_CASES[0], target, prompt, cost=flipping, max_new_tokens=limit)
    assert tokens == free_run[:limit]
    eos = free_run[17]
    tokens, events, _ = adaptive_run(ARM_CASES[1], target, prompt, cost=flipping, max_new_tokens=40, eos=(eos,))
    assert tokens == free_run[: free_run.index(eos) + 1] and events[-1].finish_reason == "eos"


def test_a_slow_arm_is_dropped_for_plain_decoding():
    target = peaked(tiny_llama(3))
    prompt = random_prompt(3)
    # Speculation emits more tokens per step here, but a step verifying a draft costs 20x a plain one.
    tokens, events, stats = adaptive_run(
        "pld[num_draft=8] | vanilla", target, prompt, cost=lambda drafted: 2.0 if drafted else 0.1, sized=True,
        max_new_tokens=150, dwell=4, probe=2, reprobe=1000,
    )
    assert tokens == hf_greedy(target, prompt, 150)
    arms = [e.arm for e in events[1:]]
    assert arms[0] == "pld[num_draft=8]" and set(arms[-40:]) == {"vanilla"}
    assert stats.arms["vanilla"].steps > 0.8 * len(arms)


def test_a_fast_arm_is_kept():
    target = peaked(tiny_llama(3))
    prompt = random_prompt(3) * 2  # repeated: prompt lookup drafts from its first step
    _, events, stats = adaptive_run("pld[num_draft=8] | vanilla", target, prompt, cost=lambda drafted: 0.1, sized=True,
                                    max_new_tokens=60, dwell=4, probe=2, reprobe=1000)
    assert "vanilla" not in stats.arms, "judged by its dry runs (one token per plain step) and never run"
    assert stats.switches == 0


def test_an_idle_arm_that_can_be_dry_run_is_scored_while_plain_decoding_runs():
    target = peaked(tiny_llama(3))
    prompt = random_prompt(3)
    env = make_env(target)
    proposer = registry.create("adaptive", {"arms": "pld[num_draft=8] | vanilla", "dwell": 4, "probe": 2, "reprobe": 1000}, env)
    ArmClock(lambda drafted: 2.0 if drafted else 0.1, sized=True).attach(proposer)
    events = list(decode(env.target, proposer, prompt, max_new_tokens=60))
    assert [t for e in events for t in e.tokens] == hf_greedy(target, prompt, 60)
    pld, plain = proposer.policy.stats
    assert pld.dry_runs > 10 and plain.steps > pld.steps, "scored on dry runs every other step while idle"
    # What pld would have kept on this looping text: several tokens per step, where plain
    # decoding's (discounted) sum counts one per step.
    assert pld.tokens > 2 * plain.tokens


def test_an_arm_whose_drafting_is_slow_is_dry_run_less_often():
    proposer = registry.create("adaptive", {"arms": "pld | vanilla", "dwell": 4, "probe": 2, "reprobe": 40}, make_env(tiny_llama(3)))
    assert proposer._dry_period(0, proposer.policy.costs.estimate(0)) == 2, "nothing timed yet: every other step"
    proposer.policy.costs.add(0, 0.010)  # a plain step: 10 ms
    proposer._drafting[0] = 0.0001  # drafting in 0.1 ms: within 2% of a step every other step
    assert proposer._dry_period(0, proposer.policy.costs.estimate(0)) == 2
    proposer._drafting[0] = 0.002  # 2 ms (suffix over code): once in 10 steps keeps it at 2%
    assert proposer._dry_period(0, proposer.policy.costs.estimate(0)) == 10


def test_arms_must_be_two_and_not_adaptive_themselves():
    env = make_env(tiny_llama(0))
    with pytest.raises(PardecUsageError, match="at least two arms"):
        registry.create("adaptive", {"arms": "pld"}, env)
    with pytest.raises(PardecUsageError, match="cannot be adaptive"):
        registry.create("adaptive", {"arms": "adaptive[arms=pld] | vanilla"}, env)
    with pytest.raises(PardecUsageError, match="has no option"):
        registry.create("adaptive", {"arms": "pld[nodes=3] | vanilla"}, env)


def test_sampled_generations_follow_the_target_distribution_while_switching():
    from tests.test_sampling import PROMPT, SAMPLING, VOCAB, exact_joint

    assert SAMPLING.temperature == 1.0
    target = peaked(tiny_llama(11, vocab=VOCAB, layers=2), scale=3.0)
    env = make_env(target)
    proposer = registry.create(
        "adaptive", {"arms": "recycling[topk=3,nodes=6,depth=2] | pld[min_ngram=1,max_ngram=1] | vanilla",
                     "dwell": 1, "probe": 1, "reprobe": 1}, env)
    proposer.clock = clock = ArmClock(flipping)
    clock.proposer = proposer
    counts: Counter = Counter()
    arms = Counter()
    for i in range(800):
        events = list(decode(env.target, proposer, PROMPT, max_new_tokens=3, sampling=SamplingParams(temperature=1.0, seed=i)))
        counts[tuple(t for e in events for t in e.tokens)] += 1
        arms.update(e.arm for e in events[1:])
    assert len(arms) >= 2, "it switched arms (a 3-token reply has at most 3 steps: the third arm rarely comes)"
    assert chi_square_p_value(counts, exact_joint(target, 3)) > 0.001


# -- statistics -------------------------------------------------------------------------


def test_stats_count_switches_and_time_per_arm():
    stats = GenerationStats()
    for index, (arm, tokens, seconds) in enumerate([("", 1, 0.1), ("a", 3, 0.2), ("a", 1, 0.2), ("b", 1, 0.1), ("a", 2, 0.2)]):
        stats.add(StepEvent(index=index, tokens=(7,) * tokens, drafted=2, accepted=tokens - 1, propose_s=0.0,
                            verify_s=seconds, elapsed_s=0.0, arm=arm))
    assert stats.switches == 2
    assert (stats.arms["a"].steps, stats.arms["a"].tokens, round(stats.arms["a"].seconds, 6)) == (3, 6, 0.6)
    assert stats.to_dict()["arms"]["b"] == {"steps": 1, "tokens": 1, "seconds": 0.1}
    plain = GenerationStats()
    plain.add(StepEvent(index=0, tokens=(1,), drafted=0, accepted=0, propose_s=0, verify_s=0, elapsed_s=0))
    assert "arms" not in plain.to_dict() and "switches" not in plain.to_dict()


# -- auto's arms ------------------------------------------------------------------------


def test_arms_are_the_choice_at_two_sizes_then_plain_decoding_unless_unsure_steps_are_plain():
    """On a flat curve (a GPU) a choice below its method's default size also runs larger,
    up to that default; at or above it, at half its size."""
    def arms(method, knobs):
        return auto_method(choice(method, knobs), {})[1]["arms"]

    assert arms("pld", {"num_draft": 8}) == "pld[num_draft=8] | pld[num_draft=10] | vanilla"  # the default is 10
    assert arms("pld", {"num_draft": 16}) == "pld[num_draft=16] | pld[num_draft=8] | vanilla"
    assert arms("recycling", {}) == "recycling | recycling[nodes=16] | vanilla"  # half the default 32
    assert arms("suffix+recycling", {"recycling.depth": 4, "recycling.nodes": 8, "suffix.max_nodes": 8}) == (
        "suffix+recycling[recycling.depth=4,recycling.nodes=8,suffix.max_nodes=8] | "
        "suffix+recycling[recycling.depth=4,recycling.nodes=32,suffix.max_nodes=32] | vanilla"
    )
    assert arms("pld", {"num_draft": 1}) == "pld[num_draft=1] | pld[num_draft=4] | vanilla"
    # suffix drafts only branches it rates likely: its unsure steps are plain decoding's
    # already, so it runs at two sizes alone (a plain arm missed rag's short copy bursts).
    assert arms("suffix", {"max_nodes": 16}) == "suffix[max_nodes=16] | suffix[max_nodes=32]"
    assert arms("suffix", {"max_nodes": 64}) == "suffix[max_nodes=64] | suffix[max_nodes=32]"
    assert arms("suffix", {"max_nodes": 1}) == "suffix[max_nodes=1] | suffix[max_nodes=4]"
    assert sized_knobs("vanilla", {}, 0.5) == ({}, None)  # no size knob: nothing to scale
    assert parse_arms("layerskip[layer_list=0-5,8,k=2] | vanilla") == [
        ("layerskip[layer_list=0-5,8,k=2]", "layerskip", {"layer_list": "0-5,8", "k": "2"}), ("vanilla", "vanilla", {})]


FLAT = CostCurve.from_mapping({1: 10.0, 64: 12.0}, "a GPU: 64 tokens verify for 1.2x one")


def choice(method, knobs, ranking=(), curve=FLAT, score=1.5):
    estimate = SimpleNamespace(method=method, knobs=knobs, score=score if method != "vanilla" else 1.0)
    return SimpleNamespace(method=method, knobs=knobs, ranking=tuple(ranking), curve=curve, estimate=estimate)


def test_auto_runs_its_choice_adaptively_unless_adapt_is_off():
    method, knobs, lines = auto_method(choice("pld", {"num_draft": 8}), {})
    assert (method, knobs) == ("adaptive", {"arms": "pld[num_draft=8] | pld[num_draft=10] | vanilla"})
    assert lines and lines[0].startswith("adapt     ")
    assert auto_method(choice("pld", {"num_draft": 8}), {"adapt": "off"}) == ("pld", {"num_draft": 8}, [])
    with pytest.raises(PardecUsageError, match="adapt"):
        auto_method(choice("pld", {}), {"adapt": "sometimes"})


def test_a_choice_that_sizes_its_own_drafts_runs_alone_unless_adapt_is_given():
    """pld's fit drafts nothing where drafting does not pay by the reply's own step times:
    a plain arm and other sizes would only add their probes."""
    fit = {"num_draft": 16, "fit": True}
    method, knobs, lines = auto_method(choice("pld", fit), {})
    assert (method, knobs) == ("pld", fit) and "sizes each draft itself" in lines[0]
    assert auto_method(choice("pld", {"num_draft": 16, "fit": "false"}), {})[0] == "adaptive"
    assert auto_method(choice("pld", fit), {"adapt": "on"})[1]["arms"].startswith("pld[fit=true,num_draft=16] | ")
    assert auto_method(choice("pld", fit), {"adapt": "off"}) == ("pld", fit, [])


def test_which_settings_size_their_own_drafts():
    from pardec_cli.methods.registry import sizes_itself

    assert sizes_itself("pld", {"fit": True}) and sizes_itself("pld", {"fit": "true", "num_draft": 4})
    assert not sizes_itself("pld", {}) and not sizes_itself("suffix", {"max_nodes": 8})
    assert not sizes_itself("pld+recycling", {"pld.fit": True})  # a combination never does
    assert not sizes_itself("eagle3", {})  # a name only another engine knows: no error


def test_a_seeded_sampled_reply_keeps_auto_s_choice_unless_adapt_is_given():
    """Switches follow measured time, and a sampled reply's tokens follow what was drafted:
    only a fixed method lets a seed repeat a reply."""
    method, knobs, lines = auto_method(choice("pld", {"num_draft": 8}), {}, repeatable=True)
    assert (method, knobs) == ("pld", {"num_draft": 8})
    assert lines == ["adapt     off: a seeded sampled reply keeps pld[num_draft=8] so that the seed repeats it "
                     "(switching depends on measured time; -O adapt=on switches anyway)"]
    assert auto_method(choice("pld", {"num_draft": 8}), {"adapt": "on"}, repeatable=True)[0] == "adaptive"
    with pytest.raises(PardecUsageError, match="adapt"):
        auto_method(choice("pld", {}), {"adapt": "sometimes"}, repeatable=True)


def test_when_auto_expects_nothing_to_pay_plain_decoding_runs_first_and_the_best_other_may_prove_it_wrong():
    ranking = [SimpleNamespace(method="vanilla", knobs={}), SimpleNamespace(method="pld", knobs={"num_draft": 4})]
    assert auto_method(choice("vanilla", {}, ranking), {})[:2] == ("adaptive", {"arms": "vanilla | pld[num_draft=4]"})
    assert auto_method(choice("vanilla", {}, ranking[:1]), {})[:2] == ("vanilla", {})


def test_a_choice_expected_to_gain_less_than_the_switching_margin_starts_behind_plain_decoding():
    """Tune measured suffix[max_nodes=2] at 1.02x on its chat prompts; run first, with no
    plain arm (its unsure steps are plain), it drafted junk 2-node steps on math, qa and
    reasoning where auto untuned ran plain decoding first and was faster. An arm must win
    by the margin (5%) to take over; a choice expected to win by less must prove it too."""
    method, knobs, lines = auto_method(choice("suffix", {"max_nodes": 2}, score=1.02), {})
    assert knobs["arms"] == "vanilla | suffix[max_nodes=2]"
    assert lines[1] == "adapt     plain decoding first: suffix[max_nodes=2] is expected at 1.02x, within the 5% an arm must win by"
    assert auto_method(choice("suffix", {"max_nodes": 2}, score=1.06), {})[1]["arms"] == \
        "suffix[max_nodes=2] | suffix[max_nodes=8]"


def test_a_close_candidate_of_another_configuration_joins_the_arms_where_it_can_be_dry_run():
    """Estimates within 10% of each other are within the cost curve's noise (2 rows at
    1.03x one in one run, 1.17x in the next): the arms measure both on the text at hand.
    A size sibling of the arms adds nothing new; an arm that cannot be dry-run would cost
    probes of real steps."""
    def est(method, knobs, score):
        return SimpleNamespace(method=method, knobs=knobs, score=score)

    pld4 = {"num_draft": 4, "min_ngram": 2}
    ranking = [est("pld", pld4, 1.41), est("pld", {"num_draft": 8, "min_ngram": 2}, 1.36),
               est("lookahead", {}, 1.35), est("pld", {"num_draft": 2}, 1.31), est("suffix", {}, 1.2)]  # fmt: skip
    assert auto_method(choice("pld", pld4, ranking, score=1.41), {})[1]["arms"] == (
        "pld[min_ngram=2,num_draft=4] | pld[min_ngram=2,num_draft=10] | pld[num_draft=2] | vanilla")
    below = [*ranking[:3], est("pld", {"num_draft": 2}, 1.26), ranking[4]]  # under 90% of 1.41
    assert auto_method(choice("pld", pld4, below, score=1.41), {})[1]["arms"] == (
        "pld[min_ngram=2,num_draft=4] | pld[min_ngram=2,num_draft=10] | vanilla")
    # Expected within the margin of plain decoding: plain first, the choice's challenger,
    # and the runner-up, held to 90% of plain decoding's speed.
    slim = [est("vanilla", {}, 1.0), est("pld", {"num_draft": 2}, 0.96), est("suffix", {}, 0.8)]
    assert auto_method(choice("pld", pld4, [est("pld", pld4, 1.02), *slim], score=1.02), {})[1]["arms"] == (
        "vanilla | pld[min_ngram=2,num_draft=4] | pld[num_draft=2]")
    assert size_free("pld", {"num_draft": 8, "min_ngram": 2}) == size_free("pld", {"num_draft": 2, "min_ngram": 2})
    assert size_free("pld", {"num_draft": 2}) != size_free("pld", {"num_draft": 2, "min_ngram": 2})
    assert size_free("suffix+recycling", {"suffix.max_nodes": 8, "recycling.nodes": 8}) == size_free("suffix+recycling", {})


def test_the_challenger_of_plain_decoding_drafts_only_as_much_as_junk_can_cheaply_cost():
    # Measured on a 2-core AMX Xeon, int4 weights, compiled step: rows of 4 per tile.
    tiles = CostCurve.from_mapping({1: 10.3, 2: 13.4, 4: 14.4, 8: 21.7, 16: 34.4, 32: 55.8}, "measured")
    eager = CostCurve.from_mapping({1: 17.8, 2: 20.1, 4: 22.4, 8: 29.4, 16: 42.2}, "measured")
    ranking = [SimpleNamespace(method="vanilla", knobs={}), SimpleNamespace(method="suffix", knobs={"max_nodes": 16})]
    arms = {name: auto_method(choice("vanilla", {}, ranking, curve), {})[1]["arms"]
            for name, curve in (("flat", FLAT), ("tiles", tiles), ("eager", eager))}
    assert arms == {
        "flat": "vanilla | suffix[max_nodes=16]",  # a junk 16-node draft costs 1.0x a step
        "tiles": "vanilla | suffix[max_nodes=4]",  # none costs <= 1.5x: the smallest share
        "eager": "vanilla | suffix[max_nodes=4]",  # 5 rows: 1.36x
    }
    combined = [ranking[0], SimpleNamespace(method="suffix+recycling",
                                            knobs={"suffix.max_nodes": 16, "recycling.nodes": 16})]
    assert auto_method(choice("vanilla", {}, combined, eager), {})[1]["arms"] == \
        "vanilla | suffix+recycling[recycling.nodes=4,suffix.max_nodes=4]"
    # A choice's other arms: half its size, or a quarter where half costs over 1.5 steps;
    # larger where the choice itself costs that little or its method can be dry-run (up to
    # the method's default, 32; suffix's idle arms only draft).
    suffix16 = {"max_nodes": 16}
    assert auto_method(choice("suffix", suffix16, curve=FLAT), {})[1]["arms"] == \
        "suffix[max_nodes=16] | suffix[max_nodes=32]"
    assert auto_method(choice("suffix", suffix16, curve=tiles), {})[1]["arms"] == \
        "suffix[max_nodes=16] | suffix[max_nodes=4] | suffix[max_nodes=32]"
    # An arm that cannot be dry-run is measured by running it: one smaller arm only.
    assert auto_method(choice("jacobi", {"window": 8}, curve=tiles), {})[1]["arms"] == \
        "jacobi[window=8] | jacobi[window=2] | vanilla"


def test_a_choice_tune_sized_down_for_this_cpu_can_still_grow_when_the_text_copies_well():
    """Tune measured pld[num_draft=2] fastest on its code prompts (3 rows verify for 1.3x
    one on this AMX int4 step); on a code edit 8-token drafts pay: the second arm is 4x."""
    tiles = CostCurve.from_mapping({1: 10.3, 2: 13.4, 4: 14.4, 8: 21.7, 16: 34.4, 32: 55.8}, "measured")
    assert auto_method(choice("pld", {"num_draft": 2}, curve=tiles), {})[1]["arms"] == \
        "pld[num_draft=2] | pld[num_draft=8] | vanilla"
    # 5 rows cost 1.57 steps there: suffix[4] is not cheap; it runs smaller, and larger too,
    # since its idle arms are dry-run (tune picked suffix[max_nodes=4] on its extraction
    # prompts; on a copying reply the 16-node arm took over with 12-13 tokens a step).
    assert auto_method(choice("suffix", {"max_nodes": 4}, curve=tiles), {})[1]["arms"] == \
        "suffix[max_nodes=4] | suffix[max_nodes=2] | suffix[max_nodes=16]"


# -- through the CLI ----------------------------------------------------------------------

CODE_PROMPT = "Write a Python function that returns the largest of three numbers."


def gen(model, *args):
    return invoke(["gen", "-m", str(model), "--dtype", "float32", "--raw", *args])


def test_gen_auto_is_adaptive_and_shows_its_arms_and_switches(tiny_cli_model):
    # adapt=on: auto's choice for code on a CPU sizes its own drafts and would run alone
    result = gen(tiny_cli_model, "-n", "24", "--jsonl", "--stats", "--explain", "-O", "adapt=on", CODE_PROMPT)
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    steps, final = lines[:-1], lines[-1]
    assert final["method"] == "adaptive" and " | vanilla" in final["knobs"]["arms"]
    assert all(s["arm"] for s in steps if s["step"] > 0)
    assert set(final["stats"]["arms"]) == {s["arm"] for s in steps if s["step"] > 0}
    assert any(line.startswith("adapt     while decoding, switch among ") for line in result.stderr.splitlines())
    assert any(line.startswith("switches    ") for line in result.stderr.splitlines())
    plain = gen(tiny_cli_model, "-n", "24", "--json", "--method", "vanilla", CODE_PROMPT)
    assert json.loads(plain.stdout)["text"] == final["text"]


def test_adapt_off_keeps_auto_s_choice_and_a_bad_value_is_a_usage_error(tiny_cli_model):
    result = gen(tiny_cli_model, "-n", "8", "--json", "-O", "adapt=off", CODE_PROMPT)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["method"] not in ("adaptive", "auto") and "arms" not in record["stats"]
    bad = gen(tiny_cli_model, "-n", "8", "-O", "adapt=sometimes", CODE_PROMPT)
    assert bad.exit_code == 2 and "adapt" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_runs_auto_with_and_without_adapt_side_by_side():
    from pardec_cli.bench import parse_methods

    assert [c.label for c in parse_methods("auto,auto[adapt=off]")] == ["auto", "auto[adapt=off]"]
    with pytest.raises(PardecUsageError, match="auto takes no knobs"):
        parse_methods("auto[k=4]")
