"""Shell completion: the committed scripts are current, and the completion protocol
(Click's `_PARDEC_COMPLETE` environment variable) answers with commands, options,
method names and model names, without importing torch or transformers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pardec_cli.cli.completion import COMPLETE_VAR, SCRIPT_FILES, SHELLS, completion_script
from pardec_cli.cli.main import run
from pardec_cli.home import models_dir
from pardec_cli.methods.registry import method_names
from pardec_cli.store.catalog import load_catalog
from pardec_cli.store.layout import MARKER_NAME
from tests.cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]


# -- the scripts --------------------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_committed_script_is_what_pardec_completion_prints(shell):
    committed = ROOT / SCRIPT_FILES[shell]
    assert committed.is_file(), f"missing {SCRIPT_FILES[shell]}: run `pardec completion {shell} > {SCRIPT_FILES[shell]}`"
    printed = invoke(["completion", shell])
    assert printed.exit_code == 0 and printed.stderr == ""
    assert printed.stdout == completion_script(shell)
    assert committed.read_text(encoding="utf-8") == printed.stdout, (
        f"{SCRIPT_FILES[shell]} is stale: run `pardec completion {shell} > {SCRIPT_FILES[shell]}`"
    )
    assert COMPLETE_VAR in printed.stdout and "pardec" in printed.stdout


def test_completion_for_an_unknown_shell_is_a_usage_error():
    result = invoke(["completion", "tcsh"])
    assert result.exit_code == 2
    assert "'tcsh' is not one of" in result.stderr


# -- the protocol, in process ---------------------------------------------------------------


def complete(line: str, shell: str = "bash") -> list[str]:
    """What `pardec` answers when the shell asks to complete `line` (cursor at its end)."""
    words = line.split(" ")
    # bash and zsh pass the index of the word under the cursor; fish passes the word itself.
    cword = words[-1] if shell == "fish" else str(len(words) - 1)
    env = {COMPLETE_VAR: f"{shell}_complete", "COMP_WORDS": line, "COMP_CWORD": cword}
    runner = CliRunner()
    with runner.isolation(env=env) as (out, _err, _mixed):
        with pytest.raises(SystemExit) as done:
            run([])
    assert done.value.code == 0
    return out.getvalue().decode().splitlines()


def values(answer: list[str]) -> list[str]:
    """The values of bash's `type,value` answer lines."""
    return [line.split(",", 1)[1] for line in answer]


@pytest.fixture
def installed():
    """Two complete models in the (test's own) store, plus things that must not be offered."""
    root = models_dir()
    for name in ("my-tiny", "my-small"):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}")
        (root / name / MARKER_NAME).write_text("{}")
    (root / "half-converted").mkdir()
    (root / "half-converted" / "config.json").write_text("{}")
    (root / ".my-tiny.tmp-1234").mkdir()
    return ["my-small", "my-tiny"]


def test_commands_complete():
    got = values(complete("pardec "))
    assert {"gen", "bench", "methods", "completion"} <= set(got)
    assert values(complete("pardec ge")) == ["gen"]


def test_options_complete():
    assert {"--json", "--jsonl"} == set(values(complete("pardec gen --js")))
    assert "--each-line" in values(complete("pardec gen --"))


def test_method_names_come_from_the_registry():
    assert values(complete("pardec gen --method ")) == ["auto", *method_names()]
    assert values(complete("pardec gen --method la")) == ["layerskip"]


def test_model_names_are_installed_models_then_catalog_aliases(installed):
    got = values(complete("pardec gen -m "))
    assert got[:2] == installed
    assert got[2:] == [alias for alias in load_catalog() if alias not in installed]
    assert "smollm2-135m" in got
    assert "half-converted" not in got and not any(name.startswith(".") for name in got)
    assert values(complete("pardec gen --model my-t")) == ["my-tiny"]
    assert values(complete("pardec gen --method draft --draft-model my-s")) == ["my-small"]
    assert values(complete("pardec bench -m my-")) == installed


def test_pulled_models_complete_too(installed):
    from pardec_cli.store.records import PullRecord, RepoRecord, save

    save(PullRecord(name="Org/Pulled-Model", target=RepoRecord("Org/Pulled-Model", "main", "0" * 40, "/cache")))
    assert values(complete("pardec gen -m ")).index("Org/Pulled-Model") == len(installed)
    assert complete("pardec gen -m Org/", shell="fish") == ["plain,Org/Pulled-Model\tpulled"]


def test_a_path_completes_as_directories():
    assert complete("pardec gen -m ./") == ["dir,./"]


def test_a_broken_user_catalog_still_completes_installed_models(installed, monkeypatch, tmp_path):
    config = tmp_path / "pardec-config"
    config.mkdir(exist_ok=True)
    (config / "catalog.toml").write_text("this is [not toml")
    assert values(complete("pardec gen -m ")) == installed


def test_zsh_and_fish_answers(installed):
    assert complete("pardec gen --method la", shell="zsh") == ["plain", "layerskip", "_"]
    # zsh and fish show a description next to each model name.
    assert complete("pardec gen -m my-t", shell="zsh") == ["plain", "my-tiny", "installed"]
    assert complete("pardec gen -m my-t", shell="fish") == ["plain,my-tiny\tinstalled"]
    smollm2 = complete("pardec gen -m smollm2-360", shell="fish")
    assert smollm2 == [f"plain,smollm2-360m\t{load_catalog()['smollm2-360m'].description}"]


def test_shell_names_complete_for_the_completion_command():
    assert values(complete("pardec completion ")) == list(SHELLS)


# -- the protocol, in a real process ----------------------------------------------------------

REAL_PROCESS = r"""
import json, os, sys
from pardec_cli.cli.main import main
line = sys.argv[1]
os.environ.update({"_PARDEC_COMPLETE": "bash_complete", "COMP_WORDS": line, "COMP_CWORD": str(line.count(" "))})
try:
    main([])
finally:
    print("HEAVY " + json.dumps(sorted(m for m in ("torch", "transformers") if m in sys.modules)))
"""


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("line", ["pardec ", "pardec gen --method ", "pardec gen -m my"])
def test_real_process_answers_without_importing_torch(installed, line):
    done = subprocess.run([sys.executable, "-c", REAL_PROCESS, line], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *answer, heavy = done.stdout.splitlines()
    assert heavy == "HEAVY []", "completion must not import torch or transformers"
    expected = {"pardec ": "plain,gen", "pardec gen --method ": "plain,layerskip", "pardec gen -m my": "plain,my-tiny"}
    assert expected[line] in answer


def test_profile_names_complete_with_the_users_own():
    from pardec_cli.selection.profiles import user_profiles_dir

    assert values(complete("pardec gen -P ")) == ["auto", "code", "chat", "extraction"]
    user_profiles_dir().mkdir(parents=True)
    (user_profiles_dir() / "math.toml").write_text("")
    assert values(complete("pardec bench --profile m")) == ["math"]


# -- --install --------------------------------------------------------------------------------


@pytest.mark.parametrize(("shell", "where"), [
    ("bash", ".local/share/bash-completion/completions/pardec"),
    ("zsh", ".zfunc/_pardec"),
    ("fish", ".config/fish/completions/pardec.fish"),
])
def test_install_writes_the_script_where_the_shell_looks_and_is_idempotent(shell, where, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    first = invoke(["completion", "--install", shell])
    assert first.exit_code == 0, first.stderr
    target = tmp_path / where
    assert target.read_text(encoding="utf-8") == completion_script(shell)
    assert f"{shell} completion installed: {target}" in first.stdout
    again = invoke(["completion", "--install", shell])
    assert again.exit_code == 0 and f"{shell} completion already up to date: {target}" in again.stdout
    target.write_text("# an old script\n", encoding="utf-8")
    assert "updated" in invoke(["completion", "--install", shell]).stdout
    assert target.read_text(encoding="utf-8") == completion_script(shell)


def test_install_follows_xdg_folders_and_the_shell_in_SHELL(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("SHELL", "/usr/bin/fish")
    result = invoke(["completion", "--install"])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "cfg" / "fish" / "completions" / "pardec.fish").is_file()


def test_zsh_install_says_how_to_put_the_folder_on_fpath(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert "fpath=(~/.zfunc $fpath)" in invoke(["completion", "--install", "zsh"]).stdout
    (tmp_path / ".zshrc").write_text("fpath=(~/.zfunc $fpath)\nautoload -Uz compinit; compinit\n")
    assert "fpath" not in invoke(["completion", "--install", "zsh"]).stdout


def test_install_without_a_known_shell_asks_for_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SHELL", "/bin/tcsh")
    result = invoke(["completion", "--install"])
    assert result.exit_code == 2 and "pardec completion --install bash" in result.stderr
    assert invoke(["completion"]).exit_code == 2
