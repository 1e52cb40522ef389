"""When compiling the runner's steps pays back (torch-free, so `pardec doctor` can say it)."""

from __future__ import annotations

#: Tokens after which compiling the two step graphs has paid for itself, per device type:
#: the compile time of both graphs (warm on-disk caches) over the time saved per token.
#: Measured with `python -m pardec_cli.devtools.runner_speed`; see docs/runner.md.
BREAK_EVEN_TOKENS = {"cpu": 4096, "cuda": 4096}


def compile_pays(expected_tokens: int | None, device: str) -> bool:
    """Whether compiling pays back for a workload of `expected_tokens` generated tokens
    (None: a long-lived session, chat, serve, bench or tune, where it always does)."""
    if expected_tokens is None:
        return True
    device_type = device.split(":")[0]
    return expected_tokens >= BREAK_EVEN_TOKENS.get(device_type, BREAK_EVEN_TOKENS["cpu"])
