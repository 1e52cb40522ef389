"""`pardec gen`: one prompt in, a streamed reply out; or many prompts, one JSON line each.

Output modes (stdout holds only the reply or the JSON; diagnostics and --stats go to
stderr):

    (default)    the reply, streamed as tokens are accepted, then a newline
    --no-stream  the reply, printed whole at the end
    --json       one JSON object at the end (`result_record`)
    --jsonl      one JSON object per decoding step (`step_record`), then the --json
                 object with "type": "result"
    --prompts FILE / --each-line
                 many prompts on one model load: one JSON line per prompt
                 (`batch_record`); with --jsonl their steps are streamed too

Ctrl-C stops the generation after the current step, prints what was generated so far
(in the chosen format, plus the stats if asked) and exits with 130.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from pardec_cli.cli.options import (
    AUTO,
    build_method_options,
    compile_notice,
    compile_option,
    engine_options,
    method_options,
    model_options,
    profile_option,
    sampling_options,
    split_method,
)
from pardec_cli.cli.output import (
    InterruptGuard,
    is_terminal,
    loading_status,
    print_stats,
    reader_may_leave,
    write_json_line,
)
from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.planning import PROFILE_SAMPLING_KEYS, Planner, Settings, load_profiles_checked, planned_settings
from pardec_cli.prompt_files import clean_text, parse_prompt_line, tolerant_stdin


@click.command()
@click.argument("prompt", nargs=-1)
@model_options
@compile_option
@method_options()
@profile_option
@sampling_options
@engine_options
@click.option("-s", "--system", default=None, help="System prompt (through the model's chat template).")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--stats", is_flag=True, help="Print speed and acceptance statistics to stderr.")
@click.option("--explain", is_flag=True,
              help="Print the method and profile used, and why (auto's cost-model reasons), to stderr.")
@click.option("--no-stream", is_flag=True, help="Print the whole reply at the end instead of as it is generated.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object at the end: text, model, method, knobs, stats, finish reason.")
@click.option("--jsonl", "as_jsonl", is_flag=True,
              help="Stream one JSON object per decoding step, then the --json object with \"type\": \"result\".")
@click.option("--prompts", "prompts_file", default=None, metavar="FILE.jsonl",
              type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
              help="Run every prompt of a JSONL file (Spec-Bench 'turns' or a 'prompt' field; '-' reads stdin) "
              "on one model load; one JSON line per result.")
@click.option("--each-line", is_flag=True,
              help="Run every non-empty line of stdin as its own prompt; one JSON line per result.")
@click.option("--server", default=None, metavar="URL",
              help="Generate on a running `pardec serve` (e.g. http://127.0.0.1:8000) instead of loading the model "
              "here; -m names the server's model (default: the one it runs). Its API key: PARDEC_SERVE_API_KEY.")
def gen(prompt: tuple[str, ...], model: str | None, dtype: str, weights: str, device: str, offline: bool | None,
        method: str, method_opts: tuple[str, ...], draft_model: str | None, heads_dir: str | None, profile: str,
        max_tokens: int, temperature: float, top_p: float, top_k: int, seed: int | None, stop: tuple[str, ...],
        engine: str, tensor_parallel: int | None, pipeline_parallel: int | None, system: str | None, raw: bool,
        stats: bool, explain: bool, no_stream: bool, as_json: bool, as_jsonl: bool,
        prompts_file: Path | None, each_line: bool, server: str | None, compile: str) -> None:
    """Generate a reply to PROMPT and stream it to stdout.

    The prompt is the arguments joined by spaces; text piped on stdin is appended after
    it (so `cat notes.md | pardec gen "Summarise:"` works), and `-` reads the prompt from
    stdin alone. With --prompts or --each-line, the arguments (if any) are put before
    every prompt.

    With --method auto (the default) the method and its knobs are chosen per prompt
    for this hardware and the prompt's task profile (-P; detected from the prompt when
    auto), from measurements `pardec tune` saved when there are any; --explain says why.

    \b
    Examples:
      pardec gen "What is speculative decoding?"
      pardec gen --explain -P code "Write a function that reverses a list"
      pardec gen --method layerskip -O layer_list=0-9,20-29 --stats "Explain the KV cache"
      pardec gen --method draft --draft-model smollm2-135m -m smollm2-1.7b "Hi"
      pardec gen --method eagle --stats "Hi"         heads from `pardec train-heads --kind eagle`
      pardec gen --temp 0.7 --seed 1 --stop "\\n\\n" "Write a limerick"
      pardec gen --json "Hi" | jq -r .stats.tokens_per_s
      pardec gen --prompts spec_bench.jsonl -n 64 > results.jsonl
      cut -f2 questions.tsv | pardec gen --each-line "Answer briefly:"
      pardec gen --server http://127.0.0.1:8000 "Hi"   a warm `pardec serve` generates
      pardec gen --engine vllm -m llama-3.1-70b --tensor-parallel 4 "Hi"   vLLM decodes, pardec chooses

    Exit codes: 0 done (also when -n ends the reply: finish_reason "length"),
    1 runtime error, 2 usage error, 130 interrupted.
    """
    from pardec_cli.engine.sampling_params import SamplingParams
    from pardec_cli.session import Session

    method, method_opts = split_method(method, method_opts)
    if as_json and as_jsonl:
        raise PardecUsageError("--json and --jsonl cannot be combined",
                               hint="--json prints one object at the end, --jsonl one per step and a summary")
    if prompts_file is not None and each_line:
        raise PardecUsageError("--prompts and --each-line cannot be combined")
    batch = prompts_file is not None or each_line
    if engine == "vllm":
        from pardec_cli.cli.vllm_gen import check_vllm_modes

        check_vllm_modes(as_jsonl=as_jsonl, batch=batch, device=device)
    elif tensor_parallel or pipeline_parallel:
        raise PardecUsageError("--tensor-parallel and --pipeline-parallel are for --engine vllm",
                               hint="pardec's own engine runs on one device")
    if batch:
        if "-" in prompt:
            raise PardecUsageError("'-' reads one prompt from stdin; it cannot be combined with --prompts or --each-line")
        jobs = batch_prompts(prompts_file, each_line, prefix=" ".join(prompt))
    else:
        text = read_prompt(prompt)
    settings = Settings(
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        stop=tuple(clean_text(s) for s in stop), system=clean_text(system) if system is not None else None, raw=raw,
    )
    options = build_method_options(method, method_opts, draft_model, heads_dir)
    user_set = options_set_by_user(click.get_current_context(), PROFILE_SAMPLING_KEYS)
    if server:
        if engine == "vllm":
            raise PardecUsageError("--server and --engine vllm cannot be combined",
                                   hint="the server decodes with the engine it was started with")
        if batch or as_jsonl or explain:
            raise PardecUsageError("--server runs one prompt with text or --json output",
                                   hint="--prompts, --each-line, --jsonl and --explain need the model loaded here")
        if draft_model and method == AUTO:
            raise PardecUsageError("with --server, --draft-model needs --method draft")
        from pardec_cli.cli.remote import run_remote

        with reader_may_leave():
            run_remote(server, text, model=model, mode="json" if as_json else "text", streaming=not no_stream,
                       stats=stats, method=method, options=options, profile=profile, system=system, raw=raw,
                       values={"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p},
                       user_set=user_set, seed=seed, stop=stop)
        return
    load_profiles_checked(profile)  # a bad profile file or -P value fails before the model loads
    if engine == "vllm":
        from pardec_cli.cli.vllm_gen import run_vllm_gen

        profile_used, settings = planned_settings(text, profile, settings, user_set)
        with reader_may_leave():
            run_vllm_gen(text, model=model, dtype=dtype, offline=offline, method=method, options=options,
                         profile=profile, profile_used=profile_used, settings=settings, tensor_parallel=tensor_parallel,
                         pipeline_parallel=pipeline_parallel, mode="json" if as_json else "text",
                         streaming=not no_stream, stats=stats, explain=explain)
        return
    with loading_status("loading model"):
        session = Session.load(
            model, dtype=dtype, device=device, offline=offline, progress=is_terminal(sys.stderr),
            compile=compile, expected_tokens=max_tokens, notice=compile_notice, weights=weights,
        )
        planner = Planner(session, method=method, options=options, profile=profile, settings=settings,
                          user_set=user_set, drafters=[draft_model] if draft_model and method == AUTO else [])
        if not batch:
            settings = plan_prompt(planner, text, explain=explain)
    with reader_may_leave():
        if batch:
            run_batch(session, jobs, planner, steps=as_jsonl, stats=stats, explain=explain)
        else:
            mode = "jsonl" if as_jsonl else "json" if as_json else "text"
            run_single(session, text, settings, mode=mode, streaming=not no_stream, stats=stats,
                       profile=planner.profile_used)


def options_set_by_user(ctx: click.Context, names: Any) -> set[str]:
    """Which of `names` the user set: on the command line, in PARDEC_GEN_*, or in config.toml.

    Only options left at their built-in default take the profile's value (the profile
    sits between the config file and the built-in defaults).
    """
    from click.core import ParameterSource

    return {name for name in names if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}


def plan_prompt(planner: Planner, text: str, *, explain: bool, title: str | None = None) -> Settings:
    """Plan `text` (the session's method is set for it); with --explain, say why on stderr."""
    plan = planner.plan(text)
    sampling = plan.settings.sampling
    if sampling.greedy and sampling.seed is not None and not planner.warned_seed:
        planner.warned_seed = True  # once per run, not per prompt
        click.echo("pardec: warning: --seed has no effect: decoding is greedy (set --temp above 0 to sample)", err=True)
    if explain:
        header = [f"== {title}"] if title else []
        for line in header + plan.explain_lines():
            click.echo(line, err=True)
    return plan.settings


@dataclass(frozen=True)
class BatchPrompt:
    """One prompt of a batch: its position, its id (from the file, else the line number), its text."""

    index: int
    id: str | int
    text: str
    category: str | None = None
    error: str | None = None  # a line that could not be read: it gets an error line, the others run


# -- one generation -------------------------------------------------------------------


def generate(session: Any, text: str, settings: Settings, guard: InterruptGuard,
             on_chunk: Callable[[Any], None] | None = None) -> tuple[Any, bool, str]:
    """Run one generation, calling `on_chunk` per step; return (stream, interrupted, held-back tail).

    Ctrl-C (through `guard`) ends it after the current step; the stream then holds the
    text and stats so far and finish_reason "cancelled".
    """
    prompt_ids = session.encode(text, system=settings.system, raw=settings.raw)
    stream = session.stream(prompt_ids, max_new_tokens=settings.max_tokens, sampling=settings.sampling,
                            stop=settings.stop)
    interrupted = False
    try:
        with guard.generating():
            for chunk in stream:
                if on_chunk is not None:
                    on_chunk(chunk)
                if guard.requested:
                    break
    except KeyboardInterrupt:  # a second Ctrl-C, or one that arrived outside the guard
        interrupted = True
    interrupted = interrupted or guard.requested
    tail = stream.finish() if interrupted else ""
    return stream, interrupted, tail


def run_single(session: Any, text: str, settings: Settings, *, mode: str, streaming: bool, stats: bool,
               profile: str | None = None) -> None:
    """Generate one reply and print it as `mode` says ("text", "json" or "jsonl")."""
    out = sys.stdout

    def stream_text(chunk: Any) -> None:
        if chunk.text:
            out.write(chunk.text)
            out.flush()

    def stream_steps(chunk: Any) -> None:
        write_json_line(out, step_record(chunk))

    on_chunk = {"jsonl": stream_steps, "text": stream_text if streaming else None}.get(mode)
    with InterruptGuard() as guard:
        stream, interrupted, tail = generate(session, text, settings, guard, on_chunk)
    if mode == "json":
        write_json_line(out, result_record(session, stream, profile))
    elif mode == "jsonl":
        write_json_line(out, {"type": "result", **result_record(session, stream, profile)})
    else:
        out.write(tail if streaming else stream.text)
        if stream.text and not stream.text.endswith("\n"):
            out.write("\n")
        out.flush()
    if stats:
        print_stats(session, stream)
    if interrupted:
        raise KeyboardInterrupt


def run_batch(session: Any, jobs: Iterator[BatchPrompt], planner: Planner, *, steps: bool, stats: bool,
              explain: bool = False) -> None:
    """Generate a reply per prompt on the loaded model; one JSON line per prompt on stdout.

    A prompt that fails (too long for the context, empty) gets a line with an "error"
    field instead of a reply; the others still run, and the exit code is then 1.
    """
    out = sys.stdout
    failed = done = 0
    with InterruptGuard() as guard:
        for job in jobs:
            done += 1
            if job.error is not None:
                failed += 1
                record = {**batch_fields(job), "error": job.error}
                write_json_line(out, {"type": "result", **record} if steps else record)
                continue
            on_chunk = (lambda chunk, i=job.index: write_json_line(out, step_record(chunk, index=i))) if steps else None
            try:
                settings = plan_prompt(planner, job.text, explain=explain, title=f"prompt {job.index} (id {job.id})")
                stream, interrupted, _tail = generate(session, job.text, settings, guard, on_chunk)
            except PardecError as exc:
                failed += 1
                record = {**batch_fields(job), "error": exc.message}
                write_json_line(out, {"type": "result", **record} if steps else record)
                continue
            record = {**batch_fields(job), **result_record(session, stream, planner.profile_used)}
            write_json_line(out, {"type": "result", **record} if steps else record)
            if stats:
                print_stats(session, stream, title=f"prompt {job.index} (id {job.id})")
            if interrupted:
                raise KeyboardInterrupt
    if failed:
        raise PardecError(f"{failed} of {done} prompts failed (their JSON lines carry an \"error\" field)")


# -- records --------------------------------------------------------------------------


def result_record(session: Any, stream: Any, profile: str | None = None) -> dict[str, Any]:
    """The `--json` object for one generation."""
    return {
        "text": stream.text,
        "model": session.model_name,
        "method": session.method_name,
        "knobs": session.proposer.knobs(),
        "profile": profile,
        "dtype": session.dtype,
        "weights": session.weights,
        "device": session.device,
        "compiled": session.compiled,
        "runner": session.runner,
        "finish_reason": stream.finish_reason,
        "stats": stream.stats.to_dict(),
    }


def step_record(chunk: Any, **extra: Any) -> dict[str, Any]:
    """The `--jsonl` object for one decoding step (step 0 is the prefill)."""
    event = chunk.event
    return {
        "type": "step",
        **extra,
        "step": event.index,
        "text": chunk.text,
        "tokens": list(event.tokens),
        "drafted": event.drafted,
        "accepted": event.accepted,
        "propose_s": round(event.propose_s, 5),
        "verify_s": round(event.verify_s, 5),
        "forward_s": round(event.forward_s, 5),  # the target's forward, part of verify_s
        "elapsed_s": round(event.elapsed_s, 5),
        **({"arm": event.arm} if event.arm else {}),  # the configuration that drafted it (method adaptive)
    }


def batch_fields(job: BatchPrompt) -> dict[str, Any]:
    """What identifies a batch result: position, id, category and the prompt as run."""
    return {"index": job.index, "id": job.id, "category": job.category, "prompt": job.text}


# -- prompts --------------------------------------------------------------------------


def read_prompt(words: tuple[str, ...]) -> str:
    """Arguments, then stdin appended (when piped); `-` alone means stdin only."""
    parts = [clean_text(w) for w in words if w != "-"]
    text = " ".join(parts)
    stdin = sys.stdin
    wants_stdin = "-" in words
    if wants_stdin or not is_terminal(stdin):
        piped = clean_text(tolerant_stdin(stdin).read())
        if piped.strip():
            text = f"{text}\n{piped}" if text else piped
    if not text.strip():
        raise PardecUsageError("empty prompt: pass it as arguments or pipe it on stdin", hint="pardec gen \"Hello\"")
    return text


def batch_prompts(prompts_file: Path | None, each_line: bool, *, prefix: str = "") -> Iterator[BatchPrompt]:
    """The prompts of a batch run, each behind `prefix` (the argument prompt) when one is given.

    A prompt file is read and checked whole before any model is loaded; stdin (`--prompts -`,
    `--each-line`) is read line by line as generation goes, so a slow producer is served
    as it writes.
    """

    prefix = clean_text(prefix)

    def join(text: str) -> str:
        return f"{prefix}\n{text}" if prefix.strip() else text

    if prompts_file is not None and str(prompts_file) != "-":
        try:
            lines = prompts_file.read_bytes().decode("utf-8", "replace").splitlines()
        except OSError as exc:
            raise PardecUsageError(f"cannot read {prompts_file}: {exc.strerror or exc}") from None
        jobs = list(_parse_jsonl(lines, str(prompts_file), join))
        if not jobs:
            raise PardecUsageError(f"{prompts_file} holds no prompts")
        return iter(jobs)
    stdin = tolerant_stdin(sys.stdin)
    if each_line:
        return _each_line(stdin, join)
    return _parse_jsonl(stdin, "<stdin>", join, keep_going=True)


def _each_line(lines: Any, join: Callable[[str], str]) -> Iterator[BatchPrompt]:
    index = 0
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield BatchPrompt(index, number, join(clean_text(line.rstrip("\r\n"))))
            index += 1


def _parse_jsonl(lines: Any, source: str, join: Callable[[str], str], *, keep_going: bool = False) -> Iterator[BatchPrompt]:
    """Prompts from JSONL lines. A bad line stops a file (checked whole before the model
    loads); on stdin (`keep_going`) it becomes that prompt's error line and the rest run."""
    index = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ident, text, category = parse_prompt_line(line, f"{source}:{number}")
        except PardecUsageError as exc:
            if not keep_going:
                raise
            yield BatchPrompt(index, number, clean_text(line.rstrip("\r\n")), error=exc.message)
            index += 1
            continue
        yield BatchPrompt(index, number if ident is None else ident, join(text), category)
        index += 1
