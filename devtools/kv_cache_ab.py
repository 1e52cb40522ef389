"""A/B of the runner's KV cache dtype: its own (`runner.kv_dtype`) against the model's dtype.

Loads a model as `pardec gen` does (defaults: the embedded SmolLM2-135M, float32, q4q8 on
the AVX2 kernels, the native step) and two runners over the same weights, one keeping its
cache in `kv_dtype` (float16 for q4q8), one in the model's dtype. Then:

- speed: one forward of k new tokens over a `--context`-token cache, the two interleaved k
  by k (`devtools.runner_speed.time_steps`), medians and quartiles;
- accuracy (`--prompts FILE`): the dense float32 model's greedy replies to every `--every`-th
  prompt, teacher-forced through each runner's decoding steps after its prefill; the share
  of positions whose top-1 token is the dense model's, and the mean relative logit error.

    python -m devtools.kv_cache_ab [--context 300,800] [--ks 1,4] [--prompts ../shared/bench/spec_bench_dev.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def agreement(runner: Any, cases: list[tuple[list[int], list[int], Any]]) -> tuple[float, float]:
    """(top-1 agreement, mean relative logit error) of `runner`'s decoding steps along
    (prompt ids, reply ids, reference logits [len(reply), V]) cases."""
    import torch

    agree = total = 0
    error = 0.0
    with torch.inference_mode():
        for ids, reply, reference in cases:
            cache = runner.new_cache(len(ids) + len(reply) + 8)
            rows = [runner.forward(ids, cache, last_only=True)[-1:]]
            rows += [runner.forward([token], cache) for token in reply[:-1]]
            logits = torch.cat(rows)
            agree += int((logits.argmax(-1) == reference.argmax(-1)).sum())
            total += len(reply)
            error += float((logits - reference).norm() / reference.norm())
    return agree / max(total, 1), error / max(len(cases), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None)
    parser.add_argument("--context", default="300,800")
    parser.add_argument("--ks", default="1,4")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--prompts", default=None, help="Spec-Bench JSONL: also measure accuracy against dense float32")
    parser.add_argument("--every", type=int, default=8, help="take every N-th prompt of --prompts")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    import torch

    from devtools.runner_speed import time_steps
    from pardec_cli import api
    from pardec_cli.engine.runner import CompiledLanguageModel

    session = api.load(args.model, dtype="float32", compile="auto", weights="auto")
    ours = session.target
    if not isinstance(ours, CompiledLanguageModel):
        raise SystemExit("this model does not run on the compiled runner here")
    theirs = CompiledLanguageModel(ours.model)
    theirs.kv_dtype = ours.dtype
    names = {f"cache {ours.kv_dtype}".replace("torch.", ""): ours, f"cache {theirs.kv_dtype}".replace("torch.", ""): theirs}
    print(f"{session.model_name}: {session.weights} weights, native step {'on' if ours.native is not None else 'off'}")
    for context in (int(c) for c in args.context.split(",")):
        rows = time_steps(names, context, [int(k) for k in args.ks.split(",")], args.repeats, warmup=4)
        for row in rows:
            cells = "  ".join(f"{name} {row[name][1]:.2f} ms ({row[name][0]:.2f}-{row[name][2]:.2f})" for name in names)
            a, b = (row[name][1] for name in names)
            print(f"context {context:4d}, {row['k']} rows: {cells}; {b / a:.3f}x")
    if args.prompts:
        texts = [json.loads(line)["turns"][0] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        dense = api.load(args.model, dtype="float32", compile="off", weights="full")
        cases = []
        for text in texts[:: args.every][: args.limit]:
            messages = [{"role": "user", "content": text}]
            ids = list(dense.encode(messages))
            reply = api.generate(dense, messages, method="vanilla", max_tokens=args.tokens, temperature=0.0)
            out = dense.tokenizer.encode(reply.text, add_special_tokens=False)
            with torch.no_grad():
                reference = dense.target.model(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1]
            cases.append((ids, out, reference))
        for name, runner in names.items():
            share, error = agreement(runner, cases)
            print(f"{name}: top-1 agreement with dense float32 {share:.4f} over {sum(len(c[1]) for c in cases)} positions; "
                  f"mean relative logit error {error:.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
