"""On the real embedded model (SmolLM2-135M-Instruct, float32): every method's greedy
output equals plain decoding and Hugging Face generate(), token for token."""

from __future__ import annotations

import copy

import pytest
import torch

from pardec_cli.engine.model import LanguageModel
from pardec_cli.methods.base import MethodEnv
from pardec_cli.methods.registry import create

pytestmark = pytest.mark.real_model

PROMPTS = [
    # Copies much of its prompt: long accepted drafts for pld.
    "Rename the variable `total` to `acc` in this code and show the whole function:\n\n"
    "def add_all(values):\n    total = 0\n    for v in values:\n        total += v\n    return total\n",
    # Free text: most drafts get rejected.
    "Give three tips for sleeping better.",
]
NEW_TOKENS = 40

METHODS = [
    ("pld", {}),
    ("pld", {"max_ngram": 1, "num_draft": 4}),
    ("layerskip", {"layers": 10}),
    ("layerskip", {"layer_list": "0-9,20-29", "adaptive": False, "k": 3}),
    ("draft", {"model": "bf16-copy"}),
]


@pytest.fixture(scope="module")
def session(embedded_model_dir):
    from pardec_cli.session import Session

    return Session.load(str(embedded_model_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def env(session):
    """The draft method's drafter is a bfloat16 copy of the target: close, not identical."""
    drafter = LanguageModel(copy.deepcopy(session.target.model).to(torch.bfloat16))

    def load(spec):
        assert spec == "bf16-copy"
        return drafter, session.tokenizer

    return MethodEnv(session.target, session.tokenizer, load)


@pytest.fixture(scope="module")
def references(session):
    """prompt -> (vanilla ids, HF generate ids)."""
    out = {}
    for prompt in PROMPTS:
        ids = session.encode(prompt)
        ours = session.generate(ids, max_new_tokens=NEW_TOKENS).token_ids
        with torch.no_grad():
            hf = session.target.model.generate(
                torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                eos_token_id=sorted(session.eos_token_ids), pad_token_id=session.tokenizer.eos_token_id,
            )[0, len(ids):].tolist()
        out[prompt] = (list(ours), hf)
    return out


def test_vanilla_equals_hugging_face_generate(references):
    for ours, hf in references.values():
        assert ours == hf


@pytest.mark.parametrize("method, options", METHODS, ids=lambda v: str(v))
def test_method_equals_vanilla(session, env, references, method, options):
    proposer = create(method, options, env)
    accepted = 0
    for prompt, (vanilla_ids, _) in references.items():
        stream = session.stream(session.encode(prompt), max_new_tokens=NEW_TOKENS, proposer=proposer)
        for _ in stream:
            pass
        assert list(stream.token_ids) == vanilla_ids, prompt
        accepted += stream.stats.accepted_tokens
    assert accepted > 0, "the method never got a draft accepted: the test would not exercise rollback"


def test_system_prompt_is_rendered_by_the_chat_template(session):
    ids = session.encode("Hello", system="Reply like a pirate.")
    text = session.tokenizer.decode(ids)
    assert "Reply like a pirate." in text
    assert text.index("Reply like a pirate.") < text.index("Hello")
