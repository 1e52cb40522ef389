"""The house rules that a reviewer should not have to check by eye, run with the suite
(so the README's test command, which CI runs, fails on them):

- import-linter: the layers (engine <- methods <- selection/planning <- bench/tuning <-
  session <- tui/serve <- cli; store, hardware and helpers are leaves; decoding never
  reads the store). Contracts in pyproject.toml, [tool.importlinter].
- ruff: errors, not taste (syntax, pyflakes, cheap bugbear checks); [tool.ruff].
- mypy: the typed modules listed in [tool.mypy], leniently.
- the engine never names a command-line flag in an error (front ends word remedies).

The tools come with the `test` extra (pip install -e '.[test]'). Together they take a
few seconds (mypy keeps a cache in .mypy_cache).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_tool(*command: str) -> None:
    """Run a lint tool from the repository root on this checkout; fail with its output."""
    if shutil.which(command[0]) is None:
        pytest.fail(f"{command[0]} is not installed: pip install -e '.[test]'")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"


def test_imports_follow_the_layers() -> None:
    run_tool("lint-imports", "--no-cache")


def test_ruff_finds_no_errors() -> None:
    run_tool("ruff", "check", "--no-cache", "pardec_cli", "tests", "devtools")


def test_the_typed_modules_type_check() -> None:
    run_tool("mypy")


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


def raised_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal inside a `raise` statement of `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Raise):
            for part in ast.walk(node):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found.append((part.lineno, part.value))
    return found


def test_the_engine_names_no_command_line_flag_in_its_errors() -> None:
    flagged = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in sorted((ROOT / "pardec_cli" / "engine").glob("*.py"))
        for line, text in raised_texts(path)
        if FLAG.search(text)
    ]
    assert flagged == [], "raise a typed error with data and word it in the CLI (cli.main.cli_words):\n" + "\n".join(flagged)
