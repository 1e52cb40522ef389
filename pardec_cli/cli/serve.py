"""`pardec serve`: an OpenAI-compatible HTTP server that keeps one model loaded.

Thin: check the options, bind the socket (a port in use fails before the model
loads), load the model, warm it with one short generation, run uvicorn. The server
itself is `pardec_cli.serve`.
"""

from __future__ import annotations

import socket
import sys

import click

from pardec_cli.cli.options import compile_notice, compile_option, model_options
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
def serve(model: str | None, dtype: str, weights: str, device: str, offline: bool | None, compile: str, host: str, port: int,
          api_key: str | None, max_queue: int, max_body: int, max_tokens_limit: int, drain_timeout: float,
          access_log: bool) -> None:
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
    """
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
