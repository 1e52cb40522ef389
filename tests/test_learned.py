"""Learning from use: what generations record for `--method auto`, and what auto makes of it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from pardec_cli.selection import learned
from pardec_cli.selection.learned import Row, Usage, UsageKey, learned_path, learning_enabled, read_usage, record_generation
from tests.cli_helpers import invoke
from tests.test_chat_cli import tiny_session  # noqa: F401 - a fixture: a Session over a tiny model

STEP = "float32/full/eager"
KEY = UsageKey("sha256:m", "cpu:AMD EPYC", STEP, "chat", "pld[num_draft=8]")


def row(tokens_per_step: float = 2.0, step_s: float = 0.02, steps: int = 20, base_steps: int = 0,
        base_s: float = 0.0) -> Row:
    """A generation of `steps` steps emitting `tokens_per_step` each, `step_s` seconds a step
    (of which 80% the target's forward, 5% drafting, the rest the loop's own work)."""
    return Row(round(tokens_per_step * steps), steps, 4 * steps, step_s * steps, 0.05 * step_s * steps,
               0.8 * step_s * steps, base_steps, base_s)


# -- the file ---------------------------------------------------------------------------


def test_a_generation_is_one_row_under_its_model_machine_step_kind_profile_and_method() -> None:
    assert record_generation(KEY, row())
    data = json.loads(learned_path().read_text())
    assert list(data["entries"]) == [KEY.text()]
    usage = read_usage("sha256:m", "cpu:AMD EPYC", STEP)
    assert usage.rows == {"chat": {"pld[num_draft=8]": [row()]}}
    # Another dtype, weights or runner learns separately: a compiled step costs half an eager one.
    for other_step in ("bfloat16/full/eager", "float32/int4/eager", "float32/full/compiled"):
        assert read_usage("sha256:m", "cpu:AMD EPYC", other_step).rows == {}
    assert read_usage("sha256:other", "cpu:AMD EPYC", STEP).rows == {}


def test_generations_too_short_to_say_anything_are_not_recorded() -> None:
    assert not record_generation(KEY, row(steps=learned.MIN_STEPS - 1))
    assert not learned_path().exists()


def test_the_file_stays_small_recent_rows_and_recent_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(learned, "WINDOW", 3)
    monkeypatch.setattr(learned, "MAX_KEYS", 2)
    for step_s in (0.01, 0.02, 0.03, 0.04):
        record_generation(KEY, row(step_s=step_s), clock=1.0)
    kept = read_usage("sha256:m", "cpu:AMD EPYC", STEP).rows["chat"]["pld[num_draft=8]"]
    assert [r.decode_s for r in kept] == [row(step_s=s).decode_s for s in (0.02, 0.03, 0.04)]
    other = UsageKey(*KEY.text().split("|")[:4], "suffix")
    third = UsageKey(*KEY.text().split("|")[:4], "vanilla")
    record_generation(other, row(), clock=2.0)
    record_generation(third, row(), clock=3.0)
    assert set(read_usage("sha256:m", "cpu:AMD EPYC", STEP).rows["chat"]) == {"suffix", "vanilla"}


def test_a_broken_file_teaches_nothing_and_is_replaced_by_the_next_write() -> None:
    learned_path().parent.mkdir(parents=True, exist_ok=True)
    learned_path().write_text("{ not json")
    assert read_usage("sha256:m", "cpu:AMD EPYC", STEP).rows == {}
    record_generation(KEY, row())
    assert read_usage("sha256:m", "cpu:AMD EPYC", STEP).rows["chat"]


def test_learning_is_on_unless_the_config_or_the_environment_turns_it_off(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("PARDEC_LEARN", raising=False)
    config = tmp_path / "config.toml"
    assert learning_enabled(config)  # no file
    config.write_text('dtype = "float32"\n')
    assert learning_enabled(config)
    config.write_text("learn = false\n")
    assert not learning_enabled(config)
    config.write_text("learn = [broken\n")
    assert learning_enabled(config)  # the command reading its options reports a broken file
    monkeypatch.setenv("PARDEC_LEARN", "0")
    config.write_text("learn = true\n")
    assert not learning_enabled(config)


# -- from rows to speed-ups -------------------------------------------------------------


def test_speed_ups_use_plain_decodings_measured_step_time_when_there_is_one() -> None:
    usage = Usage({"chat": {"pld": [row(2.0, 0.03)] * 3}, "code": {"vanilla": [row(1.0, 0.02)]}})
    [m] = usage.measurements("chat")
    assert (m.label, m.runs, m.source) == ("pld", 3, "use")
    assert m.speedup == pytest.approx(2.0 * 0.02 / 0.03)
    assert m.tokens_per_step == pytest.approx(2.0)
    assert usage.measurements("code") == []  # plain decoding is the reference, not a candidate


def test_without_plain_decoding_the_one_token_steps_inside_drafting_runs_give_the_base() -> None:
    # 8 of 20 steps drafted nothing, their forwards took 10 ms; the loop's own work is
    # 15% of a 30 ms step; so plain decoding would take 10 + 4.5 ms a step here.
    usage = Usage({"chat": {"pld": [row(2.0, 0.03, base_steps=8, base_s=0.08)]}})
    [m] = usage.measurements("chat")
    assert m.speedup == pytest.approx(2.0 * (0.010 + 0.15 * 0.03) / 0.03)


def test_without_any_measured_base_use_falls_back_to_tunes_curve_or_says_nothing() -> None:
    usage = Usage({"chat": {"recycling": [row(2.0, 0.03)]}})
    assert usage.measurements("chat") == []
    [m] = usage.measurements("chat", curve_base_ms=12.0)
    assert m.speedup == pytest.approx(2.0 * (0.012 + 0.15 * 0.03) / 0.03)


def test_spread_is_min_and_max_of_a_few_runs_and_percentiles_of_many() -> None:
    usage = Usage({"chat": {"pld": [row(t, 0.02) for t in (1.5, 2.0, 2.5)], },
                   "code": {"vanilla": [row(1.0, 0.02)]}})
    [m] = usage.measurements("chat")
    assert (m.low, m.high) == pytest.approx((1.5, 2.5))
    assert learned.spread([float(v) for v in range(11)]) == (1.0, 9.0)


# -- auto reads it --------------------------------------------------------------------------


def selector_with(usage: Usage):
    from pardec_cli.selection.profiles import load_profiles
    from pardec_cli.selection.selector import AutoSelector, ModelInfo
    from tests.test_select import SMOLLM2, THIS_CPU

    return AutoSelector(THIS_CPU, ModelInfo("smollm2-135m", SMOLLM2, "sha256:m"), profiles=load_profiles(), usage=usage)


def test_a_method_that_ran_slower_than_plain_decoding_here_is_not_chosen_again() -> None:
    usage = Usage({"chat": {"suffix": [row(1.2, 0.03)] * 4}, "code": {"vanilla": [row(1.0, 0.02)] * 2}})
    choice = selector_with(usage).choose("Tell me about the moon.", "chat")
    assert choice.method == "vanilla"
    assert "measured  suffix 0.80x (0.80-0.80) over 4 runs (use)" in choice.explain()


def test_a_user_who_never_tunes_gets_the_configuration_use_measured_fastest() -> None:
    usage = Usage({"code": {"pld[num_draft=4]": [row(1.9, 0.024)] * 6, "vanilla": [row(1.0, 0.02)] * 2}})
    choice = selector_with(usage).choose("Write a Python function that reverses a list.")
    assert choice.label == "pld[num_draft=4]" and choice.estimate.basis == "measured"
    assert choice.estimate.speedup == pytest.approx(1.9 * 0.02 / 0.024)


# -- the session records its generations ----------------------------------------------------


def generate(session, method: str = "pld", **kwargs) -> None:
    session.set_method(method)
    for _ in session.stream(session.encode("w5 w6 w7 w5 w6 w7 w5 w6"), max_new_tokens=64, **kwargs):
        pass


def test_every_finished_generation_is_recorded_once_by_the_session(tiny_session, monkeypatch) -> None:
    monkeypatch.delenv("PARDEC_LEARN", raising=False)
    writes = []
    real = learned.record_rows
    monkeypatch.setattr(learned, "record_rows", lambda *a, **k: writes.append(a) or real(*a, **k))
    generate(tiny_session, profile="code")
    generate(tiny_session, "vanilla", profile="code")
    assert len(writes) == 2  # one write per generation, none per step
    entries = json.loads(learned_path().read_text())["entries"]
    labels = sorted(text.split("|")[3:] for text in entries)
    assert labels == [["code", "pld"], ["code", "vanilla"]]
    [rows] = [e["rows"] for text, e in entries.items() if text.endswith("|pld")]
    tokens, steps = rows[0][0], rows[0][1]
    assert steps >= learned.MIN_STEPS and tokens >= steps


def test_nothing_is_recorded_when_learning_is_off_or_the_caller_keeps_its_own_records(tiny_session, monkeypatch,
                                                                                       isolated_home) -> None:
    from pardec_cli.session import Session

    monkeypatch.delenv("PARDEC_LEARN", raising=False)
    generate(tiny_session, record=False)
    assert not learned_path().exists()
    config = isolated_home.parent / "pardec-config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("learn = false\n")
    fresh = Session(tiny_session.target.model, tiny_session.tokenizer, model_name="tiny")
    generate(fresh)
    assert not learned_path().exists()


def arm_totals(steps: int, tokens: int, seconds: float, drafted: int = 0, propose_s: float = 0.0, base_steps: int = 0,
               base_verify_s: float = 0.0) -> Any:
    from pardec_cli.engine.events import ArmTotals

    return ArmTotals(steps, tokens, seconds, drafted, propose_s, base_steps, base_verify_s)


def test_a_switching_generation_teaches_each_arm_under_its_own_label_not_plain_decoding() -> None:
    from pardec_cli.engine.events import GenerationStats

    # 60 steps in 0.7 s after the first token; the arms' own drafting and verifying took 0.64 s.
    stats = GenerationStats(generated_tokens=101, steps=60, ttft_s=0.1, total_s=0.8, arms={
        "pld[num_draft=4]": arm_totals(40, 80, 0.48, drafted=160, propose_s=0.02, base_steps=2, base_verify_s=0.02),
        "pld[num_draft=2,min_ngram=1]": arm_totals(5, 6, 0.05, drafted=10, propose_s=0.001),
        "vanilla": arm_totals(15, 15, 0.11),
    })
    stream = SimpleNamespace(stats=stats, decode_propose_s=0.03, decode_verify_s=0.6, base_steps=17, base_verify_s=0.13)
    rows = dict(learned.generation_rows("adaptive[arms=pld[num_draft=4] | pld[num_draft=2] | vanilla]", stream))
    assert set(rows) == {"pld[num_draft=4]", "pld[num_draft=2]"}  # canonical labels; plain decoding left out
    four = rows["pld[num_draft=4]"]
    assert (four.tokens, four.steps, four.drafted, four.base_steps) == (80, 40, 160, 2)
    # its own 0.48 s plus its 40 steps' share of the 0.06 s the loop spent outside every arm
    assert four.decode_s == pytest.approx(0.48 + 40 * 0.06 / 60)
    assert (four.propose_s, four.verify_s, four.base_s) == pytest.approx((0.02, 0.46, 0.02))
    # a configuration that does not switch: its one row, as before
    plain = SimpleNamespace(stats=GenerationStats(generated_tokens=41, steps=20, ttft_s=0.1, total_s=0.5),
                            decode_propose_s=0.01, decode_verify_s=0.3, base_steps=3, base_verify_s=0.05)
    [(label, only)] = learned.generation_rows("pld", plain)
    assert label == "pld" and (only.tokens, only.steps, only.decode_s) == (40, 20, pytest.approx(0.4))


def test_one_write_holds_all_of_a_generations_rows_and_leaves_out_the_short_ones() -> None:
    other = UsageKey("sha256:m", "cpu:AMD EPYC", STEP, "chat", "pld[num_draft=2]")
    written = learned.record_rows([(KEY, row(steps=20)), (other, row(steps=learned.MIN_STEPS - 1))])
    assert [key for key, _ in written] == [KEY]
    usage = read_usage("sha256:m", "cpu:AMD EPYC", STEP)
    assert list(usage.rows["chat"]) == ["pld[num_draft=8]"]
    assert learned.record_rows([(other, row(steps=3))]) == [] and not read_usage("sha256:m", "cpu:AMD EPYC", STEP).rows["chat"].get("pld[num_draft=2]")


def test_auto_learns_from_its_own_arms_within_a_session_and_ranks_with_them_at_once(tiny_session, monkeypatch) -> None:
    monkeypatch.delenv("PARDEC_LEARN", raising=False)
    selector = tiny_session.auto_selector()
    assert selector.usage is not None and not selector.measured("code")
    # an arm must run 16 steps to be recorded: a margin no arm can win by keeps the first
    # one running whatever the step times, and one drafted token a step makes 32 of them
    tiny_session.set_method("adaptive", {"arms": "pld[num_draft=1] | vanilla", "margin": 100, "reprobe": 1000})
    for _ in tiny_session.stream(tiny_session.encode("w5 w6 w7 w5 w6 w7 w5 w6"), max_new_tokens=64, profile="code"):
        pass
    # recorded for later sessions under the arm's own label, and already in this session's ranking
    assert list(read_usage(*tiny_session._usage_recorder.where()).rows["code"]) == ["pld[num_draft=1]"]
    assert [m.label for m in selector.measured("code")] == ["pld[num_draft=1]"]
    # a generation that does not teach (a benchmark's reference method) is kept for later sessions only
    tiny_session.set_method("pld", {"num_draft": 2})
    for _ in tiny_session.stream(tiny_session.encode("w5 w6 w7 w5 w6 w7 w5 w6"), max_new_tokens=64, profile="code",
                                 teach=False):
        pass
    assert "pld[num_draft=2]" in read_usage(*tiny_session._usage_recorder.where()).rows["code"]
    assert [m.label for m in selector.measured("code")] == ["pld[num_draft=1]"]


# -- end to end: gen records, auto explains, doctor shows -----------------------------------


def test_generations_teach_auto_which_then_says_it_measured_here(tiny_cli_model, monkeypatch) -> None:
    from tests.test_auto_cli import CHAT_PROMPT, gen

    monkeypatch.delenv("PARDEC_LEARN", raising=False)
    # Seeded: an unseeded reply of the tiny random model can sample an end token within
    # `MIN_STEPS` steps and teach nothing (a full run once recorded one pld row of two).
    for seed, method in enumerate(("vanilla", "pld", "vanilla", "pld")):
        result = gen(tiny_cli_model, "--method", method, "-n", "48", "--seed", str(seed), "--json", CHAT_PROMPT)
        assert result.exit_code == 0, result.stderr
    entries = json.loads(learned_path().read_text())["entries"]
    assert sorted(text.split("|")[2:] for text in entries) == [[STEP, "chat", "pld"], [STEP, "chat", "vanilla"]]
    explained = gen(tiny_cli_model, "-n", "4", "--explain", CHAT_PROMPT)
    assert explained.exit_code == 0, explained.stderr
    measured = [line for line in explained.stderr.splitlines() if line.startswith("measured  ")]
    assert measured and "pld " in measured[0] and "over 2 runs (use)" in measured[0]
    doctor = invoke(["doctor", "-m", str(tiny_cli_model), "--dtype", "float32"])
    assert "generations recorded in" in doctor.stdout and f"({STEP} steps)" in doctor.stdout
    assert "measured pld: " in doctor.stdout


def test_a_session_names_its_step_kind_by_dtype_weights_and_runner(tiny_session) -> None:
    from pardec_cli.session import Session

    assert tiny_session.step_kind == "float32/full/eager"
    int4 = Session(tiny_session.target.model, tiny_session.tokenizer, model_name="tiny", dtype="bfloat16", weights="int4")
    assert int4.step_kind == "bfloat16/int4/eager"


# -- the cost curve of this machine's steps ----------------------------------------------


def test_a_measured_cost_curve_is_kept_per_step_kind_beside_the_rows() -> None:
    from pardec_cli.selection.costmodel import CostCurve
    from pardec_cli.selection.learned import read_curve, record_curve

    curve = CostCurve.from_mapping({1: 10.0, 4: 14.4, 8: 21.7, 16: 34.4}, "measured here")
    record_generation(KEY, row())
    record_curve("sha256:m", "cpu:AMD EPYC", STEP, curve)
    record_generation(KEY, row())  # a later row keeps the curve, the curve kept the rows
    assert read_curve("sha256:m", "cpu:AMD EPYC", STEP) == curve
    assert len(read_usage("sha256:m", "cpu:AMD EPYC", STEP).rows["chat"]["pld[num_draft=8]"]) == 2
    assert read_curve("sha256:m", "cpu:AMD EPYC", "float32/full/compiled") is None
    data = json.loads(learned_path().read_text())
    (key,) = data["curves"]
    data["curves"][key]["ms"].pop("1")  # no n=1 point: not a curve
    learned_path().write_text(json.dumps(data))
    assert read_curve("sha256:m", "cpu:AMD EPYC", STEP) is None


def test_a_curve_measured_by_an_older_pardec_is_measured_again(monkeypatch) -> None:
    """Its steps may have cost otherwise (another attention, other graphs)."""
    from pardec_cli.selection import learned
    from pardec_cli.selection.costmodel import CostCurve

    record_curve = learned.record_curve
    monkeypatch.setattr(learned, "CURVE_VERSION", learned.CURVE_VERSION - 1)
    record_curve("sha256:m", "cpu:AMD EPYC", STEP, CostCurve.from_mapping({1: 10.0, 2: 13.4}, "measured here"))
    assert learned.read_curve("sha256:m", "cpu:AMD EPYC", STEP) is not None
    monkeypatch.undo()
    assert learned.read_curve("sha256:m", "cpu:AMD EPYC", STEP) is None


def test_the_curve_measured_for_this_step_kind_outranks_tunes_which_outranks_the_estimate() -> None:
    from pardec_cli.selection.costmodel import CostCurve

    selector = selector_with(Usage())
    assert selector.measured_curve is None and selector.curve.source.startswith("estimated")
    tuned = CostCurve.from_mapping({1: 10.0, 16: 20.0}, "measured by pardec tune (compiled steps)")
    selector.tuned = SimpleNamespace(curve=tuned, profiles={})
    assert selector.curve == tuned
    steep = CostCurve.from_mapping({1: 10.0, 16: 34.0}, "measured here")
    selector.learned_curve = steep
    assert selector.curve == steep
    assert "measured here" in selector.choose("Tell me about the history of Rome.", "chat").explain()


def test_auto_measures_this_machines_step_costs_once_and_later_sessions_read_them(tiny_session, monkeypatch) -> None:
    from pardec_cli.selection.learned import read_curve
    from pardec_cli.selection.selector import session_model
    from pardec_cli.session import Session

    monkeypatch.delenv("PARDEC_LEARN", raising=False)
    notices: list[str] = []
    session = Session(tiny_session.target.model, tiny_session.tokenizer, model_name="tiny", notice=notices.append)
    curve = session.auto_selector().measured_curve
    assert curve is not None and [n for n, _ in curve.points] == [1, 2, 4, 8, 16, 32]
    assert len(notices) == 1 and "float32/full/eager" in notices[0]
    hardware, info = session_model(session)
    kept = read_curve(info.fingerprint, hardware.key, "float32/full/eager")
    assert kept is not None and kept.points == tuple((n, round(ms, 3)) for n, ms in curve.points)
    later = Session(tiny_session.target.model, tiny_session.tokenizer, model_name="tiny", notice=notices.append)
    assert later.auto_selector().measured_curve == kept and len(notices) == 1  # read, not measured again


def counted_forwards(session, monkeypatch) -> list[int]:
    """The number of tokens of each forward `session`'s target runs from now on."""
    timed: list[int] = []
    forward = session.target.forward

    def counting(ids, cache, **kwargs):
        timed.append(len(ids))
        return forward(ids, cache, **kwargs)

    monkeypatch.setattr(session.target, "forward", counting)
    return timed


def test_the_step_curve_times_the_small_sizes_most_and_keeps_each_sizes_fastest(tiny_session, monkeypatch) -> None:
    from pardec_cli.tuning import curve as curves

    timed = counted_forwards(tiny_session, monkeypatch)
    clock = iter(float(i) for i in range(10_000))  # every timing 1 s, but n=2's fourth: 0.5 s
    ticks: list[float] = []

    def fake_clock() -> float:
        now = next(clock)
        if len(ticks) % 2 == 1 and timed[-1:] == [2] and timed.count(2) == 4:
            now = ticks[-1] + 0.5
        ticks.append(now)
        return now

    monkeypatch.setattr(curves.time, "perf_counter", fake_clock)
    measured = curves.measure_step_curve(tiny_session, budget_s=float("inf"))
    counts = {n: timed[2:].count(n) for n in curves.STEP_CURVE_POINTS}  # after the prefill and the warm-up
    assert counts == curves.STEP_CURVE_REPEATS and counts[1] > counts[32]
    assert dict(measured.points)[2] == 500.0 and dict(measured.points)[1] == 1000.0


def test_the_step_curve_times_a_slow_step_once_a_size_and_skips_the_longer_text(tiny_session, monkeypatch) -> None:
    """A step that takes 1 s (an eager float32 step on a small CPU takes 80 ms): the first
    round times every size once, the budget stops the rest, and the 1500-token text (a long
    prefill) is not measured; the curve is still whole."""
    from pardec_cli.tuning import curve as curves

    timed = counted_forwards(tiny_session, monkeypatch)
    clock = iter(float(i) for i in range(10_000))
    monkeypatch.setattr(curves.time, "perf_counter", lambda: next(clock))
    measured = curves.measure_step_curve(tiny_session, budget_s=2.5)
    assert sorted(timed[2:]) == sorted(curves.STEP_CURVE_POINTS)  # once each, after the prefill and the warm-up
    assert [n for n, _ in measured.points] == list(curves.STEP_CURVE_POINTS) and measured.row_ms_per_1k == 0.0


def test_the_step_curve_prices_each_row_per_token_of_text_from_a_second_longer_text(tiny_session, monkeypatch) -> None:
    from pardec_cli.selection.costmodel import CostCurve
    from pardec_cli.tuning import curve as curves

    def measured(session, context_ids, *, points, repeats, budget_s=None):
        long = len(context_ids) > curves.STEP_CURVE_CONTEXT_TOKENS
        times = {1: 2.0, 8: 4.4} if long else {1: 1.0, 2: 1.1, 4: 1.2, 8: 2.0, 16: 3.0, 32: 5.0}
        return CostCurve.from_mapping({n: times[n] for n in points}, "fake")

    monkeypatch.setattr(curves, "measure_curve", measured)
    monkeypatch.setattr(curves, "plain_context", lambda session, tokens=curves.STEP_CURVE_CONTEXT_TOKENS: [1] * tokens)
    monkeypatch.setattr(type(tiny_session.target), "max_context", property(lambda self: None))
    curve = curves.measure_step_curve(tiny_session)
    # 7 rows cost 2.4 ms more than one after 1500 tokens, 1.0 more after 300: 0.2 ms a row per 1200 tokens
    assert curve.context_tokens == 300 and abs(curve.row_ms_per_1k - 0.2 / 1.2) < 1e-9
    assert curve.ms_at(4, 300) == curve.ms(4) == curve.ms_at(4, 100)
    assert abs(curve.ms_at(4, 2300) - (curve.ms(4) + 4 * 2 * 0.2 / 1.2)) < 1e-9


def test_a_curve_keeps_its_price_per_token_of_text_in_learned_json(tmp_path) -> None:
    from pardec_cli.selection.costmodel import CostCurve

    curve = CostCurve.from_mapping({1: 4.0, 8: 6.0}, "measured")
    from pardec_cli.selection.learned import read_curve, record_curve

    priced = CostCurve(curve.points, "measured", context_tokens=300, row_ms_per_1k=0.6)
    record_curve("f", "cpu", "step", priced, path=tmp_path / "learned.json")
    assert read_curve("f", "cpu", "step", tmp_path / "learned.json") == priced
    record_curve("f", "cpu", "other", curve, path=tmp_path / "learned.json")
    assert read_curve("f", "cpu", "other", tmp_path / "learned.json").row_ms_per_1k == 0.0


def test_with_learning_off_auto_measures_nothing(tiny_session, monkeypatch) -> None:
    from pardec_cli.session import Session

    monkeypatch.setenv("PARDEC_LEARN", "0")
    session = Session(tiny_session.target.model, tiny_session.tokenizer, model_name="tiny")
    assert session.auto_selector().measured_curve is None
    assert not learned_path().exists()
