"""Run the `pardec` CLI in-process through Click's CliRunner, error boundary included.

`CliRunner.invoke(cli, ...)` would bypass `pardec_cli.cli.main.run`, the one place where
errors become messages and exit codes, so tests call `run()` inside the runner's
isolation (its stdin, stdout, stderr and environment) instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from click.testing import CliRunner

from pardec_cli.cli.main import run


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def invoke(args: Sequence[str], *, input: str | None = None, env: Mapping[str, str] | None = None) -> CliResult:
    """Run `pardec ARGS...` with `input` on stdin; capture exit code, stdout and stderr."""
    runner = CliRunner()
    with runner.isolation(input=input, env=dict(env or {})) as (out, err, _mixed):
        code = run(list(args))
    return CliResult(code, out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace"))
