"""Option defaults: flag > PARDEC_<COMMAND>_<OPTION> > config file > built-in default."""

from __future__ import annotations

import json
import os

import pytest

from tests.cli_helpers import invoke


def write_config(text: str) -> None:
    path = os.path.join(os.environ["PARDEC_CONFIG_DIR"], "config.toml")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def settings(command: str = "gen", *, env: dict | None = None) -> dict[str, tuple]:
    result = invoke(["config", "show", command, "--json"], env=env)
    assert result.exit_code == 0, result.stderr
    return {row["option"]: (row["value"], row["source"]) for row in json.loads(result.stdout)["options"]}


def test_built_in_defaults_without_a_config_file():
    s = settings()
    assert s["--max-tokens"] == (256, "default")
    assert s["--method"][1] == "default"


def test_config_file_sets_defaults_for_one_command_and_for_all():
    write_config('dtype = "bfloat16"\n[gen]\nmax-tokens = 64\nmethod = "vanilla"\nstop = ["END"]\n')
    s = settings("gen")
    assert s["--max-tokens"] == (64, "default_map")
    assert s["--method"] == ("vanilla", "default_map")
    assert s["--stop"] == (["END"], "default_map")
    assert s["--dtype"] == ("bfloat16", "default_map")
    bench = settings("bench")
    assert bench["--dtype"] == ("bfloat16", "default_map")  # top-level key
    assert bench["--max-tokens"] == (128, "default")  # the [gen] table is gen's only


def test_environment_beats_the_config_file():
    write_config("[gen]\nmax_tokens = 64\n")
    s = settings("gen", env={"PARDEC_GEN_MAX_TOKENS": "32", "PARDEC_GEN_METHOD": "suffix"})
    assert s["--max-tokens"] == (32, "environment")
    assert s["--method"] == ("suffix", "environment")


def test_flag_beats_environment_and_config():
    """A bad value shows which level won: the flag's good value is used, then the env's bad one."""
    write_config("[gen]\nmax_tokens = 0\n")
    bad_from_config = invoke(["gen", "hi"])
    assert bad_from_config.exit_code == 2 and "max-tokens" in bad_from_config.stderr
    bad_from_env = invoke(["gen", "hi"], env={"PARDEC_GEN_MAX_TOKENS": "-3"})
    assert bad_from_env.exit_code == 2 and "-3" in bad_from_env.stderr
    ok = invoke(["gen", "--method", "nope", "-n", "5", "hi"], env={"PARDEC_GEN_MAX_TOKENS": "-3"})
    assert "-3" not in ok.stderr  # the flag replaced the environment's bad value
    assert "unknown method 'nope'" in ok.stderr


@pytest.mark.parametrize(
    "text, fragment",
    [("[gen\n", "line 1"), ("[nope]\na = 1\n", "[nope] is not a pardec command"), ("[gen]\nmodel = {a = 1}\n", "'gen.model'")],
)
def test_a_broken_config_file_is_one_clear_error_naming_the_file(text, fragment):
    write_config(text)
    result = invoke(["gen", "hi"])
    assert result.exit_code == 2
    assert "config.toml" in result.stderr and fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_config_path_still_works_with_a_broken_file():
    write_config("[gen\n")
    result = invoke(["config", "path"])
    assert result.exit_code == 0
    assert "config.toml" in result.stdout
    assert "warning" in result.stderr


def test_config_path_reports_the_locations(isolated_home):
    result = invoke(["config", "path", "--json"])
    paths = json.loads(result.stdout)
    assert paths["home"] == str(isolated_home)
    assert paths["config_file"].endswith("config.toml")
    assert paths["config_file"].startswith(os.environ["PARDEC_CONFIG_DIR"])


@pytest.mark.parametrize("variable, value, expected", [
    ("HF_HUB_CACHE", "{tmp}/hub-cache", "{tmp}/hub-cache"),
    ("HUGGINGFACE_HUB_CACHE", "{tmp}/legacy-cache", "{tmp}/legacy-cache"),
    (None, None, "{tmp}/hf-home/hub"),
])
def test_config_path_names_the_hf_cache_pardec_uses(tmp_path, monkeypatch, variable, value, expected):
    from pardec_cli.store.resolve import hub_cache_dir

    if variable:
        monkeypatch.setenv(variable, value.format(tmp=tmp_path))
    paths = json.loads(invoke(["config", "path", "--json"]).stdout)
    assert paths["hf_cache"] == expected.format(tmp=tmp_path) == str(hub_cache_dir())


def test_misspelled_keys_are_pointed_out():
    write_config("[gen]\nmax_tokenz = 5\n")
    result = invoke(["config", "show", "gen"])
    assert "'max_tokenz' in the config file is not an option of 'gen'" in result.stderr
