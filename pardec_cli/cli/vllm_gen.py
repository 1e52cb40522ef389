"""`pardec gen --engine vllm`: pardec chooses, vLLM decodes; the same output modes.

The reply streams to stdout as vLLM accepts tokens; `--json` prints the same record as
pardec's engine (its "stats" carry the fields vLLM reports, plus its acceptance per
draft position), `--stats` the same block on stderr. vLLM's own log goes to stderr.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from pardec_cli.cli.output import InterruptGuard, loading_status, write_json_line
from pardec_cli.errors import PardecUsageError


def check_vllm_modes(*, as_jsonl: bool, batch: bool, device: str = "auto") -> None:
    """The modes `--engine vllm` does not have, as usage errors (before anything loads)."""
    if device != "auto":
        raise PardecUsageError("--device is for pardec's engine: vLLM runs where its build runs (CUDA or CPU)",
                               hint="set the GPUs with CUDA_VISIBLE_DEVICES and --tensor-parallel / --pipeline-parallel")
    if as_jsonl:
        raise PardecUsageError("--jsonl streams pardec's decoding steps; vLLM does not report them per step",
                               hint="use --json (one record at the end) with --engine vllm")
    if batch:
        raise PardecUsageError("--prompts / --each-line run on pardec's engine only",
                               hint="for many prompts on vLLM: pardec bench --engine vllm, or vLLM's server")


def run_vllm_gen(
    text: str, *, model: str | None, dtype: str, offline: bool | None, method: str, options: dict[str, Any],
    profile: str, profile_used: str, settings: Any, tensor_parallel: int | None, pipeline_parallel: int | None,
    mode: str, streaming: bool, stats: bool, explain: bool,
) -> None:
    """Plan (resolve, choose, translate), start vLLM, generate one reply and print it as `mode` says.

    `profile` is -P (auto: detected from the prompt when auto chooses the method);
    `profile_used` the one whose sampling defaults `settings` already hold.
    """
    from pardec_cli.session import encode_prompt
    from pardec_cli.vllm_engine.plan import plan_vllm, require_vllm
    from pardec_cli.vllm_engine.runner import VllmEngine

    require_vllm()  # before anything is resolved or downloaded
    sampling = settings.sampling
    with loading_status("resolving the model"):
        plan = plan_vllm(model, method=method, options=options, prompt=text, profile=profile,
                         greedy=sampling.greedy, dtype=dtype, offline=offline, tensor_parallel=tensor_parallel,
                         pipeline_parallel=pipeline_parallel, seed=sampling.seed, progress=True)
    if explain:
        for line in plan.reasons:
            click.echo(line, err=True)
    with loading_status("starting vLLM"):
        engine = VllmEngine(plan.args)
    ids = encode_prompt(engine.tokenizer, text, system=settings.system, raw=settings.raw)
    stream = engine.stream(ids, max_tokens=settings.max_tokens, temperature=sampling.temperature,
                           top_p=sampling.top_p, top_k=sampling.top_k, seed=sampling.seed, stop=settings.stop)
    out = sys.stdout
    interrupted = False
    chunks = iter(stream)
    with InterruptGuard() as guard:
        try:
            with guard.generating():
                for chunk in chunks:
                    if mode == "text" and streaming:
                        out.write(chunk)
                        out.flush()
                    if guard.requested:
                        break
        except KeyboardInterrupt:
            interrupted = True
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # an early stop aborts the request in vLLM
    interrupted = interrupted or guard.requested
    if mode == "json":
        write_json_line(out, vllm_record(plan, stream, profile_used))
    else:
        if not streaming:
            out.write(stream.text)
        if stream.text and not stream.text.endswith("\n"):
            out.write("\n")
        out.flush()
    if stats:
        print_vllm_stats(plan, stream)
    if interrupted:
        raise KeyboardInterrupt


def engine_label(plan: Any) -> str:
    """Where vLLM ran it: 'vllm, tensor 2 x pipeline 1'."""
    p = plan.parallel
    return f"vllm, tensor {p.tensor} x pipeline {p.pipeline}" + (f" ({p.backend})" if p.backend else "")


def vllm_record(plan: Any, stream: Any, profile: str | None) -> dict[str, Any]:
    """The `--json` record: pardec's fields, plus the engine and what vLLM was given."""
    return {
        "text": stream.text,
        "model": plan.model_name,
        "method": plan.method,
        "knobs": plan.knobs,
        "profile": profile,
        "dtype": plan.args.get("dtype"),
        "device": engine_label(plan),
        "finish_reason": stream.finish_reason,
        "stats": stream.stats.to_dict(),
        "engine": "vllm",
        "speculative_config": plan.translation.speculative_config,
        "notes": list(plan.translation.notes),
    }


def print_vllm_stats(plan: Any, stream: Any) -> None:
    """The `--stats` block for a vLLM generation, on stderr (the lines pardec's engine prints,
    with vLLM's per-position acceptance)."""
    s = stream.stats
    knob_text = " ".join(f"{k}={v}" for k, v in plan.knobs.items())
    lines = [
        f"method      {plan.method} {knob_text}".rstrip(),
        f"model       {plan.model_name} ({plan.args.get('dtype')}, {engine_label(plan)})",
        f"tokens      {s.prompt_tokens} prompt, {s.generated_tokens} generated ({stream.finish_reason})",
        f"speed       {s.tokens_per_s:.1f} tok/s end to end, {s.decode_tokens_per_s:.1f} tok/s after the first token",
        f"first token {s.ttft_s * 1000:.0f} ms",
        f"steps       {s.steps}, {s.mean_tokens_per_step:.2f} tokens per step, "
        f"{s.acceptance_rate:.0%} of {s.drafted_tokens} drafted tokens accepted",
    ]
    if s.acceptance_per_position:
        lines.append("by position " + " ".join(f"{rate:.0%}" for rate in s.acceptance_per_position))
    lines += [f"note        {note}" for note in plan.translation.notes]
    for line in lines:
        click.echo(line, err=True)
