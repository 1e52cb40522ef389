"""`pardec gen` through the CLI's error boundary: prompts from arguments and stdin,
stats and JSON output, stop strings, seeds, and one clear line for every bad input.

Runs the embedded SmolLM2-135M model with few new tokens (a second or two per call).
"""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import invoke

pytestmark = pytest.mark.real_model


@pytest.fixture(autouse=True)
def use_embedded_store(embedded_pardec_home, monkeypatch):
    monkeypatch.setenv("PARDEC_HOME", str(embedded_pardec_home))


def gen_json(*args: str, input: str | None = None) -> dict:
    result = invoke(["gen", "--json", "--dtype", "float32", *args], input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def assert_one_clear_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code
    assert result.stdout == ""
    assert result.stderr.startswith("pardec: error: ") or result.stderr.startswith("Usage:"), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


# -- prompts ------------------------------------------------------------------------


def test_prompt_from_arguments_streams_the_reply_to_stdout():
    result = invoke(["gen", "-n", "8", "--method", "vanilla", "What", "is", "2+2?"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip()
    assert result.stdout.endswith("\n")
    assert result.stderr == "", "nothing on stderr unless asked (no spinner off a terminal)"


def test_stdin_is_appended_after_the_argument_prompt():
    piped = gen_json("-n", "6", "Translate to French:", input="Good morning, my friend.")
    joined = gen_json("-n", "6", "Translate to French:\nGood morning, my friend.")
    assert piped["stats"]["prompt_tokens"] == joined["stats"]["prompt_tokens"]
    assert piped["text"] == joined["text"]


def test_dash_reads_the_prompt_from_stdin_alone():
    from_stdin = gen_json("-n", "6", "-", input="Name three colours.")
    from_args = gen_json("-n", "6", "Name three colours.")
    assert from_stdin["text"] == from_args["text"]


def test_raw_skips_the_chat_template():
    templated = gen_json("-n", "2", "Hello")
    raw = gen_json("-n", "2", "--raw", "Hello")
    assert raw["stats"]["prompt_tokens"] < templated["stats"]["prompt_tokens"]


def test_system_prompt_goes_into_the_template():
    # SmolLM2's template inserts its own default system prompt, which -s replaces.
    plain = gen_json("-n", "2", "Hello")
    short = gen_json("-n", "2", "-s", "Be brief.", "Hello")
    long = gen_json("-n", "2", "-s", "Be brief. Answer in French, in one sentence, politely.", "Hello")
    assert short["stats"]["prompt_tokens"] != plain["stats"]["prompt_tokens"]
    assert long["stats"]["prompt_tokens"] > short["stats"]["prompt_tokens"]


# -- output -------------------------------------------------------------------------


def test_stats_go_to_stderr_and_stdout_holds_only_the_text():
    plain = invoke(["gen", "-n", "8", "--dtype", "float32", "Count to five."])
    with_stats = invoke(["gen", "-n", "8", "--dtype", "float32", "--stats", "Count to five."])
    assert with_stats.exit_code == 0
    assert with_stats.stdout == plain.stdout
    for label in ("method", "tok/s", "first token", "tokens per step", "drafted tokens accepted"):
        assert label in with_stats.stderr


def test_json_record_has_text_method_stats_and_finish_reason():
    record = gen_json("-n", "5", "--method", "pld", "-O", "num_draft=4", "Say hi.")
    assert record["method"] == "pld"
    assert record["knobs"]["num_draft"] == 4
    assert record["model"] == "smollm2-135m"
    assert record["dtype"] == "float32"
    assert record["finish_reason"] == "length"
    stats = record["stats"]
    assert stats["generated_tokens"] == 5
    for key in ("ttft_s", "tokens_per_s", "steps", "mean_tokens_per_step", "acceptance_rate"):
        assert key in stats


def test_stop_string_ends_the_reply_and_is_not_printed():
    full = gen_json("-n", "40", "--method", "vanilla", "Write a short poem about the sea.")["text"]
    words = full.split()
    assert len(words) > 6
    stop = words[4]  # a word in the middle of the reply, possibly spanning tokens
    cut = gen_json("-n", "40", "--method", "pld", "--stop", stop, "Write a short poem about the sea.")
    assert cut["text"] == full[: full.index(stop)]
    assert cut["finish_reason"] == "stop"


def test_same_seed_same_sample_and_different_seeds_differ():
    args = ["-n", "12", "--temp", "1.0", "--method", "pld", "Tell me a story."]
    first = gen_json("--seed", "7", *args)["text"]
    assert gen_json("--seed", "7", *args)["text"] == first
    assert gen_json("--seed", "8", *args)["text"] != first  # 12 tokens at temperature 1: never equal by chance


# -- bad input: one clear line, no traceback ------------------------------------------


def test_empty_prompt_is_a_usage_error():
    assert_one_clear_error(invoke(["gen"], input=""), 2, "empty prompt")
    assert_one_clear_error(invoke(["gen", "  "], input="\n"), 2, "empty prompt")


def test_unknown_method_names_the_close_match():
    assert_one_clear_error(invoke(["gen", "--method", "pldd", "hi"]), 2, "unknown method 'pldd'", "did you mean 'pld'")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-O", "nope=1"], "nope"),
        (["-O", "num_draft=many"], "num_draft"),
        (["-O", "num_draft"], "NAME=VALUE"),
        (["-O", "min_ngram=4"], "min_ngram"),
    ],
)
def test_bad_method_knobs_are_usage_errors(args, fragment):
    assert_one_clear_error(invoke(["gen", "--method", "pld", *args, "hi"]), 2, fragment)


@pytest.mark.parametrize(
    "args",
    [["--temp", "-1"], ["--top-p", "0"], ["-n", "0"], ["--dtype", "float8"], ["--no-such-flag"]],
)
def test_bad_options_are_usage_errors(args):
    result = invoke(["gen", *args, "hi"])
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr
    assert "Error" in result.stderr or "error" in result.stderr


def test_draft_model_needs_the_draft_method():
    assert_one_clear_error(invoke(["gen", "--method", "pld", "--draft-model", "x", "hi"]), 2, "--draft-model")


def test_missing_model_is_a_runtime_error_with_a_hint():
    result = invoke(["gen", "-m", "no-such-model-anywhere", "hi"])
    assert_one_clear_error(result, 1, "no-such-model-anywhere")
    assert "pardec: hint:" in result.stderr


def test_missing_local_directory_is_reported():
    result = invoke(["gen", "-m", "./not/a/dir", "hi"])
    assert result.exit_code == 1
    assert "Traceback" not in result.stderr


def test_prompt_longer_than_the_context_is_explained():
    long_prompt = "word " * 9000  # SmolLM2-135M holds 8192 positions
    result = invoke(["gen", "--raw", "-n", "4", "-"], input=long_prompt)
    assert_one_clear_error(result, 1, "context holds 8192")
