"""Streaming text: multi-byte characters and stop strings that span token boundaries."""

from __future__ import annotations

import pytest

from pardec_cli.engine.text import IncrementalDetokenizer, StopMatcher


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


TEXTS = [
    "Plain ASCII text, with  two spaces and\nnew lines.",
    "Ünïcödé: naïve café, 東京タワー and emoji 🚀🧪 mixed in.",
    "def f(x):\n    return x ** 2  # squares",
]


@pytest.mark.real_model
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 3])
def test_incremental_decoding_equals_full_decoding(tokenizer, text, step):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    chunks = [detok.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    chunks.append(detok.flush())
    assert "".join(chunks) == tokenizer.decode(ids)
    # No chunk shows a half character on the terminal.
    assert not any("\ufffd" in chunk for chunk in chunks)


@pytest.mark.real_model
def test_split_multibyte_character_is_held_back_until_complete(tokenizer):
    ids = tokenizer("🚀", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1, "this test needs an emoji split over several byte tokens"
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push(ids[:1]) == ""
    assert "".join(detok.push([i]) for i in ids[1:]) == "🚀"


def feed(stop, pieces):
    matcher = StopMatcher(stop)
    shown = [matcher.push(p) for p in pieces]
    shown.append(matcher.flush())
    return "".join(shown), matcher.stopped, shown


def test_stop_string_inside_one_chunk():
    text, stopped, _ = feed(["END"], ["abc END def"])
    assert (text, stopped) == ("abc ", True)


def test_stop_string_spanning_chunks_is_not_printed():
    text, stopped, shown = feed(["\n\n"], ["Hello.\n", "\nWorld"])
    assert (text, stopped) == ("Hello.", True)
    assert shown[0] == "Hello.", "the possible start of a stop string is held back"


def test_held_back_text_is_released_when_it_is_not_a_stop_string():
    text, stopped, shown = feed(["STOP"], ["go ST", "ART now"])
    assert (text, stopped) == ("go START now", False)
    assert shown[0] == "go "


def test_earliest_of_several_stop_strings_wins():
    text, stopped, _ = feed(["xyz", "b"], ["a", "bcxyz"])
    assert (text, stopped) == ("a", True)


def test_no_stop_strings_passes_text_through():
    assert feed([], ["a", "b"])[:2] == ("ab", False)
    assert feed([""], ["a"])[:2] == ("a", False)


def test_nothing_is_shown_after_a_stop():
    matcher = StopMatcher(["."])
    assert matcher.push("One. Two") == "One"
    assert matcher.push("three") == ""
    assert matcher.flush() == ""
