"""The chat's defaults: sampling as the model recommends (else the chat profile's generic
values), greedy where reproducibility matters, and a repetition guard that only decides
where a reply ends, so speculative sampling stays exact."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from pardec_cli.engine.events import FINISH_REPETITION
from pardec_cli.engine.loop import decode
from pardec_cli.engine.sampling import SamplingParams
from pardec_cli.engine.text import RepetitionGuard
from pardec_cli.methods import registry
from pardec_cli.planning import AUTO, Settings, plan_reply, recommended_sampling
from pardec_cli.selection.profiles import get_profile, load_profiles
from pardec_cli.session import TextStream
from tests.stats_helpers import chi_square_p_value
from tests.test_exactness import make_env
from tests.test_sampling import PROMPT, VOCAB, exact_joint  # the brute-force joint distribution
from tests.tiny_models import peaked, tiny_llama

# -- what the model recommends ----------------------------------------------------------------


def test_a_generation_config_that_samples_recommends_its_values():
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, top_k=20)
    assert recommended_sampling(config) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}


@pytest.mark.parametrize("config", [
    {},  # SmolLM2's file: only token ids
    {"do_sample": False, "temperature": 0.7},  # greedy by its own word
    {"top_p": 0.9},  # a cut-off without a temperature or do_sample is no recommendation to sample
])
def test_a_generation_config_that_does_not_sample_recommends_nothing(config):
    from transformers import GenerationConfig

    assert recommended_sampling(GenerationConfig(**config)) == {}
    assert recommended_sampling(None) == {}


# -- the plan: profile, the model's recommendation, the user's values -----------------------


def plan(text: str, profile: str = AUTO, *, user: dict | None = None, recommended: dict | None = None):
    user = user or {}
    sampling = SamplingParams(**{k: v for k, v in user.items() if k != "max_tokens"})
    settings = Settings(max_tokens=user.get("max_tokens", 256), sampling=sampling, stop=(), system=None, raw=False)
    return plan_reply(text, method="pld", options={}, profile=profile, settings=settings, user_set=set(user),
                      profiles=load_profiles(), recommended=recommended).settings


def test_the_chat_profile_samples_with_generic_values_when_the_model_recommends_none():
    sampling = plan("What should I cook tonight?", "chat").sampling
    chat = get_profile("chat").sampling
    assert not sampling.greedy
    assert (sampling.temperature, sampling.top_p) == (chat["temperature"], chat["top_p"]) == (0.8, 0.95)


def test_the_chat_profile_takes_the_models_recommended_sampling():
    sampling = plan("What should I cook tonight?", "chat", recommended={"temperature": 0.6, "top_p": 0.9, "top_k": 20}).sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.6, 0.9, 20)


@pytest.mark.parametrize("profile", ["code", "extraction"])
def test_greedy_profiles_stay_greedy_whatever_the_model_recommends(profile):
    assert plan("Write a function that reverses a list", profile, recommended={"temperature": 0.6}).sampling.greedy


def test_what_the_user_sets_wins_over_profile_and_model():
    settings = plan("Tell me a story", "chat", user={"temperature": 0.0, "max_tokens": 9},
                    recommended={"temperature": 0.6, "top_k": 20})
    assert settings.sampling.greedy and settings.max_tokens == 9


def test_a_detected_chat_prompt_samples_and_a_detected_code_prompt_is_greedy():
    assert not plan("What should I cook tonight?").sampling.greedy
    assert plan("Write a Python function that reverses a list.\n\n```python\ndef rev(xs):\n```").sampling.greedy


# -- the repetition guard -------------------------------------------------------------------


def test_the_guard_trips_on_a_block_repeated_back_to_back():
    guard = RepetitionGuard(max_period=8, min_repeats=4, min_tokens=16)
    text = [9, 8] + [1, 2, 3, 4, 5] * 3
    assert guard.push(text) is None  # three copies: not yet
    keep = guard.push([1, 2, 3, 4, 5, 6])
    assert keep == 5  # the fourth copy completes (20 tokens, period 5): the reply ends there, the 6 is dropped


def test_the_guard_leaves_text_that_does_not_loop_alone():
    guard = RepetitionGuard()
    generator = torch.Generator().manual_seed(0)
    assert guard.push(torch.randint(0, 1000, (2000,), generator=generator).tolist()) is None
    assert guard.push([7] * 20 + [1, 2] * 10 + [3]) is None  # short runs: a ruler, a table row


def _stream_tokens(target, method: str, sampling: SamplingParams, guard):
    env = make_env(target)
    proposer = registry.create(method, {}, env)
    tokenizer = SimpleNamespace(decode=lambda ids, **_: " ".join(map(str, ids)))
    stream = TextStream(decode(env.target, proposer, [1, 3, 2, 3], max_new_tokens=300, sampling=sampling),
                        tokenizer, (), 4, repetition_guard=guard)
    for _ in stream:
        pass
    return stream


@pytest.mark.parametrize("method", ["pld", "recycling"])
def test_a_guarded_reply_is_the_unguarded_one_cut_where_the_loop_is_found(method):
    # A sharply peaked tiny model falls into runs of one token; under sampling with a seed
    # the same random numbers are drawn with and without the guard (thresholds scaled
    # down to the tiny model), so the guarded tokens must be a prefix of the free ones.
    # Seed 0: a reply that loops within 300 tokens with both methods (most seeds do).
    target = peaked(tiny_llama(5, vocab=8, layers=2), scale=10.0)
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=0)
    free = _stream_tokens(target, method, sampling, guard=False)
    guarded = _stream_tokens(target, method, sampling, guard=RepetitionGuard(max_period=8, min_repeats=4, min_tokens=16))
    assert guarded.finish_reason == FINISH_REPETITION
    assert len(guarded.token_ids) < len(free.token_ids)
    assert free.token_ids[: len(guarded.token_ids)] == guarded.token_ids
    assert guarded.stats.generated_tokens == len(guarded.token_ids)


# -- speculative sampling under the chat defaults keeps the processed target distribution -----

CHAT_SAMPLING = {"temperature": 0.8, "top_p": 0.95}


@pytest.fixture(scope="module")
def models():
    target = peaked(tiny_llama(11, vocab=VOCAB, layers=2), scale=3.0)
    drafter = peaked(tiny_llama(12, vocab=VOCAB, layers=1), scale=3.0)
    return target, drafter, exact_joint(target, 3, SamplingParams(**CHAT_SAMPLING))


@pytest.mark.parametrize("method,options", [
    ("draft", {"model": "drafter", "k": 2, "adaptive": False}),
    ("recycling", {"topk": 3, "nodes": 6, "depth": 2}),  # a tree: the multi-candidate rule
])
def test_speculative_sampling_with_the_chat_defaults_follows_the_processed_target(models, method, options):
    target, drafter, exact = models
    env = make_env(target, drafter)
    proposer = registry.create(method, options, env)
    counts: Counter = Counter()
    for seed in range(800):
        params = SamplingParams(**CHAT_SAMPLING, seed=seed)
        counts[tuple(t for e in decode(env.target, proposer, PROMPT, max_new_tokens=3, sampling=params)
                     for t in e.tokens)] += 1
    assert chi_square_p_value(counts, exact) > 0.001
