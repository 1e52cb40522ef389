"""Measure the compiled runner against the eager step: compile time, step time, break-even.

Loads one model, compiles the runner's graphs (decode, verify, verify-wide) and then times one
forward of k new tokens over a `--context`-token cache, eager (`LanguageModel`, dynamic
cache) and compiled, interleaved k by k so that machine drift hits both alike. Prints
per k the median and the interquartile range of each, and the break-even: compile
seconds over the time saved per one-token step (the number behind
`engine.runner.BREAK_EVEN_TOKENS`). Run it twice to see a warm on-disk cache.

    python -m devtools.runner_speed [-m MODEL] [--dtype bfloat16] [--weights auto] [--context 300] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from time import perf_counter
from typing import Any


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def time_steps(lms: dict[str, Any], context: int, ks: list[int], repeats: int, *, warmup: int = 2,
               sync: Callable[[], None] = lambda: None,
               on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> list[dict[str, Any]]:  # fmt: skip
    """Per k: (first quartile, median, third quartile) milliseconds of one forward of k new
    tokens over a `context`-token cache for each `LanguageModel` in `lms`, interleaved k by k
    (machine drift hits all alike), after `warmup` untimed rounds; `sync` waits for the
    device before each clock read (CUDA); `on_row` gets each k's row as it is measured."""
    import torch

    from pardec_cli.engine.cache import rollback_to

    prompt = torch.randint(100, 1000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    with torch.inference_mode():
        caches = {}
        for name, lm in lms.items():
            caches[name] = lm.new_cache(context + 128)
            lm.forward(prompt, caches[name], last_only=True)
        for k in ks:
            inputs = list(range(200, 200 + k))
            times: dict[str, list[float]] = {name: [] for name in lms}
            for _ in range(repeats + warmup):
                for name, lm in lms.items():
                    sync()
                    t0 = perf_counter()
                    lm.forward(inputs, caches[name])
                    sync()
                    times[name].append((perf_counter() - t0) * 1000)
                    rollback_to(caches[name], context)
            rows.append({"k": k, **{name: _quartiles(values[warmup:]) for name, values in times.items()}})
            on_row(rows[-1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--weights", default="auto", help="full, int8, int4 or auto (as --weights)")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--ks", default="1,2,4,8,16,32,64")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()

    from pardec_cli.engine.model import LanguageModel
    from pardec_cli.session import Session

    def load(compile: str) -> tuple[Session, float]:
        began = perf_counter()
        session = Session.load(args.model, dtype=args.dtype, device="cpu", compile=compile, weights=args.weights,
                               notice=lambda m: print(m, file=sys.stderr))  # fmt: skip
        return session, perf_counter() - began

    _, eager_load_s = load("off")
    # A compiled load compiles (or loads the saved) steps: its time over an eager load's.
    compiled, compiled_load_s = load("on")
    compile_s = max(compiled_load_s - eager_load_s, 0.0)
    target = compiled.target
    eager = LanguageModel(target.model)

    def show(row: dict[str, Any]) -> None:
        print(f"k={row['k']:3d}  eager {row['eager'][1]:7.1f} ms ({row['eager'][0]:.1f}-{row['eager'][2]:.1f})  "
              f"compiled {row['compiled'][1]:7.1f} ms ({row['compiled'][0]:.1f}-{row['compiled'][2]:.1f})  "
              f"x{row['eager'][1] / row['compiled'][1]:.2f}", flush=True)

    rows = time_steps({"eager": eager, "compiled": target}, args.context, [int(k) for k in args.ks.split(",")], args.repeats, on_row=show)
    one = rows[0] if rows and rows[0]["k"] == 1 else None
    saved_ms = one["eager"][1] - one["compiled"][1] if one else float("nan")
    break_even = compile_s / (saved_ms / 1000) if saved_ms > 0 else float("inf")
    origins = sorted({state.origin for state in target.graph_states().values()})
    print(f"{' and '.join(origins)} (all graphs) {compile_s:.1f} s; saved per one-token step {saved_ms:.1f} ms; "
          f"break-even {break_even:.0f} tokens")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": compiled.model_name, "dtype": args.dtype, "context": args.context, "compile_s": compile_s, "origins": origins,
                       "rows": rows, "break_even_tokens": break_even}, f, indent=1)


if __name__ == "__main__":
    main()
