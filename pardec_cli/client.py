"""A small client for a running `pardec serve` (what `gen --server` and `chat --server` use).

Standard library only (urllib): the CLI must not need an HTTP package to talk to its
own server. Errors become `PardecError`s with the server's own message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from pardec_cli.errors import PardecError

API_KEY_ENV = "PARDEC_SERVE_API_KEY"  # the key `pardec gen/chat --server` send (`pardec serve --api-key` reads it too)


class ServerClient:
    """Talks to the server at `url` (http://host:port, with or without /v1)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 600.0) -> None:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            url = f"http://{url}"
        self.base = url if url.endswith("/v1") else f"{url}/v1"
        self.api_key = api_key
        self.timeout = timeout

    def _open(self, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base + path, data=data, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)  # noqa: S310 - a URL the user gave
        except urllib.error.HTTPError as exc:
            raise PardecError(f"the server answered {exc.code}: {_error_message(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PardecError(f"cannot reach the server at {self.base}: {reason}",
                              hint="start one with `pardec serve`, or check --server") from None

    def model(self) -> str:
        """The id of the model the server runs."""
        with self._open("/models") as response:
            data = json.load(response)
        try:
            return data["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            raise PardecError(f"{self.base}/models lists no model: is this a pardec server?") from None

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST `body` with stream=true; yield each server-sent event's JSON until [DONE].

        Closing the generator early closes the connection, which cancels the
        generation on the server at its next step.
        """
        response = self._open(path, {**body, "stream": True})
        try:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    return
                event = json.loads(payload)
                if "error" in event:
                    raise PardecError(f"the server failed: {event['error'].get('message')}")
                yield event
        finally:
            response.close()


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read())["error"]["message"]
    except (ValueError, KeyError, TypeError, OSError):
        return exc.reason if isinstance(exc.reason, str) else "no details"
