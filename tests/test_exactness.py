"""Greedy output of every method equals plain decoding and Hugging Face generate(), token for token.

Tiny random float32 Llamas, several seeds. `peaked` models repeat themselves, so drafts
are often fully accepted; plain random models make most drafts fail. Both paths, EOS
inside a draft and the token limit inside a draft are covered.
"""

from __future__ import annotations

import pytest
import torch

from pardec_cli.engine.events import FINISH_EOS, FINISH_LENGTH
from pardec_cli.engine.loop import decode
from pardec_cli.engine.model import LanguageModel
from pardec_cli.methods import registry
from pardec_cli.methods.base import MethodEnv
from tests.tiny_models import peaked, tiny_llama

METHOD_CASES = [
    ("vanilla", {}),
    ("pld", {}),
    ("pld", {"max_ngram": 1, "num_draft": 3}),
    ("pld", {"prefer": "recent"}),
    ("pld", {"fit": True, "num_draft": 8}),
    ("layerskip", {"layers": 1}),
    ("layerskip", {"layers": 3, "k": 8, "adaptive": False}),
    ("layerskip", {"layer_list": "0,2"}),
    ("draft", {"model": "drafter"}),
    ("draft", {"model": "drafter", "k": 2, "max_k": 2}),
]


class FakeTokenizer:
    """Only what the draft method's compatibility check reads."""

    bos_token = eos_token = unk_token = pad_token = None

    def __init__(self, vocab: int) -> None:
        self.vocab = {f"t{i}": i for i in range(vocab)}

    def get_vocab(self) -> dict[str, int]:
        return self.vocab

    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


def make_env(target, drafter=None) -> MethodEnv:
    tokenizer = FakeTokenizer(target.config.vocab_size)

    def load(spec: str):
        assert spec == "drafter"
        return LanguageModel(drafter), FakeTokenizer(drafter.config.vocab_size)

    return MethodEnv(LanguageModel(target), tokenizer, load)


def run(method: str, options: dict, target, prompt, *, max_new_tokens: int, eos=(), drafter=None):
    env = make_env(target, drafter)
    proposer = registry.create(method, options, env)
    events = list(decode(env.target, proposer, prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos))
    tokens = [t for e in events for t in e.tokens]
    return tokens, events


def hf_greedy(model, prompt, max_new_tokens: int, eos=None) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    return out[0, len(prompt):].tolist()


def random_prompt(seed: int, length: int = 24, vocab: int = 96) -> list[int]:
    return torch.randint(3, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sharp", [True, False], ids=["peaked", "flat"])
@pytest.mark.parametrize("method,options", METHOD_CASES, ids=lambda v: str(v))
def test_greedy_equals_vanilla_and_hf_generate(method, options, seed, sharp):
    target = tiny_llama(seed)
    drafter = tiny_llama(seed + 100, layers=2)
    if sharp:
        target, drafter = peaked(target), peaked(drafter)
    prompt = random_prompt(seed)
    expected = hf_greedy(target, prompt, 40)
    tokens, events = run(method, options, target, prompt, max_new_tokens=40, drafter=drafter)
    vanilla, _ = run("vanilla", {}, target, prompt, max_new_tokens=40)
    assert tokens == expected
    assert vanilla == expected
    assert events[-1].finish_reason == FINISH_LENGTH
    assert sum(len(e.tokens) for e in events) == 40


def test_a_draft_model_identical_to_the_target_is_fully_accepted():
    target = peaked(tiny_llama(3))
    prompt = random_prompt(3)
    tokens, events = run("draft", {"model": "drafter", "k": 4, "adaptive": False}, target, prompt,
                         max_new_tokens=41, drafter=target)
    assert tokens == hf_greedy(target, prompt, 41)
    decoding_steps = events[1:]
    assert all(e.accepted == e.drafted for e in decoding_steps)
    assert len(decoding_steps) == 8  # 1 prefill token + 8 steps x (4 accepted + 1 bonus)


def test_a_drafter_that_is_always_wrong_only_slows_decoding_down():
    target = tiny_llama(4)
    prompt = random_prompt(4)
    tokens, events = run("draft", {"model": "drafter"}, target, prompt, max_new_tokens=30, drafter=tiny_llama(99))
    assert tokens == hf_greedy(target, prompt, 30)
    assert sum(e.accepted for e in events) < sum(e.drafted for e in events)


@pytest.mark.parametrize("method,options", METHOD_CASES, ids=lambda v: str(v))
def test_eos_inside_a_draft_ends_the_generation_there(method, options):
    target = peaked(tiny_llama(5))
    drafter = peaked(tiny_llama(105, layers=2))
    prompt = random_prompt(5)
    free_run = hf_greedy(target, prompt, 40)
    # Declare a token that the model emits mid-way as EOS: the output must stop right after it.
    eos_token = free_run[17]
    cut = free_run.index(eos_token) + 1
    tokens, events = run(method, options, target, prompt, max_new_tokens=40, eos=(eos_token,), drafter=drafter)
    assert tokens == free_run[:cut]
    assert events[-1].finish_reason == FINISH_EOS


@pytest.mark.parametrize("limit", [1, 2, 7, 13])
@pytest.mark.parametrize("method,options", METHOD_CASES, ids=lambda v: str(v))
def test_token_limit_is_exact(method, options, limit):
    target = peaked(tiny_llama(6))
    drafter = peaked(tiny_llama(106, layers=2))
    prompt = random_prompt(6)
    tokens, events = run(method, options, target, prompt, max_new_tokens=limit, drafter=drafter)
    assert tokens == hf_greedy(target, prompt, limit)
    assert events[-1].finish_reason == FINISH_LENGTH


def test_step_events_account_for_every_token():
    target = peaked(tiny_llama(7))
    prompt = random_prompt(7)
    _, events = run("pld", {}, target, prompt, max_new_tokens=50)
    assert events[0].index == 0 and events[0].drafted == 0 and len(events[0].tokens) == 1
    for e in events[1:]:
        assert 0 <= e.accepted <= e.drafted
        assert len(e.tokens) == e.accepted + 1 or e.finish_reason is not None
        assert e.verify_s >= 0 and e.propose_s >= 0
        assert 0 < e.forward_s <= e.verify_s  # the target's forward, inside the verification's time
    assert [e.index for e in events] == list(range(len(events)))
    assert all(a.elapsed_s <= b.elapsed_s for a, b in zip(events, events[1:]))
