"""Run `pardec serve`'s app on 127.0.0.1 inside the test process, and talk to it raw.

`running_server` loads a model into a Session, builds the app and runs uvicorn on a
free loopback port in a thread (uvicorn installs no signal handlers off the main
thread); leaving the block stops it as a shutdown does (lifespan: the worker stops).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT
    port: int
    model: str
    app: Any

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


@contextlib.contextmanager
def running_server(model_dir: Path | str | None, *, dtype: str = "float32", port: int = 0,
                   **config: Any) -> Iterator[Served]:
    import uvicorn

    from pardec_cli.serve.app import ServeConfig, create_app
    from pardec_cli.session import Session

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))  # first: a port in use fails before the model loads
    session = Session.load(str(model_dir) if model_dir else None, dtype=dtype, device="cpu", offline=True)
    app = create_app(session, ServeConfig(**config))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=10))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{port}", port, session.model_name, app)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def raw_request(served: Served, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict[str, str] | None = None) -> RawResponse:
    """One request with http.client, as curl would send it: bytes on the wire, nothing checked."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return RawResponse(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def metric_samples(served: Served, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple], float]:
    """/metrics parsed with prometheus_client's parser: {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    response = raw_request(served, "GET", "/metrics", headers=headers)
    assert response.status == 200
    samples = {}
    for family in text_string_to_metric_families(response.body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(value for (sample, have), value in samples.items()
               if sample == name and all(item in have for item in labels.items()))
