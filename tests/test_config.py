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
    assert s["--max-tokens"] == (64, "config_file")
    assert s["--method"] == ("vanilla", "config_file")
    assert s["--stop"] == (["END"], "config_file")
    assert s["--dtype"] == ("bfloat16", "config_file")
    bench = settings("bench")
    assert bench["--dtype"] == ("bfloat16", "config_file")  # top-level key
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


def test_misspelled_keys_are_pointed_out_with_the_closest_names():
    write_config("[gen]\nmax_tokenz = 5\ntmp = 0.3\n")
    result = invoke(["config", "show", "gen"])
    assert "'max_tokenz' is not an option of `pardec gen`; did you mean 'max_tokens'?" in result.stderr
    assert "'tmp' is not an option of `pardec gen`; did you mean 'temp'" in result.stderr
    assert json.loads(invoke(["config", "show", "gen", "--json"]).stdout)["unknown_keys"] == ["max_tokenz", "tmp"]


def test_config_keys_and_variables_are_named_after_the_flags():
    write_config("temp = 0.5\n[gen]\ntop-p = 0.9\n")
    s = settings("gen")
    assert s["--temp"] == (0.5, "config_file") and s["--top-p"] == (0.9, "config_file")
    assert settings("gen", env={"PARDEC_GEN_TEMP": "0.25"})["--temp"] == (0.25, "environment")
    rows = {r["option"]: r for r in json.loads(invoke(["config", "show", "gen", "--json"]).stdout)["options"]}
    assert rows["--temp"]["key"] == "temp" and rows["--temp"]["env"] == "PARDEC_GEN_TEMP"
    assert rows["--max-tokens"]["key"] == "max_tokens" and rows["--max-tokens"]["env"] == "PARDEC_GEN_MAX_TOKENS"


def test_the_old_names_still_work_with_a_one_line_hint():
    write_config("[gen]\ntemperature = 0.5\n")
    result = invoke(["config", "show", "gen", "--json"])
    assert {r["option"]: r["value"] for r in json.loads(result.stdout)["options"]}["--temp"] == 0.5
    assert result.stderr.count("'temperature' is the old name of 'temp'") == 1
    write_config("")
    result = invoke(["config", "show", "gen", "--json"], env={"PARDEC_GEN_TEMPERATURE": "0.7"})
    assert {r["option"]: r["value"] for r in json.loads(result.stdout)["options"]}["--temp"] == 0.7
    assert "PARDEC_GEN_TEMPERATURE is the old name of PARDEC_GEN_TEMP" in result.stderr


def test_a_bad_value_under_a_flag_named_key_names_the_config_file():
    write_config("[gen]\ntemp = nan\n")
    bad = invoke(["gen", "hi"])
    assert bad.exit_code == 2 and "config.toml" in bad.stderr


def test_config_show_reads_like_the_rest_of_the_cli():
    write_config("[gen]\nmax_tokens = 64\n")
    out = invoke(["config", "show", "gen"]).stdout
    assert "default_map" not in out and "None" not in out and "'auto'" not in out
    line = next(line for line in out.splitlines() if line.startswith("--max-tokens"))
    assert line.split()[:3] == ["--max-tokens", "64", "config"] and "PARDEC_GEN_MAX_TOKENS" in line
    model = next(line for line in out.splitlines() if line.startswith("--model "))
    assert model.split()[1] == "-"
