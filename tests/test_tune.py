"""`pardec tune`: the results file, the candidate space, and short real tunes on a tiny
model through the CLI (budget checks, resume, Ctrl-C, results that must not apply)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardec_cli.selection.costmodel import CostCurve
from pardec_cli.errors import PardecError
from pardec_cli.hardware import CpuInfo, describe
from pardec_cli.selection.profiles import Candidate, Profile
from pardec_cli.selection.tuned import (
    Run, TunedCandidate, TunedProfile, TunedResults, all_results, find_results, fingerprint_directory, read_results,
    tuned_dir, unusable_results, write_results,
)
from pardec_cli.tuning.prompts import builtin_prompts
from pardec_cli.tuning.space import candidate_pool, neighbours, normalize
from pardec_cli.tuning.tuner import mixed
from tests.cli_helpers import invoke

THIS_CPU = describe("cpu", "float32", CpuInfo("cpu", 2, frozenset({"avx2"})))


def sample_results(device: str = "cpu:test cpu (2 cores)", fingerprint: str = "sha256:abc") -> TunedResults:
    return TunedResults(
        model="tiny", fingerprint=fingerprint, device=device, dtype="float32",
        curve=CostCurve.from_mapping({1: 50.0, 8: 80.5, 64: 250.25}, "measured by pardec tune on 2026-01-01"),
        profiles={
            "code": TunedProfile(
                "code",
                [TunedCandidate("suffix+recycling", {"recycling.nodes": 8, "suffix.max_nodes": 12}, 2.31, 9.5, 1.2,
                                24.5, 1.41, 8, 8, 3)],
                best="suffix+recycling[recycling.nodes=8,suffix.max_nodes=12]", complete=True, max_new_tokens=96,
                budget_s=300.0, spent_s=250.5,
                runs=[Run("vanilla", "code-01", 96, 5.5, 95, 0, 0.0, True),
                      Run("suffix+recycling[recycling.nodes=8,suffix.max_nodes=12]", "code-01", 96, 3.9, 41, 390, 0.05, True)],
            ),
            "chat": TunedProfile("chat", prompts="/tmp/my \"prompts\".jsonl"),
        },
    )  # fmt: skip


# -- the results file -------------------------------------------------------------------


def test_results_round_trip_through_toml() -> None:
    original = sample_results()
    path = write_results(original)
    assert path.parent == tuned_dir() and path.suffix == ".toml"
    again = read_results(path)
    for field in ("model", "fingerprint", "device", "dtype", "curve", "profiles", "updated"):
        assert getattr(again, field) == getattr(original, field), field
    assert again.profiles["code"].best_candidate().speedup == 1.41
    text = path.read_text()
    assert text.startswith("# pardec tune results") and "[runs]" in text


def test_results_are_found_only_for_the_same_weights_device_and_dtype() -> None:
    write_results(sample_results())
    assert find_results("sha256:abc", "cpu:test cpu (2 cores)", "float32") is not None
    assert find_results("sha256:abc", "cpu:test cpu (2 cores)", "bfloat16") is None
    assert find_results("sha256:abc", "cuda:NVIDIA H100", "float32") is None
    assert find_results("sha256:other", "cpu:test cpu (2 cores)", "float32") is None
    notes = unusable_results("tiny", "sha256:abc", "cuda:NVIDIA H100", "float32")
    assert len(notes) == 1 and "another device (cpu:test cpu (2 cores))" in notes[0] and "not used" in notes[0]
    assert "another version of the model" in unusable_results("tiny", "sha256:new", "cpu:test cpu (2 cores)", "float32")[0]
    assert unusable_results("someone-else", "sha256:zzz", "cpu:x", "float32") == []


def test_a_broken_results_file_is_skipped_by_lookups_and_named_when_read(tmp_path) -> None:
    tuned_dir().mkdir(parents=True)
    bad = tuned_dir() / "broken.toml"
    bad.write_text("format = [\n")
    assert all_results() == []
    with pytest.raises(PardecError, match="broken.toml"):
        read_results(bad)
    bad.write_text("format = 99\nmodel='x'\n")
    with pytest.raises(PardecError, match="format: must be 1, not 99"):
        read_results(bad)


def test_the_fingerprint_changes_with_the_weights(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    first = fingerprint_directory(model)
    assert fingerprint_directory(model) == first
    (model / "model.safetensors").write_bytes(b"\1" + b"\0" * 999)
    assert fingerprint_directory(model) != first


# -- the candidate space ------------------------------------------------------------------


def test_normalize_drops_defaults_and_spreads_combination_knobs() -> None:
    assert normalize("pld", {"num_draft": "10", "branches": 2}).knobs == (("branches", 2),)
    combined = normalize("suffix+recycling", {"max_nodes": 16, "recycling.nodes": 8})
    assert dict(combined.knobs) == {"suffix.max_nodes": 16, "recycling.nodes": 8}


def test_neighbours_move_one_knob_one_step() -> None:
    labels = {c.label for c in neighbours(normalize("recycling", {"nodes": 16, "depth": 4}))}
    assert labels == {"recycling[depth=4,nodes=12]", "recycling[depth=4,nodes=24]",
                      "recycling[depth=3,nodes=16]", "recycling[depth=5,nodes=16]"}


def test_neighbours_skip_settings_the_method_rejects() -> None:
    # pld's fit sizes one copy: branches=2 beside it is a usage error, not a setting to time
    labels = {c.label for c in neighbours(normalize("pld", {"num_draft": 16, "fit": True}))}
    assert labels == {"pld[fit=true,num_draft=12]", "pld[fit=true,num_draft=24]"}
    assert "pld[branches=2,num_draft=16]" in {c.label for c in neighbours(normalize("pld", {"num_draft": 16}))}


def test_the_pool_seeds_with_the_profiles_candidates_that_can_run_here() -> None:
    profile = Profile("t", "", {}, {"default": (
        Candidate("pld", {"num_draft": 8}, 2.0), Candidate("draft", {}, 3.0), Candidate("eagle", {}, 3.0),
    )}, ("t",))  # fmt: skip
    pool = candidate_pool(profile, THIS_CPU)
    assert pool[0].label == "pld[num_draft=8]"
    assert {c.method for c in pool} == {"pld"}  # no drafter installed; eagle not a method here
    assert "pld[num_draft=6]" in {c.label for c in pool}
    only = candidate_pool(profile, THIS_CPU, only=["jacobi"])
    assert only[0].label == "jacobi" and {c.method for c in only} == {"jacobi"}


def test_the_quick_pool_is_the_profiles_own_candidates_without_neighbours() -> None:
    profile = Profile("t", "", {}, {"default": (Candidate("pld", {"num_draft": 8}, 2.0), Candidate("suffix", {}, 2.0))},
                      ("t",))
    quick = candidate_pool(profile, THIS_CPU, neighbours_too=False)
    assert [c.label for c in quick] == ["pld[num_draft=8]", "suffix"]
    assert len(candidate_pool(profile, THIS_CPU)) > len(quick)


def test_the_quick_pool_takes_the_candidates_the_cost_model_ranks_highest_on_this_curve() -> None:
    """A profile lists its candidates for a class of hardware; on this machine's curve the
    fourth may be the one that pays (pld[num_draft=2] on a Zen 4 EPYC)."""
    from pardec_cli.methods.registry import METHODS
    from pardec_cli.selection.costmodel import CostCurve, ModelShape
    from pardec_cli.selection.selector import prior_estimates
    from pardec_cli.tuning.space import likeliest_first

    profile = Profile("t", "", {}, {"default": (
        Candidate("suffix", {"max_nodes": 8}, 1.2, 3.0), Candidate("pld", {"num_draft": 8}, 1.2, 2.0),
        Candidate("recycling", {}, 1.4, 10.0), Candidate("pld", {"num_draft": 2}, 1.15, 0.9),
    )}, ("t",))  # fmt: skip
    pool = candidate_pool(profile, THIS_CPU, neighbours_too=False)
    steep = CostCurve.from_mapping({1: 4.0, 2: 4.2, 4: 6.0, 8: 10.0, 16: 20.0, 32: 40.0}, "measured")
    estimates = prior_estimates(hardware=THIS_CPU, model=ModelShape(135_000_000, 30), profile=profile, greedy=True,
                                accelerators=(), curve=steep, methods=METHODS)  # fmt: skip
    ranked = [c.label for c in likeliest_first(pool, estimates)]
    assert ranked[0] == "pld[num_draft=2]" and ranked[-1] == "recycling"
    assert [c.label for c in likeliest_first(pool, [])] == [c.label for c in pool]  # nothing estimated: profile order


def test_each_candidate_is_also_measured_at_the_size_this_machines_curve_makes_cheap() -> None:
    """On a curve where 16 nodes cost 3x one token (a CPU's int4 kernel), suffix[16] is
    followed by suffix[4] (5 rows: <= 1.5 plain steps); on a flat curve it is cheap already."""
    from pardec_cli.tuning.space import with_curve_sizes

    pool = [normalize("suffix", {"max_nodes": 16}), normalize("pld", {"num_draft": 8}), normalize("suffix", {"max_nodes": 4})]
    steep = CostCurve.from_mapping({1: 10.0, 4: 13.0, 8: 20.0, 16: 33.0, 32: 56.0}, "measured")
    assert [c.label for c in with_curve_sizes(pool, steep.relative)] == [
        "suffix[max_nodes=16]", "suffix[max_nodes=4]", "pld[num_draft=8]", "pld[num_draft=4]"]
    flat = CostCurve.from_mapping({1: 10.0, 16: 11.5, 32: 13.0}, "measured")
    assert with_curve_sizes(pool, flat.relative) == pool


def test_what_tune_measured_is_said_in_plain_words_with_its_spread_before_the_best() -> None:
    from pardec_cli.tuning.tuner import describe_profile

    label = "pld[num_draft=8]"
    runs = [Run("vanilla", "p1", 65, 2.0, 64, 0, 0.0, True), Run(label, "p1", 65, 1.0, 30, 120, 0.01, True),
            Run("vanilla", "p2", 65, 2.0, 64, 0, 0.0, True), Run(label, "p2", 65, 1.6, 40, 150, 0.01, True)]
    profile = TunedProfile("code", [TunedCandidate("pld", {"num_draft": 8}, 1.88, 4.0, 0.2, 50.0, 1.54, 2, 2, 1)],
                           best=label, complete=True, runs=runs)
    lines = describe_profile(profile)
    assert lines == [
        "pld[num_draft=8]: 1.88 tokens per step, 1.54x plain decoding (1.25-2.00) over 2 prompts, "
        "2/2 outputs equal to plain decoding's",
        "best: pld[num_draft=8] (1.54x plain decoding, 50.0 tok/s)",
    ]
    assert describe_profile(TunedProfile("chat")) == ["nothing measured yet"]


def test_the_best_tune_reports_is_the_one_auto_would_rank_first_or_plain_decoding() -> None:
    """The search's last round ranks only what reached it; the summary's best is what
    auto ranks first from all of it (a speed-up shrunk by how few prompts it rests on),
    and plain decoding where nothing measured beats it."""
    from pardec_cli.tuning.tuner import describe_profile

    def profile(*candidates: tuple[str, int, float, int]) -> TunedProfile:
        runs = [Run("vanilla", f"p{i}", 65, 1.0, 64, 0, 0.0, True) for i in range(30)]
        found = []
        for method, size, speedup, prompts in candidates:
            label = f"{method}[num_draft={size}]"
            runs += [Run(label, f"p{i}", 65, 1.0 / speedup, 50, 100, 0.01, True) for i in range(prompts)]
            found.append(TunedCandidate(method, {"num_draft": size}, 1.3, 2.0, 0.1, 64 * speedup, speedup, prompts, 0, 1))
        # The search ended on the one measured over the most prompts, whatever its speed-up.
        last_round = max(found, key=lambda c: c.prompts).label
        return TunedProfile("chat", found, best=last_round, complete=True, runs=runs)

    assert describe_profile(profile(("pld", 4, 0.90, 28), ("pld", 2, 1.06, 4)))[-1] == (
        "best: pld[num_draft=2] (1.06x plain decoding, 67.8 tok/s)")
    assert describe_profile(profile(("pld", 4, 0.90, 28), ("pld", 2, 0.97, 4)))[-1] == (
        "best: plain decoding (nothing measured beat it)")


def test_progress_shows_from_the_first_event_on_a_terminal_and_a_line_per_phase_in_a_pipe(capsys) -> None:
    from pardec_cli.cli.tune import ProgressView
    from pardec_cli.tuning.search import Progress
    from pardec_cli.tuning.tuner import TuneEvent

    events = [TuneEvent("stage", message="warming up"), TuneEvent("curve", done=30, total=30),
              TuneEvent("search", "code", progress=Progress("screen", 1, 4, "pld", 6.9, 1.0, 100.0)),
              TuneEvent("search", "code", progress=Progress("round 1", 5, 8, "pld", 1.6, 9.0, 90.0)),
              TuneEvent("done", "code", message="done", done=12)]
    pipe = ProgressView(180.0, tty=False)
    pipe.start()
    for event in events:
        pipe.show(event)
    pipe.stop()
    err = capsys.readouterr().err
    assert err.splitlines()[:3] == ["pardec: cost curve measured (0:00)", "pardec: code: screen", "pardec: code: round 1"]
    assert "code: search finished (0:12)" in err
    terminal = ProgressView(180.0, tty=True)
    terminal.start()
    assert terminal.progress is not None  # the bar is up before anything was measured
    for event in events[:3]:
        terminal.show(event)
    task = terminal.progress.tasks[0]
    assert task.description == "code: screen" and "6.9" not in task.fields["detail"]  # one prompt names no leader
    terminal.show(events[3])
    assert "leading pld 1.60x" in terminal.progress.tasks[0].fields["detail"]
    terminal.stop()


def test_the_bar_shows_a_leading_label_with_its_knobs_as_written() -> None:
    """pld[num_draft=8] on the bar is text, not rich markup (which would show "pld")."""
    from rich.progress import TextColumn

    from pardec_cli.cli.tune import ProgressView
    from pardec_cli.tuning.search import Progress
    from pardec_cli.tuning.tuner import TuneEvent

    terminal = ProgressView(180.0, tty=True)
    terminal.start()
    terminal.show(TuneEvent("search", "code", progress=Progress("round 1", 5, 8, "pld[min_ngram=2,num_draft=8]", 1.6, 9.0, 90.0)))
    task = terminal.progress.tasks[0]
    shown = " ".join(column.render(task).plain for column in terminal.progress.columns if isinstance(column, TextColumn))
    terminal.stop()
    assert "leading pld[min_ngram=2,num_draft=8] 1.60x" in shown


# -- the command -----------------------------------------------------------------------------


@pytest.fixture
def few_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "few.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Tell me about the number {i}."}) + "\n" for i in range(4)))
    return path


def tune(model: Path, *args: str, compile: str = "off"):
    """`pardec tune` on `model`, eagerly unless `compile` says otherwise: the tuner's logic is
    the same on either runner, and compiling the tiny model's steps took ~25 s a test (each
    test's home saves its own); the first test below tunes compiled steps."""
    return invoke(["tune", "-m", str(model), "--dtype", "float32", "--compile", compile, "-n", "8", *args])


def test_a_short_real_tune_saves_results_that_auto_and_doctor_use(tiny_cli_model: Path, few_prompts: Path) -> None:
    result = tune(tiny_cli_model, "-P", "code", "--methods", "pld,suffix", "--prompts", str(few_prompts), "--budget", "1",
                  compile="auto")
    assert result.exit_code == 0, result.stderr
    assert "pardec: cost curve measured" in result.stderr
    assert "auto now picks:" in result.stdout
    [results] = all_results()
    assert results.model == str(tiny_cli_model) and results.dtype == "float32"
    assert results.curve is not None and results.curve.points[0][0] == 1
    code = results.profiles["code"]
    assert code.runs and code.candidates
    assert {c.method for c in code.candidates} <= {"pld", "suffix"}
    assert all(c.matched == c.prompts for c in code.candidates)  # float32: every output equals vanilla's
    shown = invoke(["tune", "--show"])
    assert shown.exit_code == 0 and "code " in shown.stdout and "(applies here)" not in shown.stdout
    shown_here = invoke(["tune", "--show", "-m", str(tiny_cli_model), "--dtype", "float32"])
    assert "(applies here)" in shown_here.stdout
    data = json.loads(invoke(["tune", "--show", "--json", "-m", str(tiny_cli_model), "--dtype", "float32"]).stdout)
    assert data[0]["applies_here"] is True
    doctor = invoke(["doctor", "-m", str(tiny_cli_model), "--dtype", "float32"])
    assert "tuned         profiles code on " in doctor.stdout
    assert "(measured by pardec tune on " in doctor.stdout  # auto uses the measured curve
    removed = invoke(["tune", "--reset", "-m", str(tiny_cli_model)])
    assert removed.exit_code == 0 and "removed " in removed.stdout
    assert all_results() == []
    assert "nothing to remove" in invoke(["tune", "--reset", "-m", str(tiny_cli_model)]).stdout


def test_a_rerun_resumes_what_was_measured(tiny_cli_model: Path, few_prompts: Path) -> None:
    args = ("-P", "chat", "--methods", "pld", "--prompts", str(few_prompts), "--budget", "0.5")
    first = tune(tiny_cli_model, *args)
    assert first.exit_code == 0, first.stderr
    [before] = all_results()
    assert before.profiles["chat"].prompts == str(few_prompts)
    runs_before = [(r.label, r.prompt) for r in before.profiles["chat"].runs]
    second = tune(tiny_cli_model, *args)
    assert second.exit_code == 0, second.stderr
    [after] = all_results()
    chat = after.profiles["chat"]
    if before.profiles["chat"].complete:
        assert "already tuned" in second.stderr
        assert [(r.label, r.prompt) for r in chat.runs] == runs_before
    else:
        assert [(r.label, r.prompt) for r in chat.runs][: len(runs_before)] == runs_before
        assert len(set((r.label, r.prompt) for r in chat.runs)) == len(chat.runs)  # nothing measured twice
    assert after.curve == before.curve  # the curve is measured once


def test_ctrl_c_keeps_what_was_measured(tiny_cli_model: Path, few_prompts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pardec_cli.tuning.evaluate import SessionEvaluator

    real = SessionEvaluator.measure
    calls = {"n": 0}

    def interrupted_after_three(self, label, prompt_id):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(self, label, prompt_id)

    monkeypatch.setattr(SessionEvaluator, "measure", interrupted_after_three)
    result = tune(tiny_cli_model, "-P", "code", "--methods", "pld", "--prompts", str(few_prompts), "--budget", "2")
    assert result.exit_code == 130
    assert "interrupted: 3 measured runs kept in " in result.stderr
    [kept] = all_results()
    assert len(kept.profiles["code"].runs) == 3 and not kept.profiles["code"].complete


def test_a_budget_too_small_to_measure_anything_says_so(tiny_cli_model: Path) -> None:
    result = tune(tiny_cli_model, "--budget", "0.0001")
    assert result.exit_code == 2
    assert "is too small to measure anything here" in result.stderr
    assert "pardec: hint: give at least --budget" in result.stderr
    assert all_results() == []


def test_a_quick_tune_on_a_slow_machine_measures_less_rather_than_refuse(tiny_cli_model: Path, few_prompts: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from pardec_cli.tuning.tuner import MIN_TOKENS, Tuner

    # One forward "takes" 400 ms: 64-token runs and a thrice-timed curve do not fit 2 minutes.
    monkeypatch.setattr(Tuner, "probe_ms", lambda self: 400.0)
    result = invoke(["tune", "-m", str(tiny_cli_model), "--dtype", "float32", "--compile", "off", "-P", "code",
                     "--methods", "pld", "--prompts", str(few_prompts), "--budget", "2"])
    assert result.exit_code == 0, result.stderr
    assert "tokens a run, the curve timed once" in result.stderr
    [results] = all_results()
    assert MIN_TOKENS <= results.profiles["code"].max_new_tokens < 64
    assert {n for n, _ in results.curve.points} == {1, 2, 4, 8, 12, 16, 24, 32, 48, 64}
    refused = invoke(["tune", "-m", str(tiny_cli_model), "--dtype", "float32", "--compile", "off", "--thorough",
                      "--budget", "0.5"])
    assert refused.exit_code != 0 and "too small to measure anything here" in refused.stderr


def test_a_tune_on_a_quick_machine_lengthens_its_runs_unless_told_how_long(tiny_cli_model: Path, few_prompts: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from pardec_cli.tuning.tuner import MAX_RUN_TOKENS, Tuner

    # One forward "takes" 1 ms: 64-token runs would be over in a tenth of a second, where
    # prompt lookup has had little of the reply to copy from.
    monkeypatch.setattr(Tuner, "probe_ms", lambda self: 1.0)
    args = ["tune", "-m", str(tiny_cli_model), "--dtype", "float32", "--compile", "off", "-P", "code", "--methods", "pld",
            "--prompts", str(few_prompts), "--budget", "0.3"]
    result = invoke(args)
    assert result.exit_code == 0, result.stderr
    assert f"plain decoding is quick here: {MAX_RUN_TOKENS} tokens a run" in result.stderr
    [results] = all_results()
    assert results.profiles["code"].max_new_tokens == MAX_RUN_TOKENS
    again = invoke(args)  # resumes at the same length instead of starting over
    assert again.exit_code == 0, again.stderr
    assert "token count changed" not in again.stderr
    assert all_results()[0].profiles["code"].max_new_tokens == MAX_RUN_TOKENS
    told = invoke([*args, "-n", "48", "-P", "chat"])  # a token count given is kept
    assert told.exit_code == 0, told.stderr
    assert "quick here" not in told.stderr and all_results()[0].profiles["chat"].max_new_tokens == 48


def test_results_for_another_device_are_never_applied(tiny_cli_model: Path) -> None:
    from pardec_cli.selection.tuned import fingerprint_directory

    fingerprint = fingerprint_directory(tiny_cli_model)
    elsewhere = sample_results(device="cuda:NVIDIA H100 80GB HBM3", fingerprint=fingerprint)
    elsewhere.model = str(tiny_cli_model)
    write_results(elsewhere)
    result = invoke(["gen", "-m", str(tiny_cli_model), "--dtype", "float32", "-n", "2", "--explain", "-P", "code", "hi"])
    assert result.exit_code == 0, result.stderr
    assert "another device (cuda:NVIDIA H100 80GB HBM3): not used" in result.stderr
    assert "measured by pardec tune" not in result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--show", "--reset"], "--show and --reset cannot be combined"),
        (["--json"], "--json goes with --show"),
        (["--methods", "pld,nope"], "unknown method 'nope'"),
        (["--methods", "auto"], "auto is what tune informs"),
        (["-P", "poetry"], "unknown profile 'poetry'"),
    ],
)
def test_bad_tune_arguments_are_usage_errors(args: list[str], fragment: str) -> None:
    result = invoke(["tune", *args])
    assert result.exit_code == 2, result.stderr
    assert fragment in result.stderr


def test_the_prompts_a_quick_tune_decides_on_first_mix_the_sets_kinds() -> None:
    """Successive halving drops candidates on its first prompts: the built-in code set is
    written new functions first, then edits of given code; tune takes both from the start."""
    code = builtin_prompts("code")
    assert not any("```" in p.text for p in code[:8])  # the file: eight new functions first
    first = mixed(code)[:4]
    assert any("```" in p.text for p in first) and any("```" not in p.text for p in first)
    assert [p.prompt_id for p in mixed(code)] == [p.prompt_id for p in mixed(builtin_prompts("code"))]  # resumable
    assert sorted(p.prompt_id for p in mixed(code)) == sorted(p.prompt_id for p in code)


def test_a_candidate_is_measured_on_a_proposer_that_did_not_see_its_warm_up(tiny_cli_model: Path) -> None:
    """Each candidate's first generation is an untimed warm-up on the same prompt. Suffix
    drafting remembers replies: measured on the warmed proposer, it would copy the
    warm-up's start of the reply. It is measured as a proposer that has seen nothing."""
    from pardec_cli.session import Session
    from pardec_cli.tuning.evaluate import SessionEvaluator
    from pardec_cli.tuning.prompts import TunePrompt

    session = Session.load(str(tiny_cli_model), dtype="float32", device="cpu", compile="off", offline=True)
    candidate = normalize("suffix", {})
    evaluator = SessionEvaluator(session, [TunePrompt("p", "Say one two three.")], [candidate], max_new_tokens=24)
    measured = evaluator.measure(candidate.label, "p")
    stream = session.stream(evaluator.encode("p"), max_new_tokens=24, proposer=session.build_proposer("suffix"), record=False)
    for _ in stream:
        pass
    assert (measured.steps, measured.tokens) == (stream.stats.steps, len(stream.token_ids))
