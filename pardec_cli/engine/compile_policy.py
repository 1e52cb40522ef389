"""When compiling the runner's steps pays back (torch-free, so `pardec doctor` can say it)."""

from __future__ import annotations

#: Tokens after which compiling the step graphs has paid for itself, per device type:
#: the compile time of the graphs over the time saved per one-token step. CPU: measured
#: with `python -m devtools.runner_speed` (SmolLM2-135M, bf16, int4 weights, 2
#: AVX512-bf16 cores, an empty compile cache: 131 s to compile the three graphs, 12.9 ->
#: 6.2 ms per step: 19,600 tokens). CUDA: measured with `python -m devtools.cuda_check`
#: on one H200 (16 cores, torch 2.11, bf16, Llama-3-8B's layers and head, 8 of its layers:
#: 64.8 s to compile the decode and verify graphs with `runner.CUDA_OPTIONS`, 5.62 -> 1.94
#: ms per step: 17,600 tokens; without coordinate descent tuning 28.7 s and 2.14 ms, 8,250,
#: as SmolLM2-135M's 8,100 the session before).
BREAK_EVEN_TOKENS = {"cpu": 19_600, "cuda": 17_600}


#: The same once an earlier run saved the model's precompiled steps (CPU): loading both,
#: not tracing the model, is the cost: 3.4 s against 12.2 ms saved per one-token step
#: (`python -m devtools.runner_speed`, same model and machine): 280 tokens.
BREAK_EVEN_SAVED_TOKENS = {"cpu": 280}


def compile_pays(expected_tokens: int | None, device: str, *, saved: bool = False) -> bool:
    """Whether compiling pays back for a workload of `expected_tokens` generated tokens
    (None: a long-lived session, chat, serve, bench or tune, where it always does);
    `saved`: an earlier run saved this model's compiled steps (loading them is cheaper)."""
    if expected_tokens is None:
        return True
    device_type = device.split(":")[0]
    table = BREAK_EVEN_SAVED_TOKENS if saved and device_type in BREAK_EVEN_SAVED_TOKENS else BREAK_EVEN_TOKENS
    return expected_tokens >= table.get(device_type, BREAK_EVEN_TOKENS["cpu"])
