"""Prompts to tune on: the built-in sets (written for pardec, one per profile) or a file.

The built-in sets live in ``pardec_cli/data/tune_prompts/<profile>.jsonl`` (package
data, so a wheel install has them), one ``{"id", "prompt"}`` object per line. They are
not benchmark data: tuning on the benchmark would make the benchmark say nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pardec_cli.errors import PardecUsageError


@dataclass(frozen=True)
class TunePrompt:
    """One tuning prompt: an id (stable across runs, for resuming) and its text."""

    prompt_id: str
    text: str


def builtin_prompts(profile: str) -> list[TunePrompt]:
    """The built-in prompt set of `profile` (empty for a profile that has none: a user's own)."""
    entry = resources.files("pardec_cli").joinpath("data", "tune_prompts", f"{profile}.jsonl")
    if not entry.is_file():
        return []
    return _parse(entry.read_text(encoding="utf-8").splitlines(), f"built-in tune_prompts/{profile}.jsonl")


def file_prompts(path: Path) -> list[TunePrompt]:
    """Prompts from a JSONL file in any format `pardec gen --prompts` reads."""
    try:
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()  # clean_text's rule
    except OSError as exc:
        raise PardecUsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    prompts = _parse(lines, str(path))
    if not prompts:
        raise PardecUsageError(f"{path} holds no prompts")
    return prompts


def _parse(lines: list[str], source: str) -> list[TunePrompt]:
    from pardec_cli.prompt_files import parse_prompt_line

    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ident, text, _category = parse_prompt_line(line, f"{source}:{number}")
        prompts.append(TunePrompt(str(ident if ident is not None else number), text))
    return prompts
