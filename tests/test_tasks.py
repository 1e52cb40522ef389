"""Task detection for `-P auto`: deterministic, explained, and accurate on labelled prompts.

The labelled set maps benchmark categories to profiles (also written in the README):

    Spec-Bench / MT-bench  coding                                        -> code
    Spec-Bench / MT-bench  translation, summarization, rag, extraction   -> extraction
    Spec-Bench / MT-bench  qa, math_reasoning, writing, roleplay,
                           reasoning, math, stem, humanities             -> chat
    HumanEval (code prompts), code_edit (code-editing requests)          -> code

The accuracy target is 95%; the shared sets are read by path and skipped when absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardec_cli.selection.tasks import CHAT, CODE, EXTRACTION, detect_task
from pardec_cli.tuning.prompts import builtin_prompts

SHARED_BENCH = Path(__file__).resolve().parents[2] / "shared" / "bench"
CATEGORY_PROFILE = {
    "coding": CODE, "code_edit": CODE, "humaneval": CODE,
    "translation": EXTRACTION, "summarization": EXTRACTION, "rag": EXTRACTION, "extraction": EXTRACTION,
    "qa": CHAT, "math_reasoning": CHAT, "writing": CHAT, "roleplay": CHAT, "reasoning": CHAT,
    "math": CHAT, "stem": CHAT, "humanities": CHAT,
}  # fmt: skip


def labelled(name: str) -> list[tuple[str, str]]:
    """(expected profile, prompt) for a shared benchmark file (first turn / code prompt)."""
    path = SHARED_BENCH / name
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        category = record.get("category", "humaneval")
        text = record["turns"][0] if "turns" in record else record["prompt"]
        pairs.append((CATEGORY_PROFILE[category], text))
    return pairs


def accuracy(pairs: list[tuple[str, str]]) -> float:
    return sum(detect_task(text).profile == want for want, text in pairs) / len(pairs)


@pytest.mark.parametrize("name", ["spec_bench_dev.jsonl", "code_edit_dev.jsonl", "humaneval_dev.jsonl"])
def test_accuracy_on_the_labelled_benchmark_sets_is_at_least_95_percent(name: str) -> None:
    assert accuracy(labelled(name)) >= 0.95


def test_every_profile_is_recognised_on_the_benchmark_set() -> None:
    pairs = labelled("spec_bench_dev.jsonl")
    for profile in (CODE, CHAT, EXTRACTION):
        mine = [p for p in pairs if p[0] == profile]
        assert accuracy(mine) >= 0.9, profile


@pytest.mark.parametrize("profile", [CODE, CHAT, EXTRACTION])
def test_the_built_in_tuning_prompts_are_detected_as_their_own_profile(profile: str) -> None:
    prompts = builtin_prompts(profile)
    assert len(prompts) >= 20
    assert [p.prompt_id for p in prompts if detect_task(p.text).profile != profile] == []


@pytest.mark.parametrize(
    ("prompt", "profile", "reason"),
    [
        ("```python\ndef f(x):\n    return x\n```\nWhat does this do?", CODE, "code fence"),
        ("def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", CODE, "definition"),
        ("Write a function that checks whether a number is prime.", CODE, "asks for code"),
        ("How do I read a CSV file in pandas?", CODE, "names"),
        ("Summarize: The meeting covered the budget for next year and three new hires.", EXTRACTION, "summarize"),
        ("Translate German to English: Guten Morgen, wie geht es dir?", EXTRACTION, "translate"),
        ("Extract every date from the text below.\nWe met on 3 May and again on 9 June.", EXTRACTION, "extract"),
        ("x " * 900, EXTRACTION, "long pasted context"),
        ("What is the capital of France?", CHAT, "no code"),
        ("Write a haiku about the sea.", CHAT, "no code"),
        ("Solve for x: 2x + 3 = 11.", CHAT, "no code"),
    ],
)
def test_examples_with_their_reasons(prompt: str, profile: str, reason: str) -> None:
    guess = detect_task(prompt)
    assert guess.profile == profile
    assert reason in guess.explain()


def test_code_wins_over_extraction_words_when_code_is_in_the_prompt() -> None:
    prompt = "Rewrite this function with a docstring.\n\n```python\ndef f(a):\n    return a * 2\n```"
    assert detect_task(prompt).profile == CODE


def test_words_in_the_middle_of_a_long_document_do_not_count_as_a_request() -> None:
    document = "The council met on Tuesday. " * 30 + "Members asked officials to write a Python program. " + "Rain fell. " * 60
    guess = detect_task(document + "\nWhat did the council decide?")
    assert guess.profile == EXTRACTION


def test_detection_is_deterministic() -> None:
    # (Its cost, a few regular expressions over the text, is not timed here: wall-clock
    # limits fail on a busy machine and prove nothing on a quiet one.)
    prompt = "Summarize: " + "The quick brown fox jumps over the lazy dog. " * 200
    guesses = {detect_task(prompt) for _ in range(50)}
    assert len(guesses) == 1
