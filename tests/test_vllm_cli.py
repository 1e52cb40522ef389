"""`--engine vllm` through the CLI, with vLLM's engine replaced by a scripted one.

What is pardec's is real here: the options, the store lookup, the method translation,
the output modes. Only `VllmEngine` (the one class that imports vLLM) is a fake that
replays deltas and speculative counters the way vLLM's engine reports them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pardec_cli.vllm_engine import plan as plan_module
from pardec_cli.vllm_engine import runner
from tests.cli_helpers import invoke


class FakeTokenizer:
    chat_template = None

    def __call__(self, text: str) -> Any:
        return type("Encoded", (), {"input_ids": [ord(c) for c in text]})()


class FakeEngine:
    """Replays three steps: 'Hello' (prefill), ', wor' (2 tokens), 'ld!' (3 tokens)."""

    started: list[dict[str, Any]] = []

    def __init__(self, args: dict[str, Any]) -> None:
        FakeEngine.started.append(args)
        self.tokenizer = FakeTokenizer()

    def stream(self, prompt_ids: list[int], *, max_tokens: int, **sampling: Any) -> runner.VllmStream:
        stats = runner.VllmStats(prompt_tokens=len(prompt_ids))
        stream = runner.VllmStream(iter(()), stats)

        def chunks():
            for step, (text, ids) in enumerate([("Hello", [1]), (", wor", [2, 3]), ("ld!", [4, 5, 6])]):
                stats.generated_tokens += len(ids)
                stats.steps += step > 0
                stream.token_ids += ids
                stream.parts.append(text)
                yield text
            stats.ttft_s, stats.total_s = 0.01, 0.11
            stats.spec = runner.SpecCounters(drafts=2, draft_tokens=8, accepted=3, per_position=(2, 1, 0, 0))
            stream.finish_reason = "length"

        stream.chunks = chunks()
        return stream


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_attention_heads": 8, "num_hidden_layers": 2}))
    return folder


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type[FakeEngine]:
    monkeypatch.setattr(plan_module, "vllm_version", lambda: "0.32.0")
    monkeypatch.setattr(runner, "VllmEngine", FakeEngine)
    monkeypatch.setattr("pardec_cli.hardware.probe_gpus", lambda: [])
    FakeEngine.started = []
    return FakeEngine


def test_without_vllm_the_error_is_one_line_with_the_pip_command(monkeypatch):
    monkeypatch.setattr(plan_module, "vllm_version", lambda: None)
    result = invoke(["gen", "--engine", "vllm", "--method", "pld", "Hi"])
    assert result.exit_code == 1
    assert result.stderr == "pardec: error: --engine vllm needs vLLM, which is not installed: pip install 'pardec[vllm]'\n"


def test_a_method_vllm_lacks_is_refused_naming_the_closest(fake_vllm):
    result = invoke(["gen", "--engine", "vllm", "--method", "layerskip", "Hi"])
    assert result.exit_code == 2
    assert "vLLM cannot run --method layerskip" in result.stderr
    assert "the closest it runs is draft_model (--method draft)" in result.stderr
    assert fake_vllm.started == []


def test_jsonl_and_batches_stay_on_pardecs_engine(fake_vllm, tmp_path):
    assert invoke(["gen", "--engine", "vllm", "--jsonl", "Hi"]).exit_code == 2
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hi"}\n')
    result = invoke(["gen", "--engine", "vllm", "--prompts", str(prompts)])
    assert result.exit_code == 2 and "pardec bench --engine vllm" in result.stderr


def test_parallel_flags_need_the_vllm_engine():
    result = invoke(["gen", "--tensor-parallel", "2", "Hi"])
    assert result.exit_code == 2 and "are for --engine vllm" in result.stderr


def test_the_reply_streams_to_stdout_and_vllm_gets_pardecs_translation(fake_vllm, model_dir):
    result = invoke(["gen", "--engine", "vllm", "-m", str(model_dir), "--method", "pld", "-O", "num_draft=4",
                     "-n", "6", "Hi"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "Hello, world!\n"
    [args] = fake_vllm.started
    assert args["model"] == str(model_dir.resolve())
    assert args["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
    }
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (1, 1)


def test_stats_report_vllms_speculative_counters(fake_vllm, model_dir):
    result = invoke(["gen", "--engine", "vllm", "-m", str(model_dir), "--method", "pld", "--stats", "Hi"])
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("method      pld ")
    assert "tokens      2 prompt, 6 generated (length)" in lines
    assert "steps       2, 2.50 tokens per step, 38% of 8 drafted tokens accepted" in lines
    assert "by position 100% 50% 0% 0%" in lines


def test_json_has_pardecs_fields_and_what_vllm_was_given(fake_vllm, model_dir):
    result = invoke(["gen", "--engine", "vllm", "-m", str(model_dir), "--method", "pld", "--json", "Hi"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["text"] == "Hello, world!" and record["method"] == "pld" and record["engine"] == "vllm"
    assert record["knobs"]["num_draft"] == 10 and record["finish_reason"] == "length"
    assert record["speculative_config"]["method"] == "ngram"
    stats = record["stats"]
    assert {k: stats[k] for k in ("prompt_tokens", "generated_tokens", "steps", "drafted_tokens", "accepted_tokens")} == {
        "prompt_tokens": 2, "generated_tokens": 6, "steps": 2, "drafted_tokens": 8, "accepted_tokens": 3,
    }
    assert stats["acceptance_per_position"] == [1.0, 0.5, 0.0, 0.0]
    assert stats["tokens_per_s"] == pytest.approx(6 / 0.11, rel=1e-3)


def test_explain_shows_the_speculative_config_and_the_layout(fake_vllm, model_dir):
    result = invoke(["gen", "--engine", "vllm", "-m", str(model_dir), "--method", "pld", "--explain", "Hi"])
    assert result.exit_code == 0, result.stderr
    assert 'vllm      speculative_config {"method": "ngram"' in result.stderr
    assert "parallel  tensor 1 x pipeline 1 (no GPU found)" in result.stderr


def test_bench_refuses_a_method_vllm_lacks_before_loading(fake_vllm, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"question_id": 1, "category": "qa", "turns": ["Hi"]}\n')
    result = invoke(["bench", "--prompts", str(prompts), "--methods", "vanilla,lookahead", "--engine", "vllm"])
    assert result.exit_code == 2 and "closest it runs is ngram (--method pld)" in result.stderr


def test_doctor_says_whether_vllm_is_installed_and_what_it_runs(monkeypatch):
    monkeypatch.setattr(plan_module, "vllm_version", lambda: None)
    result = invoke(["doctor", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.stderr
    vllm = json.loads(result.stdout)["vllm"]
    assert vllm["version"] is None and vllm["install"] == "pip install 'pardec[vllm]'"
    assert vllm["runs"]["pld"] == "ngram" and vllm["not"]["layerskip"]["closest"] == "draft"
    text = invoke(["doctor", "--device", "cpu"]).stdout
    assert "engines     pardec; vllm not installed (pip install 'pardec[vllm]')" in text
    assert "pld (as ngram)" in text


def test_the_device_is_vllms_choice(fake_vllm):
    result = invoke(["gen", "--engine", "vllm", "--device", "cpu", "Hi"])
    assert result.exit_code == 2 and "--device is for pardec's engine" in result.stderr


# -- pardec serve --engine vllm: pardec chooses, then vLLM's own OpenAI server runs --------


@pytest.fixture
def exec_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """`os.execv` recorded instead of replacing the test process."""
    calls: list[list[str]] = []
    monkeypatch.setattr("os.execv", lambda path, argv: calls.append(list(argv)))
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    return calls


def test_serve_dry_run_prints_the_vllm_command_with_pardecs_method(fake_vllm, model_dir, exec_calls):
    result = invoke(["serve", "--engine", "vllm", "-m", str(model_dir), "--method", "pld", "-O", "num_draft=4",
                     "--port", "8081", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    command = result.stdout.strip()
    assert command.startswith(f"vllm serve {model_dir.resolve()} ")
    assert """--speculative-config '{"method":"ngram","num_speculative_tokens":4""" in command
    assert command.endswith("--host 127.0.0.1 --port 8081")
    assert "speculative_config" in result.stderr  # the reasons, on stderr
    assert exec_calls == []
    label = invoke(["serve", "--engine", "vllm", "-m", str(model_dir), "--method", "pld[num_draft=4]",
                    "--port", "8081", "--dry-run"])
    assert label.exit_code == 0, label.stderr
    assert label.stdout.strip() == command  # the label as bench prints it is --method pld -O num_draft=4


def test_serve_execs_vllm_with_the_api_key_which_is_never_echoed(fake_vllm, model_dir, exec_calls):
    result = invoke(["serve", "--engine", "vllm", "-m", str(model_dir), "--method", "vanilla", "--api-key", "s3cret",
                     "--vllm-arg=--max-model-len", "--vllm-arg=2048"])
    assert result.exit_code == 0, result.stderr
    [argv] = exec_calls
    assert argv[:3] == ["vllm", "serve", str(model_dir.resolve())]
    assert argv[-4:] == ["--api-key", "s3cret", "--max-model-len", "2048"]
    assert "s3cret" not in result.stderr and "***" in result.stderr


def test_serve_without_vllm_says_how_to_install_it(monkeypatch, model_dir, exec_calls):
    monkeypatch.setattr(plan_module, "vllm_version", lambda: None)
    result = invoke(["serve", "--engine", "vllm", "-m", str(model_dir)])
    assert result.exit_code == 1
    assert "pip install 'pardec[vllm]'" in result.stderr and exec_calls == []


def test_serve_on_pardecs_engine_refuses_vllm_only_flags():
    for flags in (["--dry-run"], ["--tensor-parallel", "2"], ["--vllm-arg", "x"]):
        result = invoke(["serve", *flags])
        assert result.exit_code == 2 and "are for --engine vllm" in result.stderr, flags
    result = invoke(["serve", "--method", "pld"])
    assert result.exit_code == 2 and '"pardec" field' in result.stderr


def test_a_model_stored_with_gguf_blocks_reaches_vllm_as_its_gguf_file(fake_vllm, model_dir, tmp_path, exec_calls):
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    (model_dir / "pardec-quant.json").write_text("{}")
    (model_dir / "pardec-model.json").write_text(json.dumps({"format": 1, "gguf": str(gguf)}))
    result = invoke(["serve", "--engine", "vllm", "-m", str(model_dir), "--method", "vanilla", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"vllm serve {gguf} ")
    assert f"--tokenizer {model_dir.resolve()}" in result.stdout
    assert f"--hf-config-path {model_dir.resolve()}" in result.stdout
    gguf.unlink()
    result = invoke(["serve", "--engine", "vllm", "-m", str(model_dir), "--method", "vanilla", "--dry-run"])
    assert result.exit_code == 2 and "the GGUF file it was imported from is gone" in result.stderr
