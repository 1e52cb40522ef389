"""A stand-in for `pardec_cli/peers/llamacpp_worker.py`: the same JSON-lines protocol,
no llama.cpp. Run as a script; FAKE_LLAMACPP_MODE (an environment variable, set by the
test) picks its behaviour:

    ok             answer every request
    crash-batched  die of SIGSEGV on `generate` when loaded with n_batch > 1 (as
                   llama-cpp-python 0.3.36 did on an AMX CPU)
    crash-always   die of SIGSEGV on every `generate`
    error          answer `generate` with {"ok": false}

Its generation is deterministic: token i is (last prompt token + i + 1) % 1000, up to
max_tokens or a stop id. Every request is appended to FAKE_LLAMACPP_LOG when set.
"""

from __future__ import annotations

import json
import os
import signal
import sys

MODE = os.environ.get("FAKE_LLAMACPP_MODE", "ok")
LOG = os.environ.get("FAKE_LLAMACPP_LOG")


def main() -> None:
    n_batch = None
    for line in sys.stdin:
        request = json.loads(line)
        if LOG:
            with open(LOG, "a", encoding="utf-8") as log:
                log.write(line)
        if request["op"] == "load":
            n_batch = request["n_batch"]
            reply = {"ok": True, "version": "0.0-fake", "n_vocab": 1 << 20, "n_ctx": request["n_ctx"],
                     "n_threads": request["n_threads"], "n_batch": n_batch}
        elif request["op"] == "generate":
            if MODE == "crash-always" or (MODE == "crash-batched" and n_batch > 1):
                print("ggml: about to crash", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGSEGV)
            if MODE == "error":
                reply = {"ok": False, "error": "ValueError: Requested tokens exceed context window"}
            else:
                out = []
                for i in range(request["max_tokens"]):
                    out.append((request["tokens"][-1] + i + 1) % 1000)
                    if out[-1] in request["stop"]:
                        break
                reply = {"ok": True, "tokens": out, "seconds": 0.001 * len(out)}
        else:
            reply = {"ok": False, "error": f"unknown op {request['op']!r}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
