"""`pardec serve`: an OpenAI-compatible HTTP server that keeps one model loaded.

Thin: check the options, bind the socket (a port in use fails before the model
loads), load the model, warm it with one short generation, run uvicorn. The server
itself is `pardec_cli.serve`.
"""

from __future__ import annotations

import socket
import sys

import click

from pardec_cli.cli.options import (
    build_method_options, compile_notice, compile_option, engine_options, method_options, model_options, profile_option,
    split_method,
)
from pardec_cli.cli.output import is_terminal, loading_status
from pardec_cli.errors import PardecError, PardecUsageError

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@click.command()
@model_options
@compile_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but a loopback address exposes the model to the network: "
              "set --api-key then.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="TCP port (0: any free port; the address is printed).")
@click.option("--api-key", default=None, metavar="KEY",
              help="Require 'Authorization: Bearer KEY' on every request (also PARDEC_SERVE_API_KEY).")
@click.option("--max-queue", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests that may wait for the decoding worker; more are answered 429 with Retry-After.")
@click.option("--max-body", "max_body", type=click.IntRange(min=1024), default=4 * 1024 * 1024, show_default=True,
              metavar="BYTES", help="Largest request body accepted (413 beyond).")
@click.option("--max-tokens-limit", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Largest max_tokens a request may ask for (400 beyond).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True, metavar="SECONDS",
              help="On Ctrl-C or SIGTERM, how long running and queued requests may take to finish before they are "
              "cancelled (a second Ctrl-C cancels at once).")
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
@engine_options
@method_options()
@profile_option
@click.option("--vllm-arg", "vllm_args", multiple=True, metavar="ARG",
              help="With --engine vllm: one more argument for `vllm serve`, passed as it is (repeatable, e.g. "
              "--vllm-arg=--max-model-len --vllm-arg=8192).")
@click.option("--dry-run", is_flag=True,
              help="With --engine vllm: print the `vllm serve` command pardec would run, and why, then exit.")
def serve(model: str | None, dtype: str, weights: str, device: str, offline: bool | None, compile: str, host: str, port: int,
          api_key: str | None, max_queue: int, max_body: int, max_tokens_limit: int, drain_timeout: float,
          access_log: bool, engine: str, tensor_parallel: int | None, pipeline_parallel: int | None, method: str,
          method_opts: tuple[str, ...], draft_model: str | None, heads_dir: str | None, profile: str,
          vllm_args: tuple[str, ...], dry_run: bool) -> None:
    """Serve a model over the OpenAI API (chat completions, completions, models).

    The model is loaded once and stays warm. Every request is decoded with parallel
    decoding: the method is chosen per request from its text as `pardec gen` chooses
    it (--method auto), or named in the request's "pardec" field:

    \b
      {"model": "...", "messages": [...],
       "pardec": {"method": "pld", "knobs": {"num_draft": 8}, "profile": "code"}}

    Responses carry the method, knobs and tokens per step in usage.pardec (streamed:
    on the last chunk). Sampling settings a request leaves out come from the task
    profile, as with `pardec gen` (greedy by default, not OpenAI's temperature 1).

    One request is decoded at a time (a forward pass already uses every core; two at
    once would each run at half speed); the others wait in a queue of --max-queue.
    GET /metrics gives Prometheus metrics.

    \b
    Examples:
      pardec serve                                   embedded model on http://127.0.0.1:8000/v1
      pardec serve -m qwen2.5-0.5b --port 8080 --api-key "$(openssl rand -hex 16)"
      curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
        -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]}'
      pardec gen --server http://127.0.0.1:8000 "Hi"  the warm server generates
      pardec serve --engine vllm -m llama-3.1-70b --tensor-parallel 4 --dry-run

    With --engine vllm, pardec resolves the model and its drafter or heads from its
    store, chooses the method once for --profile (default: chat; vLLM fixes its
    speculative method when it starts) or takes --method/-O, and runs vLLM's own
    OpenAI server (`vllm serve`) with that speculative_config: clients see the same API.
    """
    method, method_opts = split_method(method, method_opts)
    if engine == "vllm":
        run_vllm_serve(model, dtype=dtype, offline=offline, host=host, port=port, api_key=api_key, method=method,
                       options=build_method_options(method, method_opts, draft_model, heads_dir),
                       profile=profile, tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
                       extra=vllm_args, dry_run=dry_run)
        return
    if tensor_parallel or pipeline_parallel or vllm_args or dry_run:
        raise PardecUsageError("--tensor-parallel, --pipeline-parallel, --vllm-arg and --dry-run are for --engine vllm")
    if method != "auto" or method_opts or profile != "auto":
        raise PardecUsageError("with pardec's engine every request chooses its method and profile",
                               hint='name them in the request\'s "pardec" field, e.g. {"pardec": {"method": "pld"}}')
    if host not in LOOPBACK and not api_key:
        click.echo(f"pardec: warning: listening on {host} without --api-key: anyone who can reach this "
                   "machine can use the model", err=True)
    sock = bind(host, port)
    from pardec_cli.serve.app import ServeConfig
    from pardec_cli.session import Session

    config = ServeConfig(api_key=api_key or None, max_queue=max_queue, max_body_bytes=max_body,
                         max_tokens_limit=max_tokens_limit)
    with loading_status("loading model"):
        session = Session.load(model, dtype=dtype, device=device, offline=offline, progress=is_terminal(sys.stderr),
                               compile=compile, notice=compile_notice, weights=weights)
        session.target.warm()  # compile the steps (compiled runner) before the first request waits for them
        warm_up(session)
    run_server(session, config, sock, drain_timeout=drain_timeout, access_log=access_log)


def run_vllm_serve(model: str | None, *, dtype: str, offline: bool | None, host: str, port: int,
                   api_key: str | None, method: str, options: dict[str, object], profile: str,
                   tensor_parallel: int | None, pipeline_parallel: int | None, extra: tuple[str, ...],
                   dry_run: bool) -> None:
    """Plan the method for vLLM and replace this process with `vllm serve` (or print it)."""
    import os
    import shutil

    from pardec_cli.vllm_engine.launch import format_command
    from pardec_cli.vllm_engine.plan import require_vllm, vllm_serve_command

    if not dry_run:
        require_vllm()
    if api_key:
        extra = ("--api-key", api_key, *extra)
    command, plan = vllm_serve_command(
        model, method=method, options=options, profile="chat" if profile == "auto" else profile, host=host,
        port=port, extra=extra, dtype=dtype, offline=offline, tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    for line in plan.reasons:
        click.echo(f"pardec: {line}", err=True)
    shown = format_command(command)
    if api_key:
        shown = shown.replace(api_key, "***")
    if dry_run:
        click.echo(shown)
        return
    click.echo(f"pardec: running {shown}", err=True)
    executable = shutil.which(command[0])
    if executable is None:  # vLLM installed without its script on PATH (another venv's python)
        command = [sys.executable, "-m", "vllm.entrypoints.cli.main", *command[1:]]
        executable = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(executable, command)  # vLLM owns the process from here: signals, exit status


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a clear error (port in use, unknown address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PardecUsageError(f"cannot listen on {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = "stop the other server or pick another --port" if port else None
        raise PardecError(f"cannot listen on {host}:{port}: {exc.strerror}", hint=hint) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def warm_up(session: object) -> None:
    """One short generation, so the first request does not pay for lazy initialisation."""
    ids = session.encode("Hi")  # type: ignore[attr-defined]
    session.generate(ids, max_new_tokens=2)  # type: ignore[attr-defined]


def run_server(session: object, config: object, sock: socket.socket, *, drain_timeout: float,
               access_log: bool) -> None:
    """Run uvicorn on `sock` until Ctrl-C or SIGTERM; then drain, cancel what is left, stop the worker."""
    import uvicorn

    from pardec_cli.serve.app import create_app

    app = create_app(session, config)  # type: ignore[arg-type]
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="info" if access_log else "warning", access_log=access_log,
        timeout_graceful_shutdown=drain_timeout, lifespan="on",
    ))
    click.echo(f"pardec serve: {session.model_name} ({session.dtype}, {session.device}) "  # type: ignore[attr-defined]
               f"at http://{shown}:{port}/v1 - Ctrl-C stops", err=True)
    try:
        server.run(sockets=[sock])
    finally:
        # A second Ctrl-C skips uvicorn's shutdown of the app: stop the worker here too.
        app.state.worker.stop()
