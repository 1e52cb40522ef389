"""The OpenAI wire format: request bodies in, response objects and chunks out, errors.

Torch-free and session-free: a request is parsed and checked completely here, on the
event loop, before it waits for the decoding worker, so a bad request is answered at
once with an OpenAI-shaped error (`ApiError.body`) and the right 4xx status.

Sampling settings a request leaves out take the task profile's defaults, then the
same built-in defaults as `pardec gen` (greedy, 256 tokens): a request and a `gen`
command with the same prompt and settings are planned and decoded the same way.
OpenAI's own default temperature (1.0) is not copied on purpose: pardec is greedy
unless asked, everywhere.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pardec_cli.errors import PardecError
from pardec_cli.planning import AUTO, Settings

DEFAULT_MAX_TOKENS = 256  # as `pardec gen -n`
MAX_STOP_STRINGS = 4  # as OpenAI's API
CHAT_ROLES = {"system", "developer", "user", "assistant"}
# Parameters clients send with their neutral value; anything else is refused rather
# than silently ignored (a client asking for logprobs must not get a reply without them).
NEUTRAL = {
    "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None), "logprobs": (False, None),
    "top_logprobs": (0, None), "logit_bias": (None,), "tools": (None,), "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}), "echo": (False, None), "best_of": (1, None), "suffix": (None, ""),
    "parallel_tool_calls": (None, False, True),
}
IGNORED = {"user", "metadata", "store", "service_tier", "stream_options", "n"}
COMMON_KEYS = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "pardec"}


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})

    @property
    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @classmethod
    def from_pardec(cls, exc: PardecError) -> ApiError:
        """A PardecError raised while preparing a generation (its message and hint, 400)."""
        from pardec_cli.errors import ContextOverflowError

        message = exc.message + (f" ({exc.hint})" if exc.hint else "")
        if isinstance(exc, ContextOverflowError):
            return cls(400, message, param="messages", code="context_length_exceeded")
        return cls(400, message, code="invalid_value")


@dataclass(frozen=True)
class GenerationRequest:
    """One parsed request: what to generate and how to answer."""

    kind: str  # "chat" or "completion"
    prompt: str | list[dict[str, str]]  # a raw prompt, or chat messages
    plan_text: str  # what the task profile is detected from (the last user message)
    settings: Settings
    user_set: frozenset[str]  # settings the request gave (the others come from the profile)
    method: str = AUTO
    knobs: dict[str, Any] = field(default_factory=dict)
    profile: str = AUTO
    repetition_guard: bool = False  # "pardec": {"repetition_guard": true}, as `pardec chat` asks
    stream: bool = False
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


def parse_chat(data: Mapping[str, Any], *, model: str, max_tokens_limit: int) -> GenerationRequest:
    """A `POST /v1/chat/completions` body."""
    _check_keys(data, COMMON_KEYS | {"messages", "max_completion_tokens", "stream_options"})
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
    messages = []
    for i, message in enumerate(raw_messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(sorted(CHAT_ROLES))}, got {role!r}",
                           param=f"messages[{i}].role")
        content = _content_text(message.get("content"), f"messages[{i}].content")
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise ApiError(400, "'messages' needs at least one user message", param="messages")
    last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if "max_completion_tokens" in data and "max_tokens" not in data:
        data = {**data, "max_tokens": data["max_completion_tokens"]}
    return _request("chat", data, messages, last_user, raw=False, model=model, max_tokens_limit=max_tokens_limit)


def parse_completion(data: Mapping[str, Any], *, model: str, max_tokens_limit: int) -> GenerationRequest:
    """A `POST /v1/completions` body: the prompt goes to the model as is (`pardec gen --raw`)."""
    _check_keys(data, COMMON_KEYS | {"prompt", "stream_options"})
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string (one prompt per request)", param="prompt")
    if not prompt.strip():
        raise ApiError(400, "'prompt' is empty", param="prompt")
    return _request("completion", data, prompt, prompt, raw=True, model=model, max_tokens_limit=max_tokens_limit)


def _request(kind: str, data: Mapping[str, Any], prompt: Any, plan_text: str, *, raw: bool, model: str,
             max_tokens_limit: int) -> GenerationRequest:
    from pardec_cli.engine.sampling_params import SamplingParams

    requested = data.get("model")
    if not isinstance(requested, str) or not requested:
        raise ApiError(400, "'model' is required (GET /v1/models lists it)", param="model")
    if requested != model:
        raise ApiError(404, f"the model {requested!r} does not exist here; this server runs {model!r}",
                       param="model", code="model_not_found")
    if data.get("n", 1) != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    user_set = set()
    max_tokens = DEFAULT_MAX_TOKENS
    if data.get("max_tokens") is not None:
        max_tokens = _number(data, "max_tokens", int, 1, max_tokens_limit)
        user_set.add("max_tokens")
    temperature, top_p = 0.0, 1.0
    if data.get("temperature") is not None:
        temperature = _number(data, "temperature", float, 0.0, 2.0)
        user_set.add("temperature")
    if data.get("top_p") is not None:
        top_p = _number(data, "top_p", float, 0.0, 1.0)
        if top_p == 0:
            raise ApiError(400, "'top_p' must be greater than 0", param="top_p")
        user_set.add("top_p")
    seed = data.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ApiError(400, "'seed' must be an integer", param="seed")
    stop = data.get("stop")
    stops: tuple[str, ...] = ()
    if isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP_STRINGS:
        stops = tuple(stop)
    elif stop is not None:
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOP_STRINGS} strings", param="stop")
    if any(not s for s in stops):
        raise ApiError(400, "'stop' strings must not be empty", param="stop")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", param="stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    include_usage = bool(options.get("include_usage", False))
    method, knobs, profile = parse_extension(data.get("pardec"))
    guard = (data.get("pardec") or {}).get("repetition_guard", False)
    settings = Settings(
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=temperature, top_p=top_p, seed=seed),
        stop=stops, system=None, raw=raw,
    )
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return GenerationRequest(kind, prompt, plan_text, settings, frozenset(user_set), method, knobs, profile,
                             guard, stream, include_usage, id=f"{prefix}-{uuid.uuid4().hex[:24]}")


def parse_extension(ext: Any) -> tuple[str, dict[str, Any], str]:
    """`"pardec": {"method": ..., "knobs": {...}, "profile": ...}` -> (method, knobs, profile), checked.

    Checked without torch: the method must exist and the knobs must be its own (a knob
    value may be a JSON value or a string, as `-O` gives it). A "repetition_guard"
    (true: end a reply caught in a loop, as `pardec chat` does) is checked here too.
    """
    if ext is None:
        return AUTO, {}, AUTO
    if not isinstance(ext, dict):
        raise ApiError(400, "'pardec' must be an object: {\"method\": ..., \"knobs\": {...}, \"profile\": ...}",
                       param="pardec")
    unknown = sorted(set(ext) - {"method", "knobs", "profile", "repetition_guard"})
    if unknown:
        raise ApiError(400, f"'pardec' has no field {unknown[0]!r} (fields: method, knobs, profile, repetition_guard)",
                       param=f"pardec.{unknown[0]}")
    if not isinstance(ext.get("repetition_guard", False), bool):
        raise ApiError(400, "'pardec.repetition_guard' must be true or false", param="pardec.repetition_guard")
    method = ext.get("method", AUTO)
    knobs = ext.get("knobs") or {}
    profile = ext.get("profile", AUTO)
    if not isinstance(method, str) or not isinstance(knobs, dict) or not isinstance(profile, str):
        raise ApiError(400, "'pardec.method' and 'pardec.profile' must be strings, 'pardec.knobs' an object",
                       param="pardec")
    try:
        from pardec_cli.methods.options import resolve_options
        from pardec_cli.methods.registry import AUTO_OPTIONS, get_spec

        if method == AUTO:
            if set(knobs) - {option.name for option in AUTO_OPTIONS}:
                raise ApiError(400, "with method auto the knobs are chosen too (its own: adapt); name a method to "
                               "set them", param="pardec.knobs")
            resolve_options(AUTO, AUTO_OPTIONS, knobs)
        else:

            spec = get_spec(method)
            if "+" not in method:  # a combination routes its knobs to its parts when it is built
                resolve_options(method, spec.options, knobs)
        if profile != AUTO:
            from pardec_cli.selection.profiles import get_profile

            get_profile(profile)
    except PardecError as exc:
        raise ApiError(400, exc.message, param="pardec", code="invalid_value") from None
    return method, dict(knobs), profile


def _check_keys(data: Mapping[str, Any], allowed: set[str]) -> None:
    for key, value in data.items():
        if key in allowed or key in IGNORED:
            continue
        if key in NEUTRAL:
            if not any(value is v or (value == v and type(value) is type(v)) for v in NEUTRAL[key]):
                raise ApiError(400, f"'{key}' is not supported by pardec serve (leave it out)", param=key,
                               code="unsupported_parameter")
            continue
        raise ApiError(400, f"unrecognized request argument '{key}'", param=key, code="unknown_parameter")


def _content_text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}: only text parts are supported", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"{where} must be a string", param=where)


def _number(data: Mapping[str, Any], key: str, kind: type, low: float, high: float) -> Any:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ApiError(400, f"'{key}' must be {'an integer' if kind is int else 'a number'}", param=key)
    if not low <= value <= high:
        raise ApiError(400, f"'{key}' must be between {low:g} and {high:g}, got {value}", param=key,
                       code="invalid_value")
    return kind(value)


# -- responses ------------------------------------------------------------------------

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


def finish_reason(reason: str | None) -> str | None:
    """pardec's finish reason in OpenAI's words (eos and stop strings are both "stop")."""
    return FINISH_REASONS.get(reason or "", reason)


def usage(prompt_tokens: int, completion_tokens: int, pardec: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's usage object, with pardec's own figures (method, tokens per step...) under "pardec"."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "pardec": dict(pardec)}


def completion_object(request: GenerationRequest, model: str, text: str, reason: str | None,
                      usage_record: Mapping[str, Any]) -> dict[str, Any]:
    """The non-streamed response body."""
    if request.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish_reason(reason)}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(reason)}
        kind = "text_completion"
    return {"id": request.id, "object": kind, "created": request.created, "model": model, "choices": [choice],
            "usage": dict(usage_record)}


def chunk_object(request: GenerationRequest, model: str, *, text: str | None = None, role: bool = False,
                 reason: str | None = None, usage_record: Mapping[str, Any] | None = None,
                 choices: bool = True) -> dict[str, Any]:
    """One server-sent event of a streamed response (OpenAI's chunk format)."""
    chunk: dict[str, Any] = {"id": request.id, "created": request.created, "model": model}
    if request.kind == "chat":
        chunk["object"] = "chat.completion.chunk"
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason(reason)}]
    else:
        chunk["object"] = "text_completion"
        chunk["choices"] = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason(reason)}]
    if not choices:
        chunk["choices"] = []
    if usage_record is not None:
        chunk["usage"] = dict(usage_record)
    elif request.include_usage:
        chunk["usage"] = None
    return chunk
