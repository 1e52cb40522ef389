"""How vLLM is started for pardec's choice: parallel sizes, engine keywords, `vllm serve`.

`engine_args` gives the keywords of `vllm.EngineArgs` (what `pardec gen/bench --engine
vllm` start in-process); `serve_command` the same settings as a `vllm serve` command
line (vLLM's OpenAI-compatible server, the API `pardec serve` also speaks):
`pardec serve --engine vllm` runs that command. Both are pure, so they are unit-tested
without vLLM (and without a GPU).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pardec_cli.errors import PardecUsageError
from pardec_cli.vllm_engine.translate import Translation

RAY = "ray"


@dataclass(frozen=True)
class Parallel:
    """vLLM's parallel layout: `tensor` x `pipeline` GPUs in all; `backend` is "ray" when
    that is more GPUs than this machine has (the rest are on other nodes of a Ray cluster)."""

    tensor: int = 1
    pipeline: int = 1
    backend: str | None = None

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline


def parallel_sizes(
    gpu_count: int, *, attention_heads: int | None = None, tensor: int | None = None, pipeline: int | None = None,
) -> Parallel:
    """Tensor and pipeline parallel sizes from the GPUs found here, or from the flags.

    Not given: every GPU is used, the widest tensor split first. vLLM shards attention
    heads across tensor-parallel ranks, so the tensor size must divide the head count;
    the GPUs left over become pipeline stages (6 GPUs, 32 heads: 2 x 3). One given: the
    other fills this machine's GPUs (or is 1). Sizes multiplying to more GPUs than this
    machine has mean a multi-node run: vLLM needs Ray for that (backend "ray").
    """
    for name, value in (("--tensor-parallel", tensor), ("--pipeline-parallel", pipeline)):
        if value is not None and value < 1:
            raise PardecUsageError(f"{name} must be at least 1, got {value}")
    gpus = max(gpu_count, 0)

    def divides_heads(t: int) -> bool:
        return attention_heads is None or attention_heads % t == 0

    if tensor is None and pipeline is None:
        if gpus <= 1:
            return Parallel()
        tensor = max(t for t in range(1, gpus + 1) if gpus % t == 0 and divides_heads(t))
        pipeline = gpus // tensor
    elif tensor is None:
        assert pipeline is not None
        per_stage = gpus // pipeline if gpus >= pipeline else 1
        tensor = max(t for t in range(1, max(per_stage, 1) + 1) if per_stage % t == 0 and divides_heads(t))
    elif pipeline is None:
        pipeline = 1
    if not divides_heads(tensor):
        raise PardecUsageError(
            f"--tensor-parallel {tensor} does not divide the model's {attention_heads} attention heads",
            hint="vLLM splits the heads evenly across tensor-parallel GPUs; pick a divisor, and "
            "--pipeline-parallel for the rest",
        )
    backend = RAY if gpus and tensor * pipeline > gpus else None
    return Parallel(tensor, pipeline, backend)


def engine_args(
    model_path: str,
    translation: Translation,
    parallel: Parallel,
    *,
    served_name: str | None = None,
    dtype: str = "auto",
    seed: int | None = None,
    max_model_len: int | None = None,
) -> dict[str, Any]:
    """`vllm.EngineArgs(**engine_args(...))` for pardec's choice.

    The model and its accelerators are local directories from pardec's store, so vLLM
    downloads nothing. Statistics stay on: the speculative decoding counters (drafts,
    drafted and accepted tokens, acceptance per position) are what `--stats` reports.
    """
    args: dict[str, Any] = {
        "model": str(model_path),
        "dtype": dtype,
        "tensor_parallel_size": parallel.tensor,
        "pipeline_parallel_size": parallel.pipeline,
        "disable_log_stats": False,
    }
    if served_name:
        args["served_model_name"] = served_name
    if parallel.backend:
        args["distributed_executor_backend"] = parallel.backend
    if translation.speculative_config is not None:
        args["speculative_config"] = dict(translation.speculative_config)
    if seed is not None:
        args["seed"] = seed
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    return args


# Engine keywords that have no meaning for `vllm serve` (it logs its stats anyway).
_NOT_FOR_SERVE = {"model", "disable_log_stats"}


def serve_command(
    args: Mapping[str, Any], *, host: str = "127.0.0.1", port: int = 8000, extra: Sequence[str] = (),
) -> list[str]:
    """The `vllm serve` command line for `engine_args(...)`: the model positionally, then
    one `--flag value` per keyword (vLLM's flags are its keywords with dashes), the
    speculative config as JSON, then `extra` (flags passed through untouched).

    `pardec serve --engine vllm` runs this command, so clients of either server see
    the same OpenAI-compatible API.
    """
    command = ["vllm", "serve", str(args["model"])]
    for key, value in args.items():
        if key in _NOT_FOR_SERVE or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                command.append(flag)
        elif isinstance(value, Mapping):
            command += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            command += [flag, str(value)]
    command += ["--host", host, "--port", str(port), *extra]
    return command


def format_command(command: Sequence[str]) -> str:
    """A command line to paste into a shell (the JSON quoted)."""
    return shlex.join(command)
