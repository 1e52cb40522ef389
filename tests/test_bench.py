"""`pardec bench`: prompt sets, method lists, the summary arithmetic, and a real short run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardec_cli.bench import (
    HF_GREEDY, OVERALL, BenchPrompt, Run, format_auto_choices, format_tables, limit_per_category, load_prompts,
    median_runs, parse_methods, summarize,
)
from pardec_cli.errors import PardecUsageError
from tests.cli_helpers import invoke

SHARED_BENCH = Path(__file__).resolve().parents[2] / "shared" / "bench"


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# -- prompt sets --------------------------------------------------------------------


def test_spec_bench_format_uses_the_first_turn(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"question_id": 7, "category": "writing", "turns": ["First turn", "Second turn"]},
        {"question_id": 8, "category": "qa", "turns": ["Q?"]},
    ])
    assert load_prompts(path) == [BenchPrompt("7", "writing", "First turn"), BenchPrompt("8", "qa", "Q?")]


def test_humaneval_format_uses_the_prompt(tmp_path):
    path = write_jsonl(tmp_path / "h.jsonl", [{"task_id": "HumanEval/0", "prompt": "def f():\n"}])
    assert load_prompts(path) == [BenchPrompt("HumanEval/0", "humaneval", "def f():\n")]


@pytest.mark.parametrize("name", ["spec_bench_dev.jsonl", "humaneval_dev.jsonl", "code_edit_dev.jsonl"])
def test_the_shared_benchmark_sets_load(name):
    path = SHARED_BENCH / name
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    prompts = load_prompts(path)
    assert len(prompts) > 50
    assert all(p.text.strip() for p in prompts)


@pytest.mark.parametrize(
    "content, fragment",
    [("{not json\n", "not valid JSON"), ('{"question_id": 1}\n', "turns"), ("\n\n", "no prompts")],
)
def test_bad_prompt_files_are_usage_errors_naming_the_line(tmp_path, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PardecUsageError, match=fragment):
        load_prompts(path)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(PardecUsageError, match="not found"):
        load_prompts(tmp_path / "nope.jsonl")


def test_limit_per_category_keeps_file_order():
    prompts = [BenchPrompt(str(i), cat, "x") for i, cat in enumerate("aabab")]
    assert [p.prompt_id for p in limit_per_category(prompts, 1)] == ["0", "2"]
    assert len(limit_per_category(prompts, None)) == 5


# -- method lists -------------------------------------------------------------------


def test_method_list_with_knobs_and_layer_lists():
    choices = parse_methods("vanilla, pld[num_draft=8,prefer=recent],layerskip[layer_list=0-9,20-29,k=4]")
    assert [c.label for c in choices] == ["vanilla", "pld[num_draft=8,prefer=recent]", "layerskip[layer_list=0-9,20-29,k=4]"]
    assert choices[1].options == {"num_draft": "8", "prefer": "recent"}
    assert choices[2].options == {"layer_list": "0-9,20-29", "k": "4"}


def test_method_list_with_adaptive_arms_in_brackets():
    choices = parse_methods("vanilla,adaptive[arms=pld[fit=true,num_draft=16] | vanilla,dwell=4],pld[num_draft=2]")
    assert [c.label for c in choices] == ["vanilla", "adaptive[arms=pld[fit=true,num_draft=16] | vanilla,dwell=4]", "pld[num_draft=2]"]
    assert choices[1].options == {"arms": "pld[fit=true,num_draft=16] | vanilla", "dwell": "4"}


@pytest.mark.parametrize("text", ["", "pld[", "pld[num_draft]", "adaptive[arms=pld[num_draft=2 | vanilla]"])
def test_bad_method_lists(text):
    with pytest.raises(PardecUsageError):
        parse_methods(text)


# -- summary arithmetic -------------------------------------------------------------


def run(label, pid, cat, tokens, seconds, steps, drafted=0, accepted=0, ids=None):
    return Run(label, pid, cat, tokens, seconds, steps, drafted, accepted, ids or list(range(tokens)))


def test_summary_ratios_steps_acceptance_and_match():
    runs = [
        run("vanilla", "1", "a", 11, 1.0, 10), run("vanilla", "2", "b", 11, 1.0, 10),
        run("pld", "1", "a", 11, 0.5, 4, drafted=8, accepted=6),
        run("pld", "2", "b", 11, 0.25, 2, drafted=10, accepted=8, ids=[0] * 11),  # differs from vanilla
        run(HF_GREEDY, "1", "a", 11, 1.1, 10), run(HF_GREEDY, "2", "b", 11, 0.9, 10),
    ]
    table = summarize(runs, ["vanilla", "pld", HF_GREEDY])
    overall = table[OVERALL]
    assert overall["vanilla"].tokens_per_s == pytest.approx(11.0)
    assert overall["pld"].tokens_per_s == pytest.approx(22 / 0.75, rel=1e-3)
    assert overall["pld"].speedup_vs_vanilla == pytest.approx((22 / 0.75) / 11, rel=1e-3)
    assert overall["pld"].speedup_vs_hf == pytest.approx((22 / 0.75) / 11, rel=1e-3)
    assert overall["pld"].mean_tokens_per_step == pytest.approx(20 / 6, rel=1e-3)  # first token is the prefill's
    assert overall["pld"].acceptance_rate == pytest.approx(14 / 18, rel=1e-3)
    assert overall["pld"].match_rate == 0.5
    assert table["b"]["pld"].match_rate == 0.0
    assert table["a"]["pld"].speedup_vs_vanilla == pytest.approx(2.0)
    text = format_tables(table)
    assert text.index("== a (") < text.index("== overall (")


def test_of_several_rounds_each_method_and_prompt_keeps_its_median_run():
    runs = [
        run("vanilla", "1", "a", 11, 1.0, 10), run("vanilla", "1", "a", 11, 3.0, 10), run("vanilla", "1", "a", 11, 1.2, 10),
        run("pld", "1", "a", 11, 0.9, 4), run("pld", "1", "a", 11, 0.5, 4),  # even: the lower middle one
        run("vanilla", "2", "b", 11, 2.0, 10),
    ]
    typical = median_runs(runs)
    assert [(r.label, r.prompt_id, r.seconds) for r in typical] == [("vanilla", "1", 1.2), ("pld", "1", 0.5), ("vanilla", "2", 2.0)]
    # The 3-second hiccup of one round does not decide the ratio.
    assert summarize(typical, ["vanilla", "pld"])["a"]["pld"].speedup_vs_vanilla == pytest.approx(1.2 / 0.5)
    # What auto chose is counted per prompt, not per round.
    chose = [Run("auto", "1", "a", 11, seconds, 5, 0, 0, [], chosen="pld[num_draft=2]") for seconds in (1.0, 0.9, 1.1)]
    assert "a: pld[num_draft=2] x1" in format_auto_choices(median_runs(chose))


def test_rounds_run_every_method_on_every_prompt_again_in_another_order(tiny_cli_model: Path) -> None:
    from pardec_cli.bench import Bench, MethodChoice
    from pardec_cli.session import Session

    session = Session.load(str(tiny_cli_model), dtype="float32", device="cpu", compile="off", offline=True)
    prompts = [BenchPrompt("1", "a", "Say one two three."), BenchPrompt("2", "b", "Count to five.")]
    seen: list[tuple[str, str]] = []
    with Bench(session, [MethodChoice("vanilla", "vanilla"), MethodChoice("pld", "pld")], max_new_tokens=4) as bench:
        runs = bench.run(prompts, starting=lambda label, prompt, warm_up: warm_up or seen.append((label, prompt.prompt_id)),
                         rounds=3)
    assert len(runs) == 3 * 2 * 2
    assert sorted({(r.label, r.prompt_id, r.round) for r in runs}) == sorted(
        (label, pid, k) for label in ("vanilla", "pld") for pid in ("1", "2") for k in range(3))
    assert seen[:2] == [("vanilla", "1"), ("pld", "1")] and seen[4:6] == [("pld", "1"), ("vanilla", "1")]
    assert all(r.token_ids == runs[0].token_ids for r in runs if r.prompt_id == "1")
    assert len(median_runs(runs)) == 4


def test_a_round_does_not_draft_from_what_an_earlier_round_generated(tiny_cli_model: Path) -> None:
    """Suffix drafting remembers earlier replies: a second round of the same prompts would
    copy the first round's outputs (10.9 tokens a step on Spec-Bench against 1.45), and the
    first round's first prompt the warm-up's start of it. Each round starts with fresh
    proposers: both rounds take the same steps, as a fresh proposer does."""
    from pardec_cli.bench import Bench, MethodChoice
    from pardec_cli.session import Session

    session = Session.load(str(tiny_cli_model), dtype="float32", device="cpu", compile="off", offline=True)
    prompts = [BenchPrompt(str(i), "a", text) for i, text in enumerate(["Say one two three.", "Count to five."])]
    with Bench(session, [MethodChoice("vanilla", "vanilla"), MethodChoice("suffix", "suffix")], max_new_tokens=24) as bench:
        runs = [r for r in bench.run(prompts, rounds=2) if r.label == "suffix"]
    first, second = ([(r.prompt_id, r.steps, r.accepted) for r in runs if r.round == k] for k in (0, 1))
    assert sorted(first) == sorted(second)


def test_only_autos_own_runs_teach_the_auto_it_is_benchmarked_as(tiny_cli_model: Path, monkeypatch) -> None:
    """Every run is recorded for later sessions, but the reference methods' runs on these
    very prompts would teach this run's auto what to choose for them."""
    from pardec_cli.bench import Bench, MethodChoice
    from pardec_cli.session import Session

    session = Session.load(str(tiny_cli_model), dtype="float32", device="cpu", compile="off", offline=True)
    taught: list[bool] = []
    real = session.stream
    monkeypatch.setattr(session, "stream", lambda *a, **k: taught.append(k["teach"]) or real(*a, **k))
    methods = [MethodChoice("auto", "auto"), MethodChoice("pld", "pld"), MethodChoice("vanilla", "vanilla")]
    with Bench(session, methods, max_new_tokens=4) as bench:
        runs = bench.run([BenchPrompt("1", "a", "Say one two three.")], rounds=1)
    assert [r.label for r in runs] == ["auto", "pld", "vanilla"]
    assert taught[-3:] == [True, False, False]


# -- a real run ---------------------------------------------------------------------


@pytest.mark.real_model
def test_bench_command_on_the_embedded_model(tmp_path, embedded_pardec_home, monkeypatch):
    monkeypatch.setenv("PARDEC_HOME", str(embedded_pardec_home))
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"question_id": 1, "category": "edit", "turns": ["Repeat exactly: one two three four five six"]},
        {"question_id": 2, "category": "chat", "turns": ["Say hello."]},
    ])
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--prompts", str(prompts), "--methods", "vanilla,pld[num_draft=4]", "-n", "8",
                     "--dtype", "float32", "--baseline-hf", "--json", str(out), "--rounds", "2",
                     "--compile", "off"])  # the compiled runner has its own tests; compiling here took minutes
    assert result.exit_code == 0, result.stderr
    assert "== overall (2 prompts) ==" in result.stdout
    document = json.loads(out.read_text())
    assert document["config"]["methods"] == ["vanilla", "pld[num_draft=4]", "hf", "hf-pld"]
    overall = document["summary"]["overall"]
    # float32: every method, HF's included, produces exactly vanilla's tokens.
    assert {label: cell["match_rate"] for label, cell in overall.items()} == {
        "vanilla": 1.0, "pld[num_draft=4]": 1.0, "hf": 1.0, "hf-pld": 1.0}
    assert len(document["runs"]) == 2 * 4 * 2 and document["config"]["rounds"] == 2  # every run of both rounds
    assert {r["round"] for r in document["runs"]} == {0, 1}
    assert overall["vanilla"]["prompts"] == 2  # the summary: one (median) run per prompt
    assert "pardec bench: 2 prompts x 4 methods" in result.stderr and "2 rounds" in result.stderr


def test_bench_rejects_a_bad_method_before_loading_anything(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"question_id": 1, "category": "c", "turns": ["x"]}])
    result = invoke(["bench", "--prompts", str(prompts), "--methods", "vanilla,nope"])
    assert result.exit_code == 2
    assert "unknown method 'nope'" in result.stderr


def test_the_hf_baseline_runs_stock_transformers_on_dense_weights(tiny_cli_model: Path) -> None:
    """pardec's packed int4 layers are not what a transformers user runs: with quantized
    weights the hf baseline loads a dense copy; with dense weights it shares the model."""
    from pardec_cli.bench import HFBaseline
    from pardec_cli.quant import weights_label
    from pardec_cli.session import Session

    quantized = Session.load(str(tiny_cli_model), dtype="bfloat16", device="cpu", weights="int4", offline=True)
    assert weights_label(quantized.target.model) == "int4"
    baseline = HFBaseline(quantized)
    baseline.start([[1, 2, 3]], 4)
    assert baseline.model is not quantized.target.model and weights_label(baseline.model) == "full"
    run = baseline.run(HF_GREEDY, BenchPrompt("1", "c", "x"), [5, 6, 7], 4)
    assert run.new_tokens == 4
    assert baseline.settings()["weights"] == "full"
    dense = Session.load(str(tiny_cli_model), dtype="float32", device="cpu", weights="full", offline=True)
    shared = HFBaseline(dense)
    shared.start([[1, 2, 3]], 4)
    assert shared.model is dense.target.model
