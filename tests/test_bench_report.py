"""What `pardec bench` reports besides the means: the per-prompt spread next to every
ratio, the box plots of `--plot`, and the prompt set that ships with pardec."""

from __future__ import annotations

import json
import re

import pytest

from pardec_cli.bench import (
    BUILTIN_PROMPTS,
    HF_GREEDY,
    OVERALL,
    SPREAD_NOTE,
    Run,
    format_tables,
    load_prompts,
    percentile,
    spread,
    summarize,
)
from pardec_cli.plots import BOX_NOTE, bench_figure
from tests.cli_helpers import invoke


def run(label: str, pid: str, category: str, tokens: int, seconds: float) -> Run:
    return Run(label, pid, category, tokens, seconds, max(tokens - 1, 1), 0, 0, list(range(tokens)))


# -- the spread ---------------------------------------------------------------------------


def test_percentiles_interpolate_between_order_statistics_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 10) == pytest.approx(1.4)
    assert percentile(values, 90) == pytest.approx(7.6)
    assert percentile([5.0], 90) == 5.0
    assert spread([]) is None


def test_every_ratio_comes_with_the_median_and_p10_p90_of_the_per_prompt_ratio() -> None:
    # pld is 2x vanilla on three prompts and 4x on the fourth: the pooled ratio hides it.
    runs = [run("vanilla", str(i), "c", 10, 1.0) for i in range(4)]
    runs += [run("pld", str(i), "c", 10, 0.5) for i in range(3)] + [run("pld", "3", "c", 10, 0.25)]
    runs += [run(HF_GREEDY, str(i), "c", 10, 2.0) for i in range(4)]
    table = summarize(runs, ["vanilla", "pld", HF_GREEDY])
    cell = table[OVERALL]["pld"]
    assert cell.spread["vs_vanilla"] == {"median": 2.0, "p10": 2.0, "p90": pytest.approx(3.4)}
    assert cell.spread["vs_hf"]["median"] == 4.0
    assert cell.spread["tokens_per_s"]["median"] == 20.0
    text = format_tables(table)
    pld_line = next(line for line in text.splitlines() if line.startswith("pld "))
    assert f"{cell.speedup_vs_vanilla:.2f}x (2.00, 2.00-3.40)" in pld_line
    assert "vs vanilla (med, p10-p90)" in text and text.rstrip().endswith(SPREAD_NOTE)


def test_the_json_report_carries_the_spread(tmp_path) -> None:
    from pardec_cli.bench import report_json

    runs = [run("vanilla", "1", "c", 10, 1.0), run("pld", "1", "c", 10, 0.5)]
    document = report_json(summarize(runs, ["vanilla", "pld"]), runs, {})
    assert document["summary"]["overall"]["pld"]["spread"]["vs_vanilla"] == {"median": 2.0, "p10": 2.0, "p90": 2.0}


# -- the picture ----------------------------------------------------------------------------


def test_the_plot_has_one_box_per_category_and_method_and_says_what_a_box_is() -> None:
    runs = [run(m, str(i), c, 20, s * (1 + i / 10)) for m, s in (("vanilla", 1.0), ("pld", 0.5))
            for c in ("code", "chat") for i in range(4)]
    picture = bench_figure(runs, ["vanilla", "pld"], width=80)
    assert "\x1b[" not in picture  # no colour codes unless asked for
    names = [line.split("┤")[0].strip() for line in picture.splitlines() if "┤" in line]
    assert names == ["chat vanilla", "chat pld", "code vanilla", "code pld"]  # the table's order, top down
    assert picture.splitlines()[-1] == BOX_NOTE
    assert max(len(line) for line in picture.splitlines()) <= 80
    assert "\x1b[" in bench_figure(runs, ["vanilla", "pld"], width=80, color=True)


# -- the prompt set that ships with pardec ---------------------------------------------------------


def test_bench_runs_out_of_the_box_on_pardecs_own_prompts() -> None:
    prompts = load_prompts(None)
    by_category: dict[str, int] = {}
    for prompt in prompts:
        by_category[prompt.category] = by_category.get(prompt.category, 0) + 1
    assert by_category == {"code": 4, "chat": 4, "extraction": 4}  # one category per task profile
    assert len({p.prompt_id for p in prompts}) == len(prompts)


def test_the_shipped_prompts_are_distinct_from_the_tuning_prompts() -> None:
    """Bench measures on prompts that `pardec tune` did not tune on."""
    from importlib import resources

    tuned = set()
    for profile in ("code", "chat", "extraction"):
        text = resources.files("pardec_cli").joinpath("data", "tune_prompts", f"{profile}.jsonl").read_text("utf-8")
        tuned |= {json.loads(line)["prompt"] for line in text.splitlines() if line.strip()}
    assert not tuned & {p.text for p in load_prompts(None)}


def test_bench_help_points_at_nothing_that_exists_only_in_the_repository() -> None:
    text = invoke(["bench", "--help"]).stdout
    assert "../shared" not in text and "shared/bench" not in text
    assert "built-in" in text or "pardec's own" in text
    assert re.search(r"pardec bench\s+the built-in prompts", text)


def test_a_prompt_file_given_by_path_is_read_in_either_format(tmp_path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text('{"question_id": 7, "category": "writing", "turns": ["Hi", "more"]}\n'
                    '{"task_id": "HumanEval/0", "prompt": "def f():"}\n')
    prompts = load_prompts(path)
    assert [(p.prompt_id, p.category, p.text) for p in prompts] == [("7", "writing", "Hi"),
                                                                     ("HumanEval/0", "humaneval", "def f():")]
    assert BUILTIN_PROMPTS == "built-in"
