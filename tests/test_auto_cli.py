"""`--method auto`, `-P/--profile`, `--explain` through `pardec gen` and `pardec bench`,
and `pardec doctor`, on a tiny random model with the real tokenizer (`tiny_cli_model`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pardec_cli.methods.registry import METHODS
from pardec_cli.selection.profiles import user_profiles_dir
from tests.cli_helpers import invoke

CODE_PROMPT = "Write a Python function that returns the largest of three numbers."
CHAT_PROMPT = "What is the capital of France?"


def gen(model: Path, *args: str, input: str | None = None, env: dict | None = None):
    return invoke(["gen", "-m", str(model), "--dtype", "float32", *args], input=input, env=env)


def gen_json(model: Path, *args: str, **kwargs) -> dict:
    result = gen(model, "--json", *args, **kwargs)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def user_profile(name: str, text: str) -> None:
    user_profiles_dir().mkdir(parents=True, exist_ok=True)
    (user_profiles_dir() / f"{name}.toml").write_text(text, encoding="utf-8")


# -- gen ----------------------------------------------------------------------------------


def test_auto_is_the_default_and_picks_a_registered_method_for_the_detected_profile(tiny_cli_model):
    record = gen_json(tiny_cli_model, "-n", "8", CODE_PROMPT)
    assert record["method"] in METHODS
    assert record["profile"] == "code"
    assert gen_json(tiny_cli_model, "-n", "8", CHAT_PROMPT)["profile"] == "chat"


def test_auto_output_equals_plain_decoding(tiny_cli_model):
    auto = gen_json(tiny_cli_model, "-n", "24", "--raw", CODE_PROMPT)
    vanilla = gen_json(tiny_cli_model, "-n", "24", "--raw", "--method", "vanilla", CODE_PROMPT)
    assert auto["text"] == vanilla["text"]


def test_explain_prints_the_choice_and_reasons_to_stderr_only(tiny_cli_model):
    result = gen(tiny_cli_model, "-n", "4", "--explain", CODE_PROMPT)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("method    ")
    for head in ("profile   code (detected: ", "hardware  ", "cost      verifying n tokens costs ", "expect    ",
                 "sampling  greedy, at most 4 tokens"):
        assert any(line.startswith(head) for line in lines), head
    assert "method    " not in result.stdout


def test_explain_with_a_named_method_and_profile(tiny_cli_model):
    result = gen(tiny_cli_model, "-n", "4", "--explain", "--method", "pld", "-P", "extraction", CHAT_PROMPT)
    assert result.exit_code == 0, result.stderr
    assert "method    pld (given)" in result.stderr
    assert "profile   extraction (given)" in result.stderr


def test_a_profile_gives_sampling_defaults_only_for_options_left_unset(tiny_cli_model):
    user_profile("chat", "[sampling]\nmax_tokens = 3\ntemperature = 0.8\ntop_k = 5\n")
    record = gen_json(tiny_cli_model, "--seed", "1", "-P", "chat", CHAT_PROMPT)
    assert record["stats"]["generated_tokens"] <= 3
    explained = gen(tiny_cli_model, "--explain", "-P", "chat", CHAT_PROMPT)
    # top_p is the built-in chat profile's: a user file overrides key by key.
    assert "sampling  temperature 0.8, top_p 0.95, top_k 5, at most 3 tokens" in explained.stderr
    # The command line, the environment and config.toml all win over the profile.
    assert gen_json(tiny_cli_model, "-n", "6", "-P", "chat", CHAT_PROMPT)["stats"]["generated_tokens"] == 6
    explained = gen(tiny_cli_model, "--explain", "-P", "chat", CHAT_PROMPT, env={"PARDEC_GEN_TEMPERATURE": "0"})
    assert "sampling  greedy, at most 3 tokens" in explained.stderr
    one = gen(tiny_cli_model, "--explain", "-n", "1", "-P", "chat", CHAT_PROMPT, env={"PARDEC_GEN_TEMPERATURE": "0"})
    assert "sampling  greedy, at most 1 token\n" in one.stderr


def test_batch_prompts_get_a_profile_and_a_method_each(tiny_cli_model, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": CODE_PROMPT}) + "\n" + json.dumps({"prompt": CHAT_PROMPT}) + "\n")
    result = gen(tiny_cli_model, "-n", "4", "--prompts", str(prompts), "--explain")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["profile"] for r in records] == ["code", "chat"]
    assert "== prompt 0 (id 1)" in result.stderr and "== prompt 1 (id 2)" in result.stderr


def test_draft_model_with_auto_is_a_drafter_auto_may_use(tiny_cli_model):
    result = gen(tiny_cli_model, "-n", "4", "--explain", "--draft-model", str(tiny_cli_model), CHAT_PROMPT)
    assert result.exit_code == 0, result.stderr
    assert "needs a drafter" not in result.stderr  # the given drafter counts as installed


# -- bench ---------------------------------------------------------------------------------


def test_bench_runs_auto_per_prompt_and_reports_its_choices(tiny_cli_model, tmp_path):
    prompts = tmp_path / "bench.jsonl"
    prompts.write_text(
        json.dumps({"question_id": 1, "category": "coding", "turns": [CODE_PROMPT]}) + "\n"
        + json.dumps({"question_id": 2, "category": "qa", "turns": [CHAT_PROMPT]}) + "\n"
    )
    result = invoke(["bench", "-m", str(tiny_cli_model), "--dtype", "float32", "--prompts", str(prompts),
                     "--methods", "auto,pld", "-n", "8", "--json", "-", "--compile", "off"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    auto_runs = [r for r in report["runs"] if r["label"] == "auto"]
    assert len(auto_runs) == 2 and all(r["chosen"] for r in auto_runs)
    assert report["summary"]["overall"]["auto"]["match_rate"] == 1.0
    assert "auto chose:" in result.stderr and "coding: " in result.stderr


def test_bench_auto_takes_no_knobs():
    result = invoke(["bench", "--prompts", "x.jsonl", "--methods", "auto[k=4]"])
    assert result.exit_code == 2 and "auto takes no knobs" in result.stderr


# -- doctor ---------------------------------------------------------------------------------


def test_doctor_reports_machine_versions_and_auto_per_profile(tiny_cli_model):
    result = invoke(["doctor", "-m", str(tiny_cli_model)])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert out.startswith("pardec ") and "torch " in out and "transformers " in out
    for fragment in ("machine", "  cpu       ", "  memory    ", "  runs on   cpu in ", "models", "profiles    code, chat, extraction",
                     f"auto with {tiny_cli_model}", "  tuned         not yet", "  cost curve    verifying n tokens costs"):
        assert fragment in out, fragment
    for profile in ("code", "chat", "extraction"):
        assert any(line.startswith(f"  {profile} ") and "x expected" in line for line in out.splitlines()), profile


def test_doctor_json(tiny_cli_model):
    result = invoke(["doctor", "-m", str(tiny_cli_model), "--json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"versions", "machine", "models", "profiles", "vllm", "model", "compiled", "floor"}
    assert report["machine"]["hardware_class"] in ("cpu", "cpu-bf16", "gpu-datacenter", "gpu-consumer", "apple")
    assert set(report["model"]["auto"]) == {"code", "chat", "extraction"}
    assert report["model"]["layers"] == 2


def test_doctor_for_a_model_that_is_not_here_says_so():
    result = invoke(["doctor", "-m", "qwen2.5-7b"])
    assert result.exit_code == 0
    assert "qwen2.5-7b is not on this machine" in result.stdout


def test_doctor_names_a_broken_profile():
    user_profile("code", "[sampling]\ntemperature = -1\n")
    result = invoke(["doctor"])
    assert result.exit_code == 2
    assert "code.toml:2: sampling.temperature" in result.stderr


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(sys.platform != "linux", reason="the no-GPU path is checked on Linux")
def test_doctor_without_measuring_does_not_import_torch_on_a_machine_without_a_gpu_driver(tiny_cli_model):
    from pardec_cli.hardware import NVIDIA_DRIVER_PATH

    if NVIDIA_DRIVER_PATH.exists():
        pytest.skip("this machine has an NVIDIA driver: doctor asks torch about the GPUs")
    code = (
        "import sys\nfrom pardec_cli.cli.main import run\n"
        f"code = run(['doctor', '-m', {str(tiny_cli_model)!r}, '--no-measure'])\n"
        "print('IMPORTED', sorted(m for m in ('torch', 'transformers') if m in sys.modules), code, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert "IMPORTED [] 0" in done.stderr, done.stderr
