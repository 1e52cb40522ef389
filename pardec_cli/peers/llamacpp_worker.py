"""A llama.cpp worker process: `python -m pardec_cli.peers.llamacpp_worker`.

It speaks JSON lines: one request per line on stdin, one reply per line on stdout.

    {"op": "load", "model": PATH, "n_ctx": N, "n_threads": T, "n_batch": B}
        -> {"ok": true, "version": "0.3.36", "n_vocab": V, "n_ctx": N, "n_threads": T, "n_batch": B}
    {"op": "generate", "tokens": [ids...], "max_tokens": M, "stop": [ids...]}
        -> {"ok": true, "tokens": [ids...], "seconds": S}
    anything that fails -> {"ok": false, "error": "one line"}

`generate` is greedy (temperature 0, no repetition penalty) from a cleared state: the
prompt is evaluated in full every time (no prefix reuse, as pardec's runs have none), and
generation stops after `max_tokens` tokens or at the first `stop` token (kept). `seconds`
is timed here, around the generation alone, so the pipe costs llama.cpp nothing.

llama.cpp's native code may print to stdout; the protocol therefore keeps its own copy of
the stdout descriptor and points descriptor 1 at stderr.
"""

from __future__ import annotations

import json
import os
import sys
from time import perf_counter
from typing import Any, TextIO


def _generate(llm: Any, tokens: list[int], max_tokens: int, stop: set[int]) -> dict[str, Any]:
    llm.reset()  # forget the previous prompt: no KV prefix reuse between runs
    out: list[int] = []
    start = perf_counter()
    if max_tokens > 0:
        for token in llm.generate(tokens, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if token in stop or len(out) >= max_tokens:
                break
    return {"ok": True, "tokens": out, "seconds": perf_counter() - start}


def _load(request: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import llama_cpp

    n_batch = int(request["n_batch"])
    llm = llama_cpp.Llama(
        model_path=str(request["model"]), n_ctx=int(request["n_ctx"]), n_threads=int(request["n_threads"]),
        n_threads_batch=int(request["n_threads"]), n_batch=n_batch, n_ubatch=n_batch, verbose=False,
    )
    return llm, {
        "ok": True, "version": llama_cpp.__version__, "n_vocab": llm.n_vocab(), "n_ctx": llm.n_ctx(),
        "n_threads": int(request["n_threads"]), "n_batch": llm.n_batch,
    }


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer requests until stdin closes or an {"op": "exit"} arrives."""
    llm = None
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "exit":
                return
            if op == "load":
                llm, reply = _load(request)
            elif op == "generate":
                if llm is None:
                    raise RuntimeError("no model loaded")
                reply = _generate(llm, [int(t) for t in request["tokens"]], int(request["max_tokens"]),
                                  {int(t) for t in request.get("stop", [])})
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # the reply carries it; the client raises a PardecError
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray native prints go to stderr
    serve(sys.stdin, protocol)


if __name__ == "__main__":
    main()
