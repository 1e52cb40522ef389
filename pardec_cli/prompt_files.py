"""Prompt files: one JSON prompt per line, in the formats pardec reads everywhere
(`gen --prompts`, `tune --prompts`)."""

from __future__ import annotations

import json

from pardec_cli.errors import PardecUsageError


def parse_prompt_line(line: str, where: str) -> tuple[str | int | None, str, str | None]:
    """(id, prompt, category) from one JSONL line: Spec-Bench ({"question_id", "category",
    "turns": [first, ...]}; the first turn is used), HumanEval ({"task_id", "prompt"}),
    {"prompt": ..., "id": ...}, or a bare JSON string."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PardecUsageError(f"{where}: not valid JSON ({exc.msg})") from None
    if isinstance(record, str):
        return None, record, None
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
    return ident, text, category if isinstance(category, str) else None
