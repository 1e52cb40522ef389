"""`pardec bench`: how pardec proves speed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from time import perf_counter

import click

from pardec_cli.cli.options import compile_notice, compile_option, model_options, profile_option
from pardec_cli.cli.output import loading_status
from pardec_cli.errors import PardecUsageError


@click.command()
@click.option("--prompts", "prompts_path", default=None, type=click.Path(path_type=Path),
              help="JSONL prompt set: Spec-Bench format (question_id, category, turns) or HumanEval (task_id, prompt). "
              "Default: pardec's own 12 prompts, 4 per task profile (code, chat, extraction).")
@click.option("--methods", "methods_text", default="vanilla,pld", show_default=True, metavar="LIST",
              help="Comma-separated methods, each with optional knobs: auto,vanilla,pld,layerskip[layers=8,k=4]. "
              "auto chooses per prompt, as `pardec gen` does.")
@click.option("--limit-per-category", type=click.IntRange(min=1), default=None, help="Use the first N prompts of each category.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="New tokens per prompt.")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Run every method on every prompt N times (interleaved, each round in another order) and keep, per "
              "method and prompt, the run of median time: steadier ratios on a shared, noisy machine, for N times "
              "the wait (the JSON keeps every run). vLLM's rows run once.")
@click.option("--baseline", "baseline_text", default=None, metavar="LIST",
              help="Peers to measure against, comma-separated: hf = Hugging Face generate() greedy on the same model "
              "and dtype with dense weights, as stock transformers runs it (a second copy is loaded when pardec runs "
              "quantized weights; plus its prompt lookup when pld is benchmarked); llamacpp = llama.cpp greedy on the model's "
              "GGUF file (needs `pip install 'pardec[peers]'`).")
@click.option("--baseline-hf", is_flag=True, help="Same as --baseline hf.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the results as JSON to this file ('-' for stdout).")
@click.option("--engine", "engines", type=click.Choice(["pardec", "vllm", "pardec,vllm"]), default="pardec",
              show_default=True,
              help="Who decodes: pardec's engine, vLLM (pip install 'pardec[vllm]'; one vLLM engine per method), "
              "or both side by side (vLLM's rows labelled vllm:METHOD, run after pardec's).")
@click.option("--tensor-parallel", type=click.IntRange(min=1), default=None, metavar="N",
              help="With vLLM: GPUs each layer is split across (default: the GPUs found).")
@click.option("--pipeline-parallel", type=click.IntRange(min=1), default=None, metavar="N",
              help="With vLLM: pipeline stages (default: what the tensor split leaves).")
@click.option("--plot", is_flag=True,
              help="Also draw tokens/s per category and method as box plots of the per-prompt values.")
@click.option("-q", "--quiet", is_flag=True, help="No progress display (shown only on a terminal anyway).")
@profile_option
@model_options
@compile_option
def bench(prompts_path: Path | None, methods_text: str, limit_per_category: int | None, max_tokens: int, rounds: int,
          baseline_text: str | None, baseline_hf: bool, json_out: Path | None, engines: str, tensor_parallel: int | None,
          pipeline_parallel: int | None, plot: bool, quiet: bool, profile: str, model: str | None, dtype: str, weights: str,
          device: str, offline: bool | None, compile: str) -> None:
    """Benchmark decoding methods on a prompt set, side by side on one loaded model.

    Methods run interleaved prompt by prompt after a warm-up, so machine drift hits
    all of them alike. Reports per category and overall: tokens/s, speedup over
    `vanilla` and over Hugging Face generate() (same model and dtype), mean tokens per
    decoding step, draft acceptance, and the share of outputs identical to `vanilla`'s.
    Next to each ratio, in parentheses, its spread over the prompts: the median and the
    10th-90th percentile of the per-prompt ratio (a busy machine can vary several-fold).

    Without --prompts it runs pardec's own small set (4 prompts for each task profile);
    real sets such as Spec-Bench's question.jsonl are given by path.

    Baselines run interleaved with the methods on the same prompt token ids, greedy,
    with the same token budget. llama.cpp runs the GGUF file the model came from (the
    embedded model's, or the one `pardec import` converted) with as many threads as
    pardec, in a worker process; the report names its version and settings, and says
    so when a crash made it fall back to n_batch=1.

    With --engine vllm the methods run on vLLM instead (each translated to its
    speculative_config; methods vLLM lacks are an error naming the closest it has), with
    --engine pardec,vllm on both, in one table.

    \b
    Examples:
      pardec bench                                  the built-in prompts, vanilla vs pld
      pardec bench --methods auto,vanilla,suffix --plot -n 64
      pardec bench --prompts question.jsonl --limit-per-category 5 \\
          --methods 'vanilla,pld,layerskip[layer_list=0-9,20-29]' --baseline-hf --dtype bfloat16
      pardec bench --prompts humaneval.jsonl --limit-per-category 1 -n 64 \\
          --methods auto,vanilla --baseline hf,llamacpp
      pardec bench --prompts question.jsonl --limit-per-category 3 --rounds 3 \\
          --methods 'auto,vanilla,pld[num_draft=2]'     steadier per-category ratios
      pardec bench --prompts question.jsonl --limit-per-category 2 \\
          --methods vanilla,pld --engine pardec,vllm
    """
    from pardec_cli.bench import (
        BUILTIN_PROMPTS, Bench, MethodChoice, format_auto_choices, format_tables, limit_per_category as limit, load_prompts,
        make_baselines, median_runs, parse_baselines, parse_methods, report_json, summarize,
    )
    from pardec_cli.planning import load_profiles_checked
    from pardec_cli.progress import ProgressDisplay, progress_wanted
    from pardec_cli.session import Session

    choices = parse_methods(methods_text)
    load_profiles_checked(profile)
    prompts = limit(load_prompts(prompts_path), limit_per_category)
    prompts_name = str(prompts_path) if prompts_path is not None else BUILTIN_PROMPTS
    use_pardec, use_vllm = "pardec" in engines.split(","), "vllm" in engines.split(",")
    if not use_vllm and (tensor_parallel or pipeline_parallel):
        raise PardecUsageError("--tensor-parallel and --pipeline-parallel are for --engine vllm")
    baseline_names = parse_baselines(("hf," if baseline_hf else "") + (baseline_text or ""))
    if baseline_names and not use_pardec:
        raise PardecUsageError("baselines run next to pardec's engine", hint="use --engine pardec,vllm")
    if "llamacpp" in baseline_names:  # before the model loads (and compiles): say it at once
        from pardec_cli.peers.llamacpp import find_gguf, require_installed
        from pardec_cli.store.resolve import resolve_model

        require_installed()
        if use_pardec:
            resolved = resolve_model(model, offline=offline, progress=True)
            find_gguf(resolved.name, source=resolved.source, path=resolved.path)
    if use_vllm:
        from pardec_cli.vllm_engine.plan import require_vllm
        from pardec_cli.vllm_engine.translate import runs_on_vllm, unsupported_error

        require_vllm()
        for choice in choices:  # before any model loads
            if choice.name != "auto" and not runs_on_vllm(choice.name):
                raise unsupported_error(choice.name)
    started = perf_counter()
    # With `--json -` stdout holds only the JSON document; the tables go to stderr, and
    # no live display competes with them there.
    to_stderr = json_out is not None and str(json_out) == "-"
    live = progress_wanted(quiet or to_stderr)
    tty = sys.stderr.isatty() and not live
    runs, labels, per_method = [], [], 1
    baseline_lines: list[str] = []
    baseline_settings: object = None
    display = ProgressDisplay(live)
    bar: list = []  # the display's bar over prompts x methods, once the methods are known

    def progress(done: int, total: int, prompt) -> None:
        if live:
            if not bar:
                bar.append(display.task("measuring", total))
            bar[0].update(completed=done, total=total)
            return
        elapsed = perf_counter() - started
        eta = elapsed / done * (total - done)
        line = f"[{done}/{total}] {prompt.category} {prompt.prompt_id}  elapsed {elapsed:.0f}s  eta {eta:.0f}s"
        if tty:
            click.echo(f"\r\033[K{line}", err=True, nl=False)
        elif done % per_method == 0 and not quiet:
            click.echo(line, err=True)

    def starting(label: str, prompt, warm_up: bool) -> None:
        """What runs now, on the display's bar: 'warm-up: pld' or 'code code-2: pld'."""
        if not live:
            return
        what = f"warm-up: {label}" if warm_up else f"{prompt.category} {prompt.prompt_id}: {label}"
        total = None if warm_up else len(prompts) * per_method * rounds
        if not bar:
            bar.append(display.task(what, total))
        bar[0].update(description=what, total=total)

    if use_pardec:
        # The model loads before the display starts: its first-run conversion has a
        # display of its own (one live display at a time).
        with loading_status("loading model"):
            session = Session.load(model, dtype=dtype, device=device, offline=offline, progress=True,
                                   compile=compile, notice=compile_notice, weights=weights, measuring=True)
        baselines = make_baselines(baseline_names, session, choices)
        # The drafters benchmarked (draft[model=...]) are offered to auto, as gen's --draft-model is.
        drafters = [c.options["model"] for c in choices if c.name == "draft" and c.options.get("model")]
        with Bench(session, choices, max_new_tokens=max_tokens, baselines=baselines, profile=profile,
                   drafters=drafters) as runner, display:
            labels, per_method = list(runner.labels), len(runner.labels)
            step = session.runner
            model_name, where = session.model_name, f"{session.dtype} ({session.weights} weights) on {session.device} ({step} step)"
            if not quiet:
                display.print(
                    f"pardec bench: {len(prompts)} prompts x {len(runner.labels)} methods ({', '.join(runner.labels)}), "
                    f"{session.model_name} {where}, {max_tokens} new tokens"
                    + (f", {rounds} rounds (the median run of each)" if rounds > 1 else "")
                )
            if live:
                bar.append(display.task("warming up (compiling, caches)", None))
            runs += runner.run(prompts, progress, starting, rounds=rounds)
            baseline_lines, baseline_settings = runner.describe_baselines(), runner.baseline_settings()
    if use_vllm:
        from pardec_cli.store.resolve import resolve_model
        from pardec_cli.vllm_engine.bench import vllm_runs

        resolved = resolve_model(model, offline=offline, progress=True)
        model_name = resolved.name
        vchoices = choices if any(c.label == "vanilla" for c in choices) else [MethodChoice("vanilla", "vanilla"), *choices]
        prefix = "vllm:" if use_pardec else ""
        click.echo(f"pardec bench: {len(prompts)} prompts x {len(vchoices)} methods on vLLM "
                   f"({', '.join(c.label for c in vchoices)}), {resolved.name}, {max_tokens} new tokens", err=True)
        started, per_method = perf_counter(), 1
        bar.clear()
        with ProgressDisplay(live) as display:
            runs += vllm_runs(resolved, prompts, vchoices, max_new_tokens=max_tokens, profile=profile, dtype=dtype,
                              offline=offline, tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
                              label_prefix=prefix, progress=progress)
        labels += [prefix + c.label for c in vchoices]
    if tty:
        click.echo("\r\033[K", err=True, nl=False)
    typical = median_runs(runs)  # one run per method and prompt (of several --rounds)
    table = summarize(typical, labels)
    click.echo(format_tables(table), err=to_stderr)
    if plot:
        from pardec_cli.plots import bench_figure

        out = sys.stderr if to_stderr else sys.stdout
        width = min(shutil.get_terminal_size().columns, 120)
        click.echo(bench_figure(typical, labels, width=width, color=out.isatty()), err=to_stderr)
    auto_choices = format_auto_choices(typical)  # per prompt, not per round
    if auto_choices:
        click.echo(auto_choices, err=to_stderr)
    for line in baseline_lines:
        click.echo(line, err=to_stderr)
    if json_out is not None:
        config = {
            "prompts": prompts_name, "limit_per_category": limit_per_category, "max_new_tokens": max_tokens,
            "rounds": rounds,
            "model": model_name, "dtype": dtype if not use_pardec else session.dtype,
            "weights": session.weights if use_pardec else None,
            "device": where if use_pardec else "vllm", "methods": labels, "profile": profile, "engine": engines,
            "baselines": baseline_settings,
        }
        document = json.dumps(report_json(table, runs, config), indent=1)
        if str(json_out) == "-":
            click.echo(document)
        else:
            json_out.write_text(document + "\n", encoding="utf-8")
