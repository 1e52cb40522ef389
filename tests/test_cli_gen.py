"""`pardec gen` through the CLI's error boundary: prompts from arguments and stdin,
stats and JSON output, stop strings, seeds, and one clear line for every bad input.

The flag tests run a tiny random Llama with an in-memory word-level tokenizer (words
'w3' ... 'w95', see tests/tiny_models.py), loaded from a folder like any model: a call
takes a fraction of a second. A few smoke tests, marked `real_model`, run the embedded
SmolLM2-135M with few new tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import invoke
from tests.tiny_models import save_word_level_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder: a tiny random Llama and its word-level tokenizer and chat template."""
    return save_word_level_model(tmp_path_factory.mktemp("tiny-word-model"))


@pytest.fixture
def use_embedded_store(embedded_pardec_home, monkeypatch):
    monkeypatch.setenv("PARDEC_HOME", str(embedded_pardec_home))


def gen_json(model: Path | None, *args: str, input: str | None = None) -> dict:
    where = ["-m", str(model)] if model is not None else []
    # Greedy unless a test says otherwise: these prompts read as chat, whose profile samples.
    result = invoke(["gen", "--json", "--dtype", "float32", "--temp", "0", *where, *args], input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def assert_one_clear_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code
    assert result.stdout == ""
    assert result.stderr.startswith("pardec: error: ") or result.stderr.startswith("Usage:"), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


# -- smoke tests on the embedded model ----------------------------------------------


@pytest.mark.real_model
def test_the_embedded_model_streams_a_reply_to_stdout(use_embedded_store):
    result = invoke(["gen", "-n", "8", "--method", "vanilla", "What", "is", "2+2?"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip()
    assert result.stdout.endswith("\n")
    assert result.stderr == "", "nothing on stderr unless asked (no spinner off a terminal)"


@pytest.mark.real_model
def test_json_record_of_the_embedded_model(use_embedded_store):
    record = gen_json(None, "-n", "5", "--method", "pld", "-O", "num_draft=4", "Say hi.")
    assert (record["model"], record["dtype"], record["method"]) == ("smollm2-135m", "float32", "pld")
    assert record["stats"]["generated_tokens"] == 5


@pytest.mark.real_model
def test_a_prompt_longer_than_the_embedded_models_context_is_explained(use_embedded_store):
    long_prompt = "word " * 9000  # SmolLM2-135M holds 8192 positions
    result = invoke(["gen", "--raw", "-n", "4", "-"], input=long_prompt)
    assert_one_clear_error(result, 1, "context holds 8192")


# -- prompts ------------------------------------------------------------------------


def test_prompt_from_arguments_streams_the_reply_to_stdout(tiny):
    # Greedy: a sampled reply from the random tiny model may be only whitespace or end at once.
    result = invoke(["gen", "-m", str(tiny), "-n", "8", "--method", "vanilla", "--temp", "0", "w5", "w6", "w7"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip()
    assert result.stdout.endswith("\n")
    assert result.stderr == "", "nothing on stderr unless asked (no spinner off a terminal)"


def test_stdin_is_appended_after_the_argument_prompt(tiny):
    piped = gen_json(tiny, "-n", "6", "w10 w11:", input="w12 w13, w14 w15.")
    joined = gen_json(tiny, "-n", "6", "w10 w11:\nw12 w13, w14 w15.")
    assert piped["stats"]["prompt_tokens"] == joined["stats"]["prompt_tokens"]
    assert piped["text"] == joined["text"]


def test_dash_reads_the_prompt_from_stdin_alone(tiny):
    from_stdin = gen_json(tiny, "-n", "6", "-", input="w20 w21 w22.")
    from_args = gen_json(tiny, "-n", "6", "w20 w21 w22.")
    other = gen_json(tiny, "-n", "6", "w30 w31 w32.")
    assert from_stdin["text"] == from_args["text"] != other["text"]


def test_raw_skips_the_chat_template(tiny):
    templated = gen_json(tiny, "-n", "2", "w5")
    raw = gen_json(tiny, "-n", "2", "--raw", "w5")
    assert raw["stats"]["prompt_tokens"] < templated["stats"]["prompt_tokens"]


def test_system_prompt_goes_into_the_template(tiny):
    plain = gen_json(tiny, "-n", "2", "w5")
    short = gen_json(tiny, "-n", "2", "-s", "w40 w41.", "w5")
    long = gen_json(tiny, "-n", "2", "-s", "w40 w41. w42 w43 w44, w45 w46.", "w5")
    assert short["stats"]["prompt_tokens"] != plain["stats"]["prompt_tokens"]
    assert long["stats"]["prompt_tokens"] > short["stats"]["prompt_tokens"]


# -- output -------------------------------------------------------------------------


def test_stats_go_to_stderr_and_stdout_holds_only_the_text(tiny):
    plain = invoke(["gen", "-m", str(tiny), "-n", "8", "--dtype", "float32", "--temp", "0", "w5 w6 w7"])
    with_stats = invoke(["gen", "-m", str(tiny), "-n", "8", "--dtype", "float32", "--temp", "0", "--stats", "w5 w6 w7"])
    assert with_stats.exit_code == 0
    assert with_stats.stdout == plain.stdout
    for label in ("method", "tok/s", "first token", "tokens per step", "drafted tokens accepted"):
        assert label in with_stats.stderr


def test_json_record_has_text_method_stats_and_finish_reason(tiny):
    record = gen_json(tiny, "-n", "5", "--method", "pld", "-O", "num_draft=4", "w5 w6 w7")
    assert record["method"] == "pld"
    assert record["knobs"]["num_draft"] == 4
    assert record["model"] == str(tiny)
    assert record["dtype"] == "float32"
    assert record["finish_reason"] == "length"
    stats = record["stats"]
    assert stats["generated_tokens"] == 5
    for key in ("ttft_s", "tokens_per_s", "steps", "mean_tokens_per_step", "acceptance_rate"):
        assert key in stats


def test_a_method_label_as_bench_prints_it_sets_its_knobs(tiny):
    """--method 'pld[num_draft=4]' is --method pld -O num_draft=4: the same run, the same
    record; a combination's label with its dotted knobs and spaces around '+' reads too."""
    plain = gen_json(tiny, "-n", "6", "--temp", "0", "--method", "pld", "-O", "num_draft=4", "w5 w6 w7")
    label = gen_json(tiny, "-n", "6", "--temp", "0", "--method", "pld[num_draft=4]", "w5 w6 w7")
    assert label["method"] == "pld" and label["knobs"] == plain["knobs"] and label["text"] == plain["text"]
    both = gen_json(tiny, "-n", "4", "--temp", "0", "--method", "pld[num_draft=4]", "-O", "min_ngram=2", "w5 w6 w7")
    assert both["knobs"]["num_draft"] == 4 and both["knobs"]["min_ngram"] == 2
    combined = gen_json(tiny, "-n", "4", "--temp", "0", "--method", "pld + recycling[pld.num_draft=3]", "w5 w6 w7")
    assert combined["method"] == "pld+recycling"
    assert gen_json(tiny, "-n", "4", "--temp", "0", "--method", "pld+recycling", "w5 w6 w7")["text"] == combined["text"]


@pytest.mark.parametrize(
    "method, args, fragments",
    [
        ("pld[num_draft=4", [], ("cannot read the method", "NAME[KNOB=VALUE")),
        ("[num_draft=4]", [], ("cannot read the method",)),
        ("pld[num_draft=4]", ["-O", "num_draft=8"], ("num_draft given twice: in 'pld[num_draft=4]' and with -O",)),
        ("pld[nope=1]", [], ("nope",)),
        ("pldd[num_draft=4]", [], ("unknown method 'pldd'",)),
    ],
)
def test_bad_method_labels_are_usage_errors(tiny, method, args, fragments):
    assert_one_clear_error(invoke(["gen", "-m", str(tiny), "--method", method, *args, "hi"]), 2, *fragments)


def test_stop_string_ends_the_reply_and_is_not_printed(tiny):
    full = gen_json(tiny, "-n", "40", "--method", "vanilla", "w10 w11 w12")["text"]
    words = full.split()
    assert len(words) > 6
    stop = f"{words[3]} {words[4]}"  # two words in the middle of the reply: spans tokens
    cut = gen_json(tiny, "-n", "40", "--method", "pld", "--stop", stop, "w10 w11 w12")
    assert cut["text"] == full[: full.index(stop)]
    assert cut["finish_reason"] == "stop"


def test_same_seed_same_sample_and_different_seeds_differ(tiny):
    args = ["-n", "12", "--temp", "1.0", "--method", "pld", "w10 w11 w12"]
    first = gen_json(tiny, "--seed", "7", *args)["text"]
    assert gen_json(tiny, "--seed", "7", *args)["text"] == first
    assert gen_json(tiny, "--seed", "8", *args)["text"] != first  # 12 tokens at temperature 1: never equal by chance


# -- bad input: one clear line, no traceback ------------------------------------------


def test_empty_prompt_is_a_usage_error(tiny):
    assert_one_clear_error(invoke(["gen", "-m", str(tiny)], input=""), 2, "empty prompt")
    assert_one_clear_error(invoke(["gen", "-m", str(tiny), "  "], input="\n"), 2, "empty prompt")


def test_unknown_method_names_the_close_match(tiny):
    assert_one_clear_error(invoke(["gen", "-m", str(tiny), "--method", "pldd", "hi"]), 2, "unknown method 'pldd'", "did you mean 'pld'")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-O", "nope=1"], "nope"),
        (["-O", "num_draft=many"], "num_draft"),
        (["-O", "num_draft"], "NAME=VALUE"),
        (["-O", "min_ngram=4"], "min_ngram"),
    ],
)
def test_bad_method_knobs_are_usage_errors(tiny, args, fragment):
    assert_one_clear_error(invoke(["gen", "-m", str(tiny), "--method", "pld", *args, "hi"]), 2, fragment)


@pytest.mark.parametrize(
    "args",
    [["--temp", "-1"], ["--top-p", "0"], ["-n", "0"], ["--dtype", "float8"], ["--no-such-flag"]],
)
def test_bad_options_are_usage_errors(tiny, args):
    result = invoke(["gen", "-m", str(tiny), *args, "hi"])
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr
    assert "Error" in result.stderr or "error" in result.stderr


def test_draft_model_needs_the_draft_method(tiny):
    result = invoke(["gen", "-m", str(tiny), "--method", "pld", "--draft-model", "x", "hi"])
    assert_one_clear_error(result, 2, "--draft-model")


def test_missing_model_is_a_runtime_error_with_a_hint():
    result = invoke(["gen", "-m", "no-such-model-anywhere", "hi"])
    assert_one_clear_error(result, 1, "no-such-model-anywhere")
    assert "pardec: hint:" in result.stderr


def test_missing_local_directory_is_reported():
    result = invoke(["gen", "-m", "./not/a/dir", "hi"])
    assert result.exit_code == 1
    assert "Traceback" not in result.stderr


def test_prompt_longer_than_the_context_is_explained(tiny):
    long_prompt = "w5 " * 600  # the tiny model holds 512 positions
    result = invoke(["gen", "-m", str(tiny), "--raw", "-n", "4", "-"], input=long_prompt)
    assert_one_clear_error(result, 1, "context holds 512")
