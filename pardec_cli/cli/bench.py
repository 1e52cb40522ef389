"""`pardec bench`: how pardec proves speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from time import perf_counter

import click

from pardec_cli.cli.options import model_options, profile_option
from pardec_cli.cli.output import loading_status


@click.command()
@click.option("--prompts", "prompts_path", required=True, type=click.Path(path_type=Path),
              help="JSONL prompt set in Spec-Bench format (question_id, category, turns) or HumanEval format.")
@click.option("--methods", "methods_text", default="vanilla,pld", show_default=True, metavar="LIST",
              help="Comma-separated methods, each with optional knobs: auto,vanilla,pld,layerskip[layers=8,k=4]. "
              "auto chooses per prompt, as `pardec gen` does.")
@click.option("--limit-per-category", type=click.IntRange(min=1), default=None, help="Use the first N prompts of each category.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="New tokens per prompt.")
@click.option("--baseline-hf", is_flag=True, help="Add Hugging Face generate() greedy (and its prompt lookup when pld is benchmarked).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the results as JSON to this file ('-' for stdout).")
@profile_option
@model_options
def bench(prompts_path: Path, methods_text: str, limit_per_category: int | None, max_tokens: int, baseline_hf: bool,
          json_out: Path | None, profile: str, model: str | None, dtype: str, device: str, offline: bool | None,
          weights: str = "auto") -> None:
    """Benchmark decoding methods on a prompt set, side by side on one loaded model.

    Methods run interleaved prompt by prompt after a warm-up, so machine drift hits
    all of them alike. Reports per category and overall: tokens/s, speedup over
    `vanilla` and over Hugging Face generate() (same model and dtype), mean tokens per
    decoding step, draft acceptance, and the share of outputs identical to `vanilla`'s.

    \b
    Example:
      pardec bench --prompts ../shared/bench/spec_bench_dev.jsonl --limit-per-category 5 \\
          --methods 'vanilla,pld,layerskip[layer_list=0-9,20-29]' --baseline-hf --dtype bfloat16
    """
    from pardec_cli.bench import (
        Bench, format_auto_choices, format_tables, limit_per_category as limit, load_prompts, parse_methods, report_json,
        summarize,
    )
    from pardec_cli.cli.gen import load_profiles_checked
    from pardec_cli.session import Session

    choices = parse_methods(methods_text)
    load_profiles_checked(profile)
    prompts = limit(load_prompts(prompts_path), limit_per_category)
    with loading_status("loading model"):
        session = Session.load(model, dtype=dtype, device=device, offline=offline, progress=True, weights=weights)
    runner = Bench(session, choices, max_new_tokens=max_tokens, baseline_hf=baseline_hf, profile=profile)
    click.echo(
        f"pardec bench: {len(prompts)} prompts x {len(runner.labels)} methods ({', '.join(runner.labels)}), "
        f"{session.model_name} {session.dtype} ({session.weights} weights) on {session.device}, {max_tokens} new tokens",
        err=True,
    )
    started = perf_counter()
    tty = sys.stderr.isatty()

    def progress(done: int, total: int, prompt) -> None:
        elapsed = perf_counter() - started
        eta = elapsed / done * (total - done)
        line = f"[{done}/{total}] {prompt.category} {prompt.prompt_id}  elapsed {elapsed:.0f}s  eta {eta:.0f}s"
        if tty:
            click.echo(f"\r\033[K{line}", err=True, nl=False)
        elif done % len(runner.labels) == 0:
            click.echo(line, err=True)

    runs = runner.run(prompts, progress)
    if tty:
        click.echo("\r\033[K", err=True, nl=False)
    table = summarize(runs, runner.labels)
    # With `--json -` stdout holds only the JSON document; the tables go to stderr.
    to_stderr = json_out is not None and str(json_out) == "-"
    click.echo(format_tables(table), err=to_stderr)
    auto_choices = format_auto_choices(runs)
    if auto_choices:
        click.echo(auto_choices, err=to_stderr)
    if json_out is not None:
        config = {
            "prompts": str(prompts_path), "limit_per_category": limit_per_category, "max_new_tokens": max_tokens,
            "model": session.model_name, "dtype": session.dtype, "weights": session.weights, "device": session.device, "methods": runner.labels,
            "profile": profile,
        }
        document = json.dumps(report_json(table, runs, config), indent=1)
        if str(json_out) == "-":
            click.echo(document)
        else:
            json_out.write_text(document + "\n", encoding="utf-8")
