"""Every `pardec` command the README shows is a real command with real flags, and the
ones that run in a moment here (no download, no server, no long benchmark) run as
written. The generation commands run on a tiny random model installed in place of the
embedded one, so they take well under a second each.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from tests.cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The `pardec ...` lines of the README's bash blocks (the quick start's set-up
    commands aside: CI runs those), comments and pipes cut off."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = text.split("<!-- quickstart:begin -->", 1)[0] + text.split("<!-- quickstart:end -->", 1)[1]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if "| pardec " in line:
                line = "pardec " + line.split("| pardec ", 1)[1]
            line = line.split(" | ", 1)[0].strip()
            if line.startswith("pardec "):
                commands.append(line)
    return commands


def args_of(command: str) -> list[str]:
    return shlex.split(command)[1:]


# Commands that would download, serve, measure for minutes or change this machine's
# models: checked for their command and flags only.
NOT_RUN = ("pull ", "rm ", "serve", "tune --budget", "bench", "import ", "chat", "--server", "doctor", "-m qwen")


def test_the_readme_shows_the_commands_a_newcomer_needs() -> None:
    commands = readme_commands()
    for needed in ("pardec gen", "pardec chat", "pardec list --available", "pardec pull", "pardec serve",
                   "pardec tune", "pardec bench", "pardec completion --install", "pardec config show"):
        assert any(c.startswith(needed) for c in commands), needed


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_exists_with_those_flags(command: str) -> None:
    # --help after the arguments: Click parses every flag first (an unknown one is a
    # usage error), then prints the help instead of running.
    result = invoke([*args_of(command), "--help"])
    assert result.exit_code == 0, f"{command}: {result.stderr}"


def test_the_readme_commands_that_run_here_run_as_written(tiny_as_embedded: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("HOME", str(tmp_path))  # `completion --install` writes under it
    monkeypatch.setenv("SHELL", "/bin/bash")
    # The tune commands run as written, with a user's config that keeps them short here:
    # eager steps and 16 tokens a run (compiled tunes are tests/test_tune.py's; these two
    # took 72 s and 125 s of the suite with the defaults).
    config = Path(os.environ["PARDEC_CONFIG_DIR"]) / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[tune]\ncompile = "off"\nmax_tokens = 16\n', encoding="utf-8")
    ran = []
    for command in readme_commands():
        if any(part in command for part in NOT_RUN):
            continue
        result = invoke(args_of(command), input="")
        assert result.exit_code == 0, f"{command}: {result.stderr}"
        ran.append(command)
    assert any(c.startswith("pardec gen") for c in ran) and any(c.startswith("pardec list") for c in ran)


def test_the_readme_python_example_runs_as_written(tiny_as_embedded: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## From Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), "README.md", "exec"), {})
    from pardec_cli.api import methods

    assert out.getvalue().split()[-2] in methods()  # the reply, then its method and its rate
    float(out.getvalue().split()[-1])
