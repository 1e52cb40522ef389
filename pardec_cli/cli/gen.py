"""`pardec gen`: one prompt in, a streamed reply out."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from pardec_cli.cli.options import build_method_options, method_options, model_options, sampling_options
from pardec_cli.cli.output import loading_status, print_stats
from pardec_cli.errors import PardecUsageError


@click.command()
@click.argument("prompt", nargs=-1)
@model_options
@method_options()
@sampling_options
@click.option("-s", "--system", default=None, help="System prompt (through the model's chat template).")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--stats", is_flag=True, help="Print speed and acceptance statistics to stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, method, stats, finish reason) instead of streaming.")
def gen(prompt: tuple[str, ...], model: str | None, dtype: str, device: str, offline: bool | None,
        method: str, method_opts: tuple[str, ...], draft_model: str | None,
        max_tokens: int, temperature: float, top_p: float, top_k: int, seed: int | None, stop: tuple[str, ...],
        system: str | None, raw: bool, stats: bool, as_json: bool) -> None:
    """Generate a reply to PROMPT and stream it to stdout.

    The prompt is the arguments joined by spaces; text piped on stdin is appended after
    it (so `cat notes.md | pardec gen "Summarise:"` works), and `-` reads the prompt from
    stdin alone.

    \b
    Examples:
      pardec gen "What is speculative decoding?"
      pardec gen --method layerskip -O layers=8 --stats "Explain the KV cache"
      pardec gen --method draft --draft-model smollm2-135m -m smollm2-1.7b "Hi"
      pardec gen --temp 0.7 --seed 1 --stop "\\n\\n" "Write a limerick"
    """
    from pardec_cli.engine.sampling import SamplingParams
    from pardec_cli.session import Session

    text = read_prompt(prompt)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    options = build_method_options(method, method_opts, draft_model)
    with loading_status("loading model"):
        session = Session.load(model, dtype=dtype, device=device, offline=offline, progress=True)
        session.set_method(method, options)
    prompt_ids = session.encode(text, system=system, raw=raw)
    stream = session.stream(prompt_ids, max_new_tokens=max_tokens, sampling=sampling, stop=stop)
    out = sys.stdout
    interrupted = False
    try:
        for chunk in stream:
            if chunk.text and not as_json:
                out.write(chunk.text)
                out.flush()
    except KeyboardInterrupt:
        interrupted = True
        tail = stream.finish()
        if tail and not as_json:
            out.write(tail)
    if as_json:
        out.write(json.dumps(result_record(session, stream), ensure_ascii=False) + "\n")
    elif stream.text and not stream.text.endswith("\n"):
        out.write("\n")
    out.flush()
    if stats:
        print_stats(session, stream)
    if interrupted:
        raise KeyboardInterrupt


def read_prompt(words: tuple[str, ...]) -> str:
    """Arguments, then stdin appended (when piped); `-` alone means stdin only."""
    parts = [w for w in words if w != "-"]
    text = " ".join(parts)
    stdin = click.get_text_stream("stdin")
    wants_stdin = "-" in words
    if wants_stdin or not _is_interactive(stdin):
        piped = stdin.read()
        if piped.strip():
            text = f"{text}\n{piped}" if text else piped
    if not text.strip():
        raise PardecUsageError("empty prompt: pass it as arguments or pipe it on stdin", hint="pardec gen \"Hello\"")
    return text


def _is_interactive(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def result_record(session: Any, stream: Any) -> dict[str, Any]:
    """The `--json` object for one generation."""
    return {
        "text": stream.text,
        "model": session.model_name,
        "method": session.method_name,
        "knobs": session.proposer.knobs(),
        "dtype": session.dtype,
        "device": session.device,
        "finish_reason": stream.finish_reason,
        "stats": stream.stats.to_dict(),
    }
