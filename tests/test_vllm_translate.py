"""pardec's methods and knobs -> vLLM's speculative_config: the table, without vLLM installed.

The vLLM field names below are those of `vllm.config.SpeculativeConfig` (vLLM 0.32);
when vLLM is importable, the last test checks them against the real class.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.options import resolve_options
from pardec_cli.methods.registry import METHODS, get_spec
from pardec_cli.vllm_engine.translate import (
    TABLE, Carry, NotOnVllm, VllmMethod, runs_on_vllm, translate, unsupported_error, vllm_methods,
)

# vLLM's SpeculativeConfig fields and methods this module may produce.
VLLM_FIELDS = {
    "method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
    "suffix_decoding_max_cached_requests",
}
VLLM_METHOD_NAMES = {"ngram", "suffix", "draft_model", "medusa", "eagle", "eagle3", "mtp"}


def knobs(method: str, **given: object) -> dict[str, object]:
    """The full knobs of `method` (defaults filled in), as pardec resolves them."""
    return resolve_options(method, get_spec(method).options, given)


# -- the table covers pardec ---------------------------------------------------------


def test_every_registered_method_has_a_row():
    assert set(TABLE) == set(METHODS)


@pytest.mark.parametrize("method", [m for m, r in TABLE.items() if isinstance(r, VllmMethod)])
def test_every_knob_of_a_runnable_method_is_carried_or_explained(method):
    row = TABLE[method]
    accounted = {k.knob for k in row.knobs} | ({row.accelerator_knob} if row.accelerator_knob else set())
    assert accounted == {o.name for o in METHODS[method].options}


def test_every_field_and_method_produced_is_vllms():
    for row in TABLE.values():
        if isinstance(row, VllmMethod):
            assert row.method is None or row.method in VLLM_METHOD_NAMES
            assert {k.field for k in row.knobs if isinstance(k, Carry)} <= VLLM_FIELDS
        else:
            assert runs_on_vllm(row.closest) and row.closest_vllm == TABLE[row.closest].method


def test_vllm_methods_lists_what_vllm_runs_by_its_own_names():
    assert vllm_methods() == {
        "vanilla": "none", "pld": "ngram", "suffix": "suffix", "draft": "draft_model",
        "medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3",
    }


# -- methods vLLM runs -----------------------------------------------------------------


def test_vanilla_is_plain_decoding_without_speculative_config():
    assert translate("vanilla", {}).speculative_config is None


def test_prompt_lookup_becomes_ngram_with_its_window_and_draft_length():
    t = translate("pld", knobs("pld"))
    assert t.speculative_config == {
        "method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
    }
    assert t.notes == ()


def test_prompt_lookup_sized_per_step_is_pardec_s_own():
    # auto's choice on a CPU profile: vLLM drafts the whole num_draft, and says so
    t = translate("pld", knobs("pld", fit="true", num_draft="16"))
    assert t.speculative_config["num_speculative_tokens"] == 16 and "fit=True is not carried over" in t.notes[0]
    with pytest.raises(PardecUsageError, match="fit=True"):
        translate("pld", knobs("pld", fit="true"), user_set={"fit"})


def test_prompt_lookup_knobs_given_by_the_user_are_carried():
    t = translate("pld", knobs("pld", num_draft="6", max_ngram="4", min_ngram="2"),
                  user_set={"num_draft", "max_ngram", "min_ngram"})
    assert t.speculative_config == {
        "method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
    }


def test_a_knob_vllm_cannot_honour_is_an_error_when_the_user_set_it():
    with pytest.raises(PardecUsageError, match="prefer=recent.*earliest occurrence"):
        translate("pld", knobs("pld", prefer="recent"), user_set={"prefer"})
    with pytest.raises(PardecUsageError, match="branches=2.*one chain"):
        translate("pld", knobs("pld", branches="2"), user_set={"branches"})


def test_a_knob_vllm_cannot_honour_is_a_note_when_auto_or_a_default_chose_it():
    t = translate("pld", knobs("pld", branches="4"))
    assert t.speculative_config["method"] == "ngram"
    assert t.notes == ("branches=4 is not carried over: vLLM drafts one chain from one match",)


def test_a_draft_model_is_passed_as_a_local_directory_with_a_fixed_draft_length():
    t = translate("draft", knobs("draft", model="smollm2-135m", k="5"), accelerator_path="/store/smollm2-135m")
    assert t.speculative_config == {"method": "draft_model", "model": "/store/smollm2-135m", "num_speculative_tokens": 5}
    assert t.notes == ("adaptive=True is not carried over: vLLM drafts a fixed k tokens every step",)


def test_a_draft_model_without_its_directory_is_an_error():
    with pytest.raises(PardecUsageError, match="needs its model as a local directory"):
        translate("draft", knobs("draft", model="x"))


def test_draft_length_bounds_set_by_the_user_are_refused():
    with pytest.raises(PardecUsageError, match="max_k=8.*fixed k"):
        translate("draft", knobs("draft", model="x", max_k="8"), accelerator_path="/d", user_set={"max_k"})


def test_suffix_carries_its_tree_depth_factor_probability_and_length():
    t = translate("suffix", knobs("suffix"))
    assert t.speculative_config == {
        "method": "suffix", "suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_spec_factor": 4.0,
        "suffix_decoding_min_token_prob": 0.1, "num_speculative_tokens": 32,
    }
    assert any(note.startswith("max_match=12") for note in t.notes)


def test_suffix_without_history_disables_vllms_cache_of_earlier_responses():
    t = translate("suffix", knobs("suffix", history_tokens="0"), user_set={"history_tokens"})
    assert t.speculative_config["suffix_decoding_max_cached_requests"] == 0
    assert any("by request" in note for note in t.notes)


def test_medusa_takes_its_heads_directory_and_leaves_the_length_to_the_heads():
    t = translate("medusa", knobs("medusa"), accelerator_path="/heads/medusa")
    assert t.speculative_config == {"method": "medusa", "model": "/heads/medusa"}
    t = translate("medusa", knobs("medusa", depth="3"), accelerator_path="/heads/medusa")
    assert t.speculative_config["num_speculative_tokens"] == 3


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_heads_draft_a_chain_as_deep_as_pardecs_tree(method):
    t = translate(method, knobs(method), accelerator_path="/heads/e")
    assert t.speculative_config == {"method": method, "model": "/heads/e", "num_speculative_tokens": 5}
    assert any("one chain" in note for note in t.notes)


# -- methods vLLM lacks ----------------------------------------------------------------


@pytest.mark.parametrize(("method", "closest_vllm", "closest"), [
    ("layerskip", "draft_model", "draft"),
    ("jacobi", "ngram", "pld"),
    ("lookahead", "ngram", "pld"),
    ("recycling", "suffix", "suffix"),
    ("suffix+recycling", "suffix", "suffix"),
    ("jacobi+lookahead", "ngram", "pld"),
])
def test_a_method_vllm_lacks_is_an_error_naming_the_closest_it_has(method, closest_vllm, closest):
    assert not runs_on_vllm(method)
    with pytest.raises(PardecUsageError) as caught:
        translate(method, {})
    message = caught.value.message
    assert message.startswith(f"vLLM cannot run --method {method}: ")
    assert message.endswith(f"the closest it runs is {closest_vllm} (--method {closest})")
    assert "\n" not in message
    assert unsupported_error(method).message == message


def test_an_unknown_method_gets_the_registrys_error_and_hint():
    with pytest.raises(PardecUsageError, match="unknown method 'pdl'.*did you mean 'pld'"):
        translate("pdl", {})


def test_not_on_vllm_rows_say_why():
    for name, row in TABLE.items():
        if isinstance(row, NotOnVllm):
            assert row.why.startswith("vLLM "), name


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_the_fields_are_those_of_the_installed_vllm():
    import typing

    from vllm.config import SpeculativeConfig
    from vllm.config.speculative import SpeculativeMethod

    assert VLLM_FIELDS <= {f.name for f in dataclasses.fields(SpeculativeConfig)}

    def names(tp):
        args = typing.get_args(tp)
        return {a for arg in args for a in (names(arg) if typing.get_args(arg) else {arg})}

    assert VLLM_METHOD_NAMES <= names(SpeculativeMethod)
