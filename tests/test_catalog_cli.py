"""Browsing what can be pulled: `pardec list --available` and `pardec show ALIAS` for a
catalog entry that is not on this machine; every hint names a command that works."""

from __future__ import annotations

import json
import re

import pytest

from pardec_cli.store.catalog import accelerator_noun, parse_catalog, parse_parameter_count
from tests.cli_helpers import invoke
from tests.fake_hub import FakeHub, fake_hub, tiny_repos  # noqa: F401 (fixtures)


def test_the_catalog_lists_every_alias_with_its_size_and_what_it_brings() -> None:
    result = invoke(["list", "--available"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ALIAS", "PARAMS", "DOWNLOAD", "HERE", "ACCELERATORS"]
    rows = {line.split()[0]: line for line in lines[1:] if line and not line.startswith(("DOWNLOAD", "`"))}
    assert {"smollm2-135m", "qwen2.5-7b", "llama3.1-8b", "vicuna-7b"} <= set(rows)
    # 7.62B parameters at 16 bits: about 15.2 GB to download.
    assert re.search(r"qwen2\.5-7b\s+7\.62B\s+~15\.2 GB\s+-\s+drafters qwen2\.5-0\.5b, qwen2\.5-1\.5b", rows["qwen2.5-7b"])
    assert rows["llama3.1-8b"].endswith("drafter llama3.2-1b; heads EAGLE, EAGLE-3")
    assert "heads Medusa, EAGLE" in rows["vicuna-7b"]
    assert re.search(r"smollm2-135m\s+135M\s+~270 MB", rows["smollm2-135m"])
    assert max(len(line) for line in lines) <= 120  # no wrapping in a 120-column terminal
    assert "`pardec pull ALIAS`" in result.stdout and "`pardec show ALIAS`" in result.stdout


def test_the_catalog_as_json_says_what_is_installed(fake_hub: FakeHub) -> None:
    before = {row["alias"]: row for row in json.loads(invoke(["list", "--available", "--json"]).stdout)}
    assert before["tiny"]["installed"] is None
    assert [a["installed"] for a in before["tiny"]["accelerators"]] == [False, False, False]
    assert invoke(["pull", "tiny"]).exit_code == 0

    after = {row["alias"]: row for row in json.loads(invoke(["list", "--available", "--json"]).stdout)}
    tiny = after["tiny"]
    assert tiny["installed"] == "pulled" and tiny["size_bytes"] > 0 and tiny["repo"] == "test-org/tiny-target"
    kinds = {a["kind"]: a for a in tiny["accelerators"]}
    assert set(kinds) == {"drafter", "medusa", "eagle"}
    assert kinds["drafter"]["name"] == "tiny-draft" and kinds["drafter"]["installed"] is True
    # The drafter came with tiny (no pull record of its own): its files are in the cache.
    assert after["tiny-draft"]["installed"] == "in the Hugging Face cache"
    assert after["tiny2"]["installed"] is None
    text = invoke(["list", "--available"]).stdout
    assert re.search(r"^tiny2 .*drafter tiny-draft\*", text, re.M)  # * = already here


def test_show_describes_a_catalog_entry_that_is_not_installed() -> None:
    result = invoke(["show", "qwen2.5-7b"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Qwen/Qwen2.5-7B-Instruct" in out and "7.62B" in out and "~15.2 GB to download" in out
    assert "no: `pardec pull qwen2.5-7b` downloads it" in out
    assert "drafter: qwen2.5-0.5b (Qwen/Qwen2.5-0.5B-Instruct)  --method draft" in out

    info = json.loads(invoke(["show", "llama3.1-8b", "--json"]).stdout)
    assert info["installed"] is None and info["parameters"] == 8_030_000_000
    assert [a["method"] for a in info["accelerators"]] == ["draft", "eagle", "eagle3"]


def test_show_of_a_name_that_is_no_alias_is_still_an_error_with_a_working_hint() -> None:
    result = invoke(["show", "no-such-model-xyz"])
    assert result.exit_code == 1
    assert "unknown model 'no-such-model-xyz'" in result.stderr
    assert "`pardec list --available`" in result.stderr
    assert invoke(["list", "--available"]).exit_code == 0


def test_the_empty_store_hint_points_at_commands_that_work() -> None:
    result = invoke(["list"])
    assert result.exit_code == 0 and "`pardec list --available`" in result.stderr
    for command in re.findall(r"`pardec ([^`]+)`", result.stderr):
        args = [a if a != "ALIAS" else "qwen2.5-0.5b" for a in command.split()]
        if args[0] == "pull":
            continue  # would download: `show` of the same alias stands in for it
        assert invoke(args).exit_code == 0, command
    assert invoke(["show", "qwen2.5-0.5b"]).exit_code == 0


def test_pull_help_sends_users_to_the_catalog() -> None:
    assert "pardec list --available" in invoke(["pull", "--help"]).stdout


@pytest.mark.parametrize(("text", "count"), [("1.71B", 1_710_000_000), ("135M", 135_000_000), ("68m", 68_000_000),
                                             ("", None), ("big", None), ("0B", None)])
def test_parameter_counts_read_like_model_cards(text: str, count: int | None) -> None:
    assert parse_parameter_count(text) == count


def test_a_catalog_with_an_unreadable_parameter_count_is_an_error() -> None:
    from pardec_cli.errors import PardecError

    with pytest.raises(PardecError, match="'params' must read like"):
        parse_catalog('[models.x]\nrepo = "a/b"\nfamily = "llama"\nparams = "lots"\n')


def test_accelerator_kinds_are_named_as_people_say_them() -> None:
    assert accelerator_noun("drafter", article=True) == "a drafter"
    assert accelerator_noun("eagle", article=True) == "EAGLE heads"  # not "a eagle"
    assert accelerator_noun("medusa", article=True) == "Medusa heads"
    assert accelerator_noun("eagle3") == "EAGLE-3 heads"
