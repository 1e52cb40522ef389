"""How vLLM is started for pardec's choice: parallel sizes, engine keywords, `vllm serve`,
and the plan from the store to those keywords. No vLLM, no GPU: GPUs are described."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.hardware import GpuInfo
from pardec_cli.store.resolve import ResolvedModel
from pardec_cli.vllm_engine.launch import Parallel, engine_args, format_command, parallel_sizes, serve_command
from pardec_cli.vllm_engine.plan import plan_method, plan_vllm
from pardec_cli.vllm_engine.translate import Translation

NGRAM = Translation("pld", {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 3,
                            "prompt_lookup_min": 1})


def h100s(n: int) -> list[GpuInfo]:
    return [GpuInfo(i, "NVIDIA H100 80GB HBM3", 80 * 1024**3, (9, 0)) for i in range(n)]


# -- parallel sizes ---------------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "heads", "expected"), [
    (0, 32, Parallel(1, 1)),            # CPU
    (1, 32, Parallel(1, 1)),
    (8, 64, Parallel(8, 1)),            # every GPU splits each layer
    (6, 32, Parallel(2, 3)),            # 6 does not divide 32 heads: 2-way tensor, 3 stages
    (4, 14, Parallel(2, 2)),
    (4, None, Parallel(4, 1)),          # head count unknown: vLLM will check
])
def test_sizes_from_the_gpus_found(gpus, heads, expected):
    assert parallel_sizes(gpus, attention_heads=heads) == expected


def test_sizes_from_the_flags():
    assert parallel_sizes(8, attention_heads=32, tensor=4) == Parallel(4, 1)
    assert parallel_sizes(8, attention_heads=32, pipeline=2) == Parallel(4, 2)
    assert parallel_sizes(8, attention_heads=32, tensor=2, pipeline=4) == Parallel(2, 4)


def test_more_gpus_than_this_machine_has_is_a_multi_node_run_over_ray():
    assert parallel_sizes(8, attention_heads=64, tensor=8, pipeline=2) == Parallel(8, 2, "ray")


def test_a_tensor_split_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(PardecUsageError, match="--tensor-parallel 3 does not divide the model's 32 attention heads"):
        parallel_sizes(4, attention_heads=32, tensor=3)


# -- engine keywords and the serve command ------------------------------------------------


def test_engine_args_carry_the_model_dir_the_speculative_config_and_the_layout():
    args = engine_args("/store/m", NGRAM, Parallel(8, 2, "ray"), served_name="llama-70b", dtype="bfloat16", seed=1)
    assert args == {
        "model": "/store/m", "dtype": "bfloat16", "tensor_parallel_size": 8, "pipeline_parallel_size": 2,
        "disable_log_stats": False, "served_model_name": "llama-70b", "distributed_executor_backend": "ray",
        "speculative_config": NGRAM.speculative_config, "seed": 1,
    }


def test_plain_decoding_gives_vllm_no_speculative_config():
    args = engine_args("/store/m", Translation("vanilla", None), Parallel())
    assert "speculative_config" not in args and "distributed_executor_backend" not in args


def test_the_serve_command_is_vllm_serve_with_the_same_settings():
    args = engine_args("/store/m", NGRAM, Parallel(4, 2, "ray"), served_name="llama-70b", dtype="bfloat16")
    command = serve_command(args, host="0.0.0.0", port=9000, extra=["--max-num-seqs", "64"])
    assert command == [
        "vllm", "serve", "/store/m",
        "--dtype", "bfloat16", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--served-model-name", "llama-70b", "--distributed-executor-backend", "ray",
        "--speculative-config", '{"method":"ngram","num_speculative_tokens":10,"prompt_lookup_max":3,"prompt_lookup_min":1}',
        "--host", "0.0.0.0", "--port", "9000", "--max-num-seqs", "64",
    ]
    spec = command[command.index("--speculative-config") + 1]
    assert json.loads(spec) == NGRAM.speculative_config


def test_the_serve_command_pastes_into_a_shell():
    args = engine_args("/store/my model", NGRAM, Parallel())
    line = format_command(serve_command(args))
    assert line.startswith("vllm serve '/store/my model' --dtype auto ")
    assert "--speculative-config '{\"method\":\"ngram\"," in line


# -- the plan: from the store to the keywords ---------------------------------------------


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model directory as vLLM would read it (only config.json matters to the plan)."""
    folder = tmp_path / "big-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_attention_heads": 64,
        "num_hidden_layers": 80, "hidden_size": 8192, "vocab_size": 128256,
    }))
    # A safetensors header alone: pardec sizes a model from its tensors' shapes (70B here).
    header = json.dumps({"weight": {"dtype": "BF16", "shape": [70_000_000_000], "data_offsets": [0, 0]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return folder


def resolved(folder: Path) -> ResolvedModel:
    return ResolvedModel(name="big-model", path=folder, source="local")


def test_a_named_method_plans_the_engine_for_the_gpus_found(model_dir):
    plan = plan_method(resolved(model_dir), method="pld", options={"num_draft": "6"}, gpus=h100s(8))
    assert plan.method == "pld" and plan.knobs["num_draft"] == 6
    assert plan.args["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
    }
    assert (plan.args["tensor_parallel_size"], plan.args["pipeline_parallel_size"]) == (8, 1)
    assert plan.args["model"] == str(model_dir)
    assert "parallel  tensor 8 x pipeline 1 over 8 GPU(s) found" in plan.reasons


def test_a_drafter_is_resolved_to_its_local_directory(model_dir, tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    plan = plan_method(resolved(model_dir), method="draft", options={"model": str(drafter), "k": "3"}, gpus=h100s(2))
    assert plan.args["speculative_config"] == {
        "method": "draft_model", "model": str(drafter.resolve()), "num_speculative_tokens": 3,
    }


def test_heads_that_are_not_installed_are_a_clear_error(model_dir):
    with pytest.raises(PardecUsageError, match="--method eagle needs eagle heads for big-model; none are installed"):
        plan_method(resolved(model_dir), method="eagle", gpus=[])


def test_heads_given_as_a_directory_are_passed_as_is(model_dir, tmp_path):
    plan = plan_method(resolved(model_dir), method="eagle3", options={"heads": str(tmp_path)}, gpus=[])
    assert plan.args["speculative_config"]["model"] == str(tmp_path)


def test_a_method_vllm_lacks_fails_before_the_model_is_resolved():
    with pytest.raises(PardecUsageError, match="closest it runs is ngram"):
        plan_vllm("no-such-model", method="lookahead", options={}, prompt="hi")


@pytest.mark.parametrize("profile", ["code", "chat", "extraction"])
def test_auto_chooses_among_the_methods_vllm_runs(model_dir, profile):
    plan = plan_method(resolved(model_dir), method="auto", prompt="def f(x):", profile=profile, gpus=h100s(8))
    from pardec_cli.vllm_engine.translate import runs_on_vllm

    assert runs_on_vllm(plan.method)
    assert plan.reasons[0].startswith("method    ")
    skipped = next((line for line in plan.reasons if line.startswith("skipped")), "")
    for lacking in ("layerskip", "recycling", "lookahead", "jacobi"):
        if lacking in skipped:
            assert f"{lacking}" in skipped and "vLLM cannot run it here" in skipped


def test_the_serve_side_builds_vllm_serve_from_pardecs_choice(model_dir):
    from pardec_cli.vllm_engine.plan import vllm_serve_command

    command, plan = vllm_serve_command(str(model_dir), method="pld", options={"num_draft": "8"}, port=8080,
                                       gpus=h100s(4), dtype="bfloat16")
    assert command[:3] == ["vllm", "serve", str(model_dir.resolve())]
    assert json.loads(command[command.index("--speculative-config") + 1])["num_speculative_tokens"] == 8
    assert command[command.index("--tensor-parallel-size") + 1] == "4"
    assert command[command.index("--served-model-name") + 1] == str(model_dir)
    assert command[-4:] == ["--host", "127.0.0.1", "--port", "8080"]
    assert plan.method == "pld"


def test_auto_serves_with_the_choice_for_a_profile(model_dir):
    from pardec_cli.vllm_engine.plan import vllm_serve_command
    from pardec_cli.vllm_engine.translate import runs_on_vllm

    command, plan = vllm_serve_command(str(model_dir), profile="code", gpus=h100s(8))
    assert runs_on_vllm(plan.method) and command[1] == "serve"
