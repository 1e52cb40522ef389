"""The HTTP side: a Starlette app with OpenAI's routes over one `DecodingWorker`.

    GET  /v1/models             the one model this server runs
    POST /v1/chat/completions   chat messages through the model's chat template
    POST /v1/completions        a raw prompt (as `pardec gen --raw`)
    GET  /metrics               Prometheus text format
    GET  /health                {"status": "ok"} once the model is loaded

A request is read (at most `max_body_bytes`), parsed and checked on the event loop,
then queued for the worker. Its response starts only when the worker has prefilled the
prompt, so a request that cannot run (prompt too long for the context, heads missing
for the named method) still gets a 4xx error body, not a broken stream. A client that
disconnects, while waiting or while its reply streams, cancels its generation at the
next decoding step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pardec_cli.serve.metrics import CONTENT_TYPE, ServerMetrics
from pardec_cli.serve.protocol import (
    ApiError,
    GenerationRequest,
    chunk_object,
    completion_object,
    parse_chat,
    parse_completion,
    parse_json,
)
from pardec_cli.serve.worker import DecodingWorker, Delta, Failed, Finished, Job, Started

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOKENS_LIMIT = 4096
DEFAULT_MAX_QUEUE = 64


@dataclass(frozen=True)
class ServeConfig:
    """The server's limits and its API key (None: no key needed)."""

    api_key: str | None = None
    max_queue: int = DEFAULT_MAX_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT


class ClientGone(Exception):
    """The client closed the connection before its reply was ready."""


def create_app(session: Any, config: ServeConfig = ServeConfig(), *,
               worker: DecodingWorker | None = None) -> Starlette:
    """The ASGI app serving `session` (a loaded `pardec_cli.session.Session`).

    The worker thread starts with the app (ASGI lifespan) and is stopped when the app
    shuts down: queued requests are then answered 503 and a running one is cancelled.
    """
    metrics = worker.metrics if worker is not None else ServerMetrics()
    worker = worker or DecodingWorker(session, max_queue=config.max_queue, metrics=metrics)
    model = session.model_name
    expected = f"Bearer {config.api_key}".encode() if config.api_key else None

    def endpoint(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Authentication, OpenAI-shaped errors and the response counter around `handler`."""

        async def wrapped(request: Request) -> Response:
            try:
                if expected is not None:
                    given = request.headers.get("authorization", "").encode()
                    # Constant time: how long the comparison takes says nothing about the key.
                    if not hmac.compare_digest(given, expected):
                        raise ApiError(401, "a valid API key is needed: send 'Authorization: Bearer KEY'",
                                       type="authentication_error", code="invalid_api_key")
                response = await handler(request)
            except ApiError as exc:
                response = JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)
            except ClientGone:
                response = Response(status_code=499)  # nobody reads it; counted as nginx does
            metrics.responses.labels(request.url.path, str(response.status_code)).inc()
            return response

        return wrapped

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "pardec"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model})

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, parse_chat)

    async def completions(request: Request) -> Response:
        return await generate(request, parse_completion)

    async def generate(request: Request, parse: Callable[..., GenerationRequest]) -> Response:
        body = await read_body(request, config.max_body_bytes)
        parsed = parse(parse_json(body), model=model, max_tokens_limit=config.max_tokens_limit)
        job = Job(parsed, asyncio.get_running_loop())
        worker.submit(job)
        disconnected = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            first = await next_event(job, disconnected)
            if isinstance(first, Failed):
                raise first.error
            assert isinstance(first, Started)
            headers = {"x-pardec-method": first.method, "x-pardec-profile": first.profile}
            if parsed.stream:
                disconnected.cancel()  # from here Starlette's StreamingResponse watches the client
                return StreamingResponse(stream_events(job, parsed, model, first), media_type="text/event-stream",
                                         headers={**headers, "cache-control": "no-cache"})
            end = await next_event(job, disconnected)
            if isinstance(end, Failed):
                raise end.error
            assert isinstance(end, Finished)
            headers["x-pardec-tokens-per-step"] = str(end.usage["pardec"]["tokens_per_step"])
            return JSONResponse(completion_object(parsed, model, end.text, end.finish_reason, end.usage),
                                headers=headers)
        except BaseException:
            job.cancel()
            raise
        finally:
            disconnected.cancel()

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = f"no route {request.method} {request.url.path}" if status == 404 else \
            f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse(ApiError(status, message).body, status_code=status)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    routes = [
        Route("/v1/models", endpoint(models), methods=["GET"]),
        Route("/v1/chat/completions", endpoint(chat_completions), methods=["POST"]),
        Route("/v1/completions", endpoint(completions), methods=["POST"]),
        Route("/metrics", endpoint(metrics_route), methods=["GET"]),
        Route("/health", endpoint(health), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.worker = worker
    app.state.metrics = metrics
    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 as soon as it is longer than `limit` bytes."""
    too_large = ApiError(413, f"the request body is larger than {limit} bytes (pardec serve --max-body)",
                         code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise too_large
    return bytes(body)


async def wait_for_disconnect(request: Request) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def next_event(job: Job, disconnected: asyncio.Future) -> Any:
    """The worker's next event for `job`; ClientGone (and the job cancelled) if the client left first."""
    getter = asyncio.ensure_future(job.events.get())
    done, _ = await asyncio.wait({getter, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    job.cancel()
    raise ClientGone


async def stream_events(job: Job, request: GenerationRequest, model: str, started: Started) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.

    pardec's extension field "pardec" (clients that do not know it ignore it): the first
    chunk says which method, knobs and profile decode the reply; each text chunk carries
    the tokens of each decoding step since the previous chunk ("steps") and the running
    statistics ("live"); the last one the whole record (method, stats, finish reason).
    If the client goes away, Starlette cancels this generator: `finally` cancels the job.
    """

    def event(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    try:
        first = chunk_object(request, model, role=True, text="")
        first["pardec"] = {"method": started.method, "knobs": started.knobs, "profile": started.profile}
        yield event(first)
        while True:
            item = await job.events.get()
            if isinstance(item, Delta):
                chunk = chunk_object(request, model, text=item.text)
                chunk["pardec"] = {"steps": list(item.steps), "live": item.live}
                yield event(chunk)
            elif isinstance(item, Finished):
                last = chunk_object(request, model, reason=item.finish_reason)
                last["pardec"] = item.usage["pardec"]
                yield event(last)
                if request.include_usage:
                    yield event(chunk_object(request, model, usage_record=item.usage, choices=False))
                yield "data: [DONE]\n\n"
                return
            elif isinstance(item, Failed):  # not after a start today; kept so a stream always ends
                yield event(item.error.body)
                return
    finally:
        job.cancel()
