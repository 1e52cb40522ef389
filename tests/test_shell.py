"""`pardec gen` in shells and scripts: pipelines, --no-stream, --json/--jsonl, batch
prompts, exit codes, Ctrl-C, a closed pipe, and a `--help` that imports no torch.

Generation runs on a tiny random Llama (2 layers, 32 wide) saved with the real SmolLM2
tokenizer, so every call takes milliseconds once torch is imported. The real-process
tests (Ctrl-C, `| head`) start `python -m pardec_cli`; the rest run in-process through
the CLI's error boundary (`tests.cli_helpers.invoke`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pardec_cli.session import Session, TextStream
from tests.cli_helpers import invoke
from tests.conftest import TINY_CONTEXT

RESULT_FIELDS = {"text", "model", "method", "knobs", "profile", "dtype", "weights", "device", "compiled", "runner", "finish_reason",
                 "stats"}
STEP_FIELDS = {"type", "step", "text", "tokens", "drafted", "accepted", "propose_s", "verify_s", "forward_s", "elapsed_s"}
def gen(model: Path, *args: str, input: str | None = None):
    # Greedy unless a test says otherwise: these prompts read as chat, whose profile samples.
    return invoke(["gen", "-m", str(model), "--dtype", "float32", "--temp", "0", *args], input=input)


def gen_json(model: Path, *args: str, input: str | None = None) -> dict:
    result = gen(model, "--json", *args, input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def json_lines(text: str) -> list[dict]:
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def assert_plain(result) -> None:
    """Off a terminal: no ANSI escapes, no carriage-return spinners, nothing but what was asked."""
    for stream in (result.stdout, result.stderr):
        assert "\x1b" not in stream and "\r" not in stream
    assert "Traceback" not in result.stderr


# -- output modes ---------------------------------------------------------------------


def test_length_limited_reply_exits_0_with_finish_reason_length(tiny_cli_model):
    result = gen(tiny_cli_model, "--json", "-n", "6", "Hello")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    record = json.loads(result.stdout)
    assert set(record) == RESULT_FIELDS
    assert record["finish_reason"] == "length"
    assert record["stats"]["generated_tokens"] == 6
    assert record["model"] == str(tiny_cli_model)


def test_streamed_and_no_stream_output_are_the_same_plain_text(tiny_cli_model):
    streamed = gen(tiny_cli_model, "-n", "12", "Hello")
    whole = gen(tiny_cli_model, "--no-stream", "-n", "12", "Hello")
    record = gen_json(tiny_cli_model, "-n", "12", "Hello")
    assert streamed.exit_code == whole.exit_code == 0
    assert streamed.stdout == whole.stdout == record["text"] + "\n"
    assert streamed.stderr == whole.stderr == ""
    assert_plain(streamed)


def test_stats_go_to_stderr_only_when_asked(tiny_cli_model):
    result = gen(tiny_cli_model, "--no-stream", "--stats", "-n", "5", "Hello")
    assert result.exit_code == 0
    assert result.stdout == gen(tiny_cli_model, "--no-stream", "-n", "5", "Hello").stdout
    assert "5 generated (length)" in result.stderr
    assert_plain(result)


def test_jsonl_streams_one_event_per_step_then_the_json_summary(tiny_cli_model):
    result = gen(tiny_cli_model, "--jsonl", "--method", "pld", "-n", "40", "--raw",
                 "one two three one two three one two three one two")
    assert result.exit_code == 0, result.stderr
    *steps, summary = json_lines(result.stdout)
    assert summary["type"] == "result"
    assert set(summary) == RESULT_FIELDS | {"type"}
    assert {k: v for k, v in summary.items() if k not in ("type", "stats")} == {
        k: v for k, v in gen_json(tiny_cli_model, "--method", "pld", "-n", "40", "--raw",
                                  "one two three one two three one two three one two").items() if k != "stats"
    }
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert len(steps) == summary["stats"]["steps"] + 1  # step 0 is the prefill
    for step in steps:
        assert step["type"] == "step" and set(step) == STEP_FIELDS
        assert 0 <= step["accepted"] <= step["drafted"]
        assert 1 <= len(step["tokens"]) <= step["accepted"] + 1
    assert [s["elapsed_s"] for s in steps] == sorted(s["elapsed_s"] for s in steps)
    assert "".join(s["text"] for s in steps) == summary["text"]
    assert sum(len(s["tokens"]) for s in steps) == summary["stats"]["generated_tokens"] == 40
    assert sum(s["accepted"] for s in steps) == summary["stats"]["accepted_tokens"]


def test_piped_stdin_is_appended_and_dash_reads_stdin_alone(tiny_cli_model):
    piped = gen_json(tiny_cli_model, "-n", "4", "Summarise:", input="notes line 1\nnotes line 2\n")
    joined = gen_json(tiny_cli_model, "-n", "4", "Summarise:\nnotes line 1\nnotes line 2\n")
    assert piped["text"] == joined["text"]
    assert piped["stats"]["prompt_tokens"] == joined["stats"]["prompt_tokens"]
    dash = gen_json(tiny_cli_model, "-n", "4", "-", input="What is 2+2?")
    assert dash["text"] == gen_json(tiny_cli_model, "-n", "4", "What is 2+2?")["text"]


# -- batch prompts --------------------------------------------------------------------


@pytest.fixture
def count_loads(monkeypatch):
    """Count Session.load calls (each still loads the model for real)."""
    calls: list[str | None] = []
    original = Session.load.__func__

    def load(cls, model_spec, **kwargs):
        calls.append(model_spec)
        return original(cls, model_spec, **kwargs)

    monkeypatch.setattr(Session, "load", classmethod(load))
    return calls


def test_prompts_file_runs_every_prompt_on_one_model_load(tiny_cli_model, tmp_path, count_loads):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now shorter."]}) + "\n"
        + "\n"
        + json.dumps({"prompt": "Name a colour."}) + "\n"
        + json.dumps({"task_id": "HumanEval/0", "prompt": "def add(a, b):\n"}) + "\n",
        encoding="utf-8",
    )
    result = gen(tiny_cli_model, "--prompts", str(prompts), "-n", "5")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    records = json_lines(result.stdout)
    assert count_loads == [str(tiny_cli_model)]
    assert [(r["index"], r["id"], r["category"], r["prompt"]) for r in records] == [
        (0, 81, "writing", "Write a haiku."),
        (1, 3, None, "Name a colour."),
        (2, "HumanEval/0", None, "def add(a, b):\n"),
    ]
    for record in records:
        assert set(record) == RESULT_FIELDS | {"index", "id", "category", "prompt"}
        assert record["finish_reason"] == "length" and record["stats"]["generated_tokens"] == 5
    # Each result is what a single `gen --json` of that prompt gives.
    assert records[1]["text"] == gen_json(tiny_cli_model, "-n", "5", "Name a colour.")["text"]


def test_each_line_runs_one_prompt_per_stdin_line_behind_the_argument_prompt(tiny_cli_model, count_loads):
    result = gen(tiny_cli_model, "--each-line", "-n", "3", "Translate to French:", input="good morning\n\nthank you\n")
    assert result.exit_code == 0, result.stderr
    records = json_lines(result.stdout)
    assert len(count_loads) == 1
    assert [(r["index"], r["id"], r["prompt"]) for r in records] == [
        (0, 1, "Translate to French:\ngood morning"),
        (1, 3, "Translate to French:\nthank you"),
    ]
    single = gen_json(tiny_cli_model, "-n", "3", "Translate to French:", input="thank you")
    assert records[1]["text"] == single["text"]


def test_batch_with_jsonl_streams_steps_tagged_with_the_prompt_index(tiny_cli_model):
    result = gen(tiny_cli_model, "--each-line", "--jsonl", "--method", "vanilla", "-n", "3", input="a\nb\n")
    assert result.exit_code == 0, result.stderr
    lines = json_lines(result.stdout)
    assert [(r["type"], r["index"]) for r in lines if r["type"] == "result"] == [("result", 0), ("result", 1)]
    assert [r["index"] for r in lines if r["type"] == "step"] == [0, 0, 0, 1, 1, 1]


def test_a_failing_prompt_gets_an_error_line_the_rest_run_and_the_exit_code_is_1(tiny_cli_model, tmp_path):
    prompts = tmp_path / "p.jsonl"
    too_long = "word " * (TINY_CONTEXT + 200)
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("hi", too_long, "bye")) + "\n")
    result = gen(tiny_cli_model, "--prompts", str(prompts), "--raw", "-n", "2")
    assert result.exit_code == 1
    first, failed, last = json_lines(result.stdout)
    assert first["finish_reason"] == last["finish_reason"] == "length"
    assert "context holds" in failed["error"] and "text" not in failed
    assert result.stderr.startswith("pardec: error: 1 of 3 prompts failed")


def test_bad_prompt_file_is_a_usage_error_before_any_model_loads(tiny_cli_model, tmp_path, count_loads):
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": \n')
    result = gen(tiny_cli_model, "--prompts", str(prompts))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"pardec: error: {prompts}:2: not valid JSON")
    prompts.write_text('{"question": "no prompt field"}\n')
    assert "expected a \"prompt\" string" in gen(tiny_cli_model, "--prompts", str(prompts)).stderr
    missing = gen(tiny_cli_model, "--prompts", str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    assert count_loads == []


# -- exit codes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, stdin, code, message",
    [
        (["gen", "--json", "--jsonl", "hi"], None, 2, "pardec: error: --json and --jsonl cannot be combined"),
        (["gen", "--prompts", "-", "--each-line", "hi"], None, 2, "pardec: error: --prompts and --each-line cannot be combined"),
        (["gen", "--each-line", "-"], "a\n", 2, "pardec: error: '-' reads one prompt"),
        (["gen", "--no-such-flag", "hi"], None, 2, "No such option"),
        (["gen"], "", 2, "pardec: error: empty prompt"),
        (["no-such-command"], None, 2, "No such command"),
        (["gen", "-m", "./no/such/model/dir", "hi"], None, 1, "pardec: error:"),
        (["gen", "-m", "no-such-model-anywhere", "hi"], None, 1, "pardec: error: unknown model"),
    ],
)
def test_exit_codes_for_usage_and_runtime_errors(args, stdin, code, message):
    result = invoke(args, input=stdin)
    assert result.exit_code == code, result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


# -- Ctrl-C ---------------------------------------------------------------------------


def _run_pending_signal_handlers() -> None:
    """A few bytecodes with a backward jump: CPython runs pending Python signal handlers here."""
    for _ in range(3):
        pass


@pytest.fixture
def ctrl_c_at(monkeypatch):
    """Press Ctrl-C (a real SIGINT to this process) `presses` times while step `at` is being emitted."""

    def arm(at: int, presses: int = 1) -> None:
        original = TextStream.__iter__

        def iterate(self):
            for n, chunk in enumerate(original(self)):
                if n == at:
                    for _ in range(presses):
                        signal.raise_signal(signal.SIGINT)
                        _run_pending_signal_handlers()
                yield chunk

        monkeypatch.setattr(TextStream, "__iter__", iterate)

    return arm


@pytest.fixture
def full_text(tiny_cli_model):
    return gen_json(tiny_cli_model, "-n", "60", "--raw", "Once upon a time")["text"]


@pytest.mark.slow  # a pardec process and signals
@pytest.mark.parametrize("mode", [[], ["--no-stream"]])
def test_ctrl_c_prints_the_text_so_far_and_exits_130(tiny_cli_model, ctrl_c_at, full_text, mode):
    ctrl_c_at(5)
    result = gen(tiny_cli_model, *mode, "-n", "60", "--raw", "Once upon a time")
    assert result.exit_code == 130
    assert result.stderr.strip() == "pardec: interrupted"
    text = result.stdout.removesuffix("\n")
    assert text and full_text.startswith(text) and len(text) < len(full_text)
    assert_plain(result)


@pytest.mark.slow  # a pardec process and signals
def test_ctrl_c_with_stats_reports_the_cancelled_generation(tiny_cli_model, ctrl_c_at):
    ctrl_c_at(3)
    result = gen(tiny_cli_model, "--stats", "-n", "60", "--raw", "Once upon a time")
    assert result.exit_code == 130
    assert "generated (cancelled)" in result.stderr and "tokens per step" in result.stderr
    assert result.stderr.rstrip().endswith("pardec: interrupted")


@pytest.mark.slow  # a pardec process and signals
def test_ctrl_c_with_json_prints_a_whole_object_marked_cancelled(tiny_cli_model, ctrl_c_at, full_text):
    ctrl_c_at(5)
    result = gen(tiny_cli_model, "--json", "-n", "60", "--raw", "Once upon a time")
    assert result.exit_code == 130
    record = json.loads(result.stdout)
    assert record["finish_reason"] == "cancelled"
    assert 6 <= record["stats"]["generated_tokens"] < 60
    assert full_text.startswith(record["text"])


@pytest.mark.slow  # a pardec process and signals
def test_ctrl_c_with_jsonl_ends_with_the_summary(tiny_cli_model, ctrl_c_at):
    ctrl_c_at(4)
    result = gen(tiny_cli_model, "--jsonl", "-n", "60", "--raw", "Once upon a time")
    assert result.exit_code == 130
    *steps, summary = json_lines(result.stdout)
    assert summary["type"] == "result" and summary["finish_reason"] == "cancelled"
    assert len(steps) >= 5 and summary["stats"]["generated_tokens"] < 60
    assert "".join(s["text"] for s in steps) == summary["text"]


@pytest.mark.slow  # a pardec process and signals
def test_a_second_ctrl_c_interrupts_at_once_and_still_prints_the_record(tiny_cli_model, ctrl_c_at, full_text):
    ctrl_c_at(5, presses=2)
    result = gen(tiny_cli_model, "--json", "-n", "60", "--raw", "Once upon a time")
    assert result.exit_code == 130
    record = json.loads(result.stdout)
    assert record["finish_reason"] == "cancelled" and full_text.startswith(record["text"])


@pytest.mark.slow  # a pardec process and signals
def test_ctrl_c_in_a_batch_writes_the_partial_result_and_stops(tiny_cli_model, ctrl_c_at):
    ctrl_c_at(2)
    result = gen(tiny_cli_model, "--each-line", "-n", "30", input="first\nsecond\nthird\n")
    assert result.exit_code == 130
    (record,) = json_lines(result.stdout)
    assert record["index"] == 0 and record["finish_reason"] == "cancelled"


# -- real processes: signals and pipes --------------------------------------------------


def pardec_process(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pardec_cli", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


@pytest.mark.slow  # a pardec process and signals
@pytest.mark.parametrize("mode", [["--jsonl"], ["--stats"]])
def test_ctrl_c_in_a_real_process(tiny_cli_model, mode):
    proc = pardec_process("gen", "-m", str(tiny_cli_model), "--dtype", "float32", "--raw", "-n", "1000", *mode, "Once")
    try:
        first = proc.stdout.readline() if mode == ["--jsonl"] else proc.stdout.read(1)
        assert first, proc.stderr.read().decode()
        proc.send_signal(signal.SIGINT)
        out = first + proc.stdout.read()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert code == 130, err
    assert "Traceback" not in err and err.rstrip().endswith("pardec: interrupted")
    if mode == ["--jsonl"]:
        *steps, summary = json_lines(out.decode())
        assert summary["finish_reason"] == "cancelled"
        assert "".join(s["text"] for s in steps) == summary["text"]
    else:
        assert out.endswith(b"\n") and b"\x1b" not in out
        assert "generated (cancelled)" in err


@pytest.mark.slow  # a pardec process and signals
def test_a_reader_that_leaves_early_causes_no_traceback_and_exit_0(tiny_cli_model):
    """`pardec gen ... | head -c 100`."""
    proc = pardec_process("gen", "-m", str(tiny_cli_model), "--dtype", "float32", "--raw", "-n", "1000", "Once")
    try:
        head = proc.stdout.read(100)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert len(head) == 100
    assert code == 0, err
    assert err == ""


# -- the front door ---------------------------------------------------------------------

HELP_IMPORTS = r"""
import json, sys
from pardec_cli.cli.main import run
report = {}
for args in (["--help"], ["gen", "--help"], ["bench", "--help"], ["completion", "--help"], ["tune", "--help"],
             ["doctor", "--help"]):
    code = run(args)
    report[" ".join(args)] = [code, sorted(m for m in ("torch", "transformers") if m in sys.modules)]
print(json.dumps(report))
"""


@pytest.mark.slow  # a pardec process and signals
def test_help_imports_neither_torch_nor_transformers():
    done = subprocess.run([sys.executable, "-c", HELP_IMPORTS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {name: [0, []] for name in ("--help", "gen --help", "bench --help", "completion --help", "tune --help",
                                                 "doctor --help")}
    assert "--jsonl" in done.stdout and "--each-line" in done.stdout and "completion" in done.stdout
