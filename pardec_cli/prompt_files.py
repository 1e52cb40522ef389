"""Prompt files: one JSON prompt per line, in the formats pardec reads everywhere
(`gen --prompts`, `tune --prompts`)."""

from __future__ import annotations

import json
import re
from typing import Any

from pardec_cli.errors import PardecUsageError

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Prompt text the tokenizer can take: what is not valid Unicode becomes U+FFFD.

    The rule, for every way a prompt comes in: bytes that are not UTF-8 (in arguments,
    which Python decodes with surrogateescape, or on stdin) and lone surrogates (a
    ``\\udcXX`` escape in a JSON prompt) are each replaced by the replacement character
    U+FFFD, as a browser or an editor shows them, and the prompt runs."""
    if not _SURROGATE.search(text):
        return text
    try:  # argument bytes that were not UTF-8, kept by surrogateescape: decode them as such
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def tolerant_stdin(stream: Any) -> Any:
    """`stream` (stdin) set to read bytes that are not UTF-8 as U+FFFD instead of failing."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="replace")
        except (ValueError, OSError, TypeError):
            pass
    return stream


def parse_prompt_line(line: str, where: str) -> tuple[str | int | None, str, str | None]:
    """(id, prompt, category) from one JSONL line: Spec-Bench ({"question_id", "category",
    "turns": [first, ...]}; the first turn is used), HumanEval ({"task_id", "prompt"}),
    {"prompt": ..., "id": ...}, or a bare JSON string."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PardecUsageError(f"{where}: not valid JSON ({exc.msg})") from None
    if isinstance(record, str):
        return None, clean_text(record), None
    if not isinstance(record, dict):
        raise PardecUsageError(f"{where}: expected a JSON object or string")
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        text = turns[0]
    elif isinstance(record.get("prompt"), str):
        text = record["prompt"]
    else:
        raise PardecUsageError(f"{where}: expected a \"prompt\" string or a Spec-Bench \"turns\" list")
    ident = next((record[key] for key in ("question_id", "task_id", "id") if isinstance(record.get(key), (str, int))), None)
    category = record.get("category")
    if isinstance(ident, str):
        ident = clean_text(ident)
    return ident, clean_text(text), clean_text(category) if isinstance(category, str) else None
