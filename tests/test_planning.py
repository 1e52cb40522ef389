"""One plan per reply: `gen`, `bench`, `tune`, `serve` and the Python `Session` decide a
reply's method, knobs, sampling and token budget through `pardec_cli.planning`, so the
same prompt is decoded the same way wherever it is sent.

In-process, on a tiny random Llama with a word-level tokenizer (no model download).
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from pardec_cli.engine.sampling_params import SamplingParams
from pardec_cli.planning import ALL_SETTINGS, AUTO, Planner, Settings, plan_reply
from pardec_cli.selection.profiles import Candidate, Profile, load_profiles
from tests.tiny_models import WORDS, peaked, tiny_llama, word_level_tokenizer

PACKAGE = Path(__file__).resolve().parents[1] / "pardec_cli"
CODE_PROMPT = "Fix the bug:\n```python\ndef add(a, b):\n    return a - b\n```"


@pytest.fixture(scope="module")
def session():
    from pardec_cli.session import Session

    return Session(peaked(tiny_llama(vocab=len(WORDS) + 3, layers=2)), word_level_tokenizer(), model_name="tiny")


def greedy(max_tokens: int = 16) -> Settings:
    return Settings(max_tokens=max_tokens, sampling=SamplingParams(), stop=(), system=None, raw=False)


def test_auto_is_defined_once_and_everyone_imports_it() -> None:
    defining = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "AUTO" for t in node.targets):
                defining.append(path.relative_to(PACKAGE).as_posix())
    assert defining == ["selection/profiles.py"]


def test_a_profile_gives_defaults_only_for_settings_the_caller_left_unset() -> None:
    profiles = load_profiles()
    code_budget = profiles["code"].sampling["max_tokens"]
    assert code_budget != 16
    left_unset = plan_reply(CODE_PROMPT, method="pld", options={}, profile="code", settings=greedy(16),
                            user_set=(), profiles=profiles)
    all_set = plan_reply(CODE_PROMPT, method="pld", options={}, profile="code", settings=greedy(16),
                         user_set=ALL_SETTINGS, profiles=profiles)
    assert (left_unset.settings.max_tokens, all_set.settings.max_tokens) == (code_budget, 16)


def test_a_named_method_is_planned_as_given_and_labelled_with_its_knobs() -> None:
    plan = plan_reply("hello", method="pld", options={"num_draft": 4}, profile="chat", settings=greedy(),
                      user_set=ALL_SETTINGS, profiles=load_profiles())
    assert (plan.method, plan.knobs, plan.profile, plan.label, plan.choice) == (
        "pld", {"num_draft": 4}, "chat", "pld[num_draft=4]", None)


def candidates_only(name: str, *candidates: Candidate) -> dict[str, Profile]:
    """The built-in profiles with `name`'s candidates, on any hardware, replaced."""
    profiles = load_profiles()
    return {**profiles, name: replace(profiles[name], candidates={"default": candidates})}


FIT = Candidate("pld", {"num_draft": 16, "fit": True}, tokens_per_step=2.0, drafted=2.0)
SUFFIX = Candidate("suffix", {"max_nodes": 8}, tokens_per_step=1.5, drafted=2.0)


def plan_auto(session, profiles: dict[str, Profile], options: dict[str, str]):
    from pardec_cli.selection.selector import AutoSelector

    return plan_reply(CODE_PROMPT, method=AUTO, options=options, profile=AUTO, settings=greedy(), user_set=ALL_SETTINGS,
                      profiles=profiles, selector=AutoSelector.for_session(session, profiles=profiles))


def test_auto_runs_a_choice_that_sizes_its_own_drafts_alone(session) -> None:
    profiles = candidates_only("code", FIT, SUFFIX)
    plan = plan_auto(session, profiles, {})
    assert plan.profile == "code"  # detected from the prompt
    assert plan.choice is not None
    assert (plan.method, plan.knobs) == (plan.choice.method, dict(plan.choice.knobs)) == ("pld", {"num_draft": 16, "fit": True})
    # Adaptively where asked: the choice is the first arm.
    adaptive = plan_auto(session, profiles, {"adapt": "on"})
    assert adaptive.method == "adaptive" and adaptive.knobs["arms"].startswith(adaptive.choice.label)


def test_auto_switches_among_sizes_of_a_fixed_length_choice_unless_told_not_to(session) -> None:
    suffix_first = replace(SUFFIX, tokens_per_step=3.0)
    profiles = candidates_only("code", suffix_first, FIT)
    plan = plan_auto(session, profiles, {})
    assert plan.choice is not None and plan.choice.label == "suffix[max_nodes=8]"
    assert plan.method == "adaptive" and plan.knobs["arms"].startswith("suffix[max_nodes=8]")
    fixed = plan_auto(session, profiles, {"adapt": "off"})
    assert fixed.label == fixed.choice.label
    assert (fixed.method, fixed.knobs) == (fixed.choice.method, dict(fixed.choice.knobs)) == ("suffix", {"max_nodes": 8})


def test_methods_size_drafts_by_the_cost_curve_auto_ranks_with(session) -> None:
    pld = session.build_proposer("pld", {"fit": True, "num_draft": 4})
    curve = session.auto_selector().curve
    assert [pld._step_ms(rows, 2000) for rows in (1, 3, 5)] == [curve.ms_at(rows, 2000) for rows in (1, 3, 5)]


def test_the_session_keeps_one_selector_per_set_of_drafters(session) -> None:
    plain = session.auto_selector()
    assert session.auto_selector() is plain
    with_drafter = session.auto_selector(("./no-such-drafter",))
    assert with_drafter is not plain
    assert [a.ref for a in with_drafter.accelerators if a.kind == "drafter"] == ["./no-such-drafter"]
    assert not any(a.kind == "drafter" for a in plain.accelerators)
    assert session.auto_selector(refresh=True) is not plain  # read again (after `pardec tune`)


def test_benchs_auto_rows_are_planned_as_gen_plans_them(session) -> None:
    from pardec_cli.bench import Bench, BenchPrompt, MethodChoice

    prompts = [BenchPrompt("c", "code_edit", CODE_PROMPT), BenchPrompt("q", "qa", "w5 w6 w7 w8, w5 w6?")]
    with Bench(session, [MethodChoice("auto", AUTO)], max_new_tokens=6) as bench:
        runs = bench.run(prompts)
    gen = Planner(session, method=AUTO, options={}, profile=AUTO, settings=greedy(6), user_set=ALL_SETTINGS,
                  apply=False)
    chosen = {r.prompt_id: r.chosen for r in runs if r.label == AUTO}
    assert chosen == {p.prompt_id: gen.plan(p.text).choice.label for p in prompts}  # auto's choice, run adaptively


def test_bench_offers_the_drafters_it_was_given_to_auto(session) -> None:
    from pardec_cli.bench import Bench, MethodChoice

    with Bench(session, [MethodChoice("auto", AUTO)], max_new_tokens=6, drafters=["./no-such-drafter"]) as bench:
        assert bench.planners[AUTO].selector is session.auto_selector(("./no-such-drafter",))


def test_a_planner_that_does_not_apply_leaves_the_sessions_method_alone(session) -> None:
    session.set_method("vanilla")
    planner = Planner(session, method=AUTO, options={}, profile=AUTO, settings=greedy(), user_set=ALL_SETTINGS,
                      apply=False)
    planner.plan(CODE_PROMPT)
    assert session.method_name == "vanilla"
    applying = Planner(session, method=AUTO, options={}, profile=AUTO, settings=greedy(), user_set=ALL_SETTINGS)
    plan = applying.plan(CODE_PROMPT)
    assert (session.method_name, session.method_options) == (plan.method, plan.knobs)
