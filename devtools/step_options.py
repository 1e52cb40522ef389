"""A/B of inductor options for the precompiled steps: today's options against today's plus a change.

Loads one model, takes its runner with today's `PRECOMPILE_OPTIONS` ("base") and a second
runner over the same weights compiled with the options updated by a JSON object ("exp";
`null` restores an option's default), saved under a scratch directory. Then times one
forward of k new tokens over a `--context`-token cache, the two interleaved step by
step, and prints per k the medians and whether the logits are identical.

    python -m devtools.step_options '{"realize_opcount_threshold": null}' [--ks 1,4,16] [--dtype bfloat16] [--weights int4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("options", help='inductor options to change, as JSON (e.g. \'{"cpp_wrapper": true}\')')
    parser.add_argument("-m", "--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--weights", default="int4", help="full, int8, int4 or auto (as --weights)")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--ks", default="1,4,16")
    args = parser.parse_args()

    import torch

    from pardec_cli.engine import runner
    from pardec_cli.engine.cache import rollback_to
    from pardec_cli.session import Session

    def notice(message: str) -> None:
        print(message, file=sys.stderr)

    base = Session.load(args.model, dtype=args.dtype, device="cpu", compile="on", weights=args.weights, notice=notice).target
    base.warm()
    changed = {**runner.PRECOMPILE_OPTIONS, **json.loads(args.options)}
    ks = [int(k) for k in args.ks.split(",")]
    prompt = torch.randint(100, 1000, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    with tempfile.TemporaryDirectory() as scratch, torch.inference_mode():
        # The fingerprint of a saved step includes the options: exp never loads base's steps.
        runner.PRECOMPILE_OPTIONS.clear()
        runner.PRECOMPILE_OPTIONS.update({k: v for k, v in changed.items() if v is not None})
        exp = runner.CompiledLanguageModel(base.model, on_notice=notice, step_dir=Path(scratch))
        caches = {}
        began = perf_counter()
        for name, lm in (("base", base), ("exp", exp)):
            caches[name] = lm.new_cache(args.context + 128)
            lm.forward(prompt, caches[name], last_only=True)
            for k in ks:  # compiles exp's graphs
                lm.forward(list(range(200, 200 + k)), caches[name])
                rollback_to(caches[name], args.context)
        print(f"exp compiled in {perf_counter() - began:.0f} s", file=sys.stderr)
        for k in ks:
            inputs = list(range(200, 200 + k))
            times: dict[str, list[float]] = {"base": [], "exp": []}
            logits = {}
            for _ in range(args.repeats + 3):
                for name, lm in (("base", base), ("exp", exp)):
                    t0 = perf_counter()
                    logits[name] = lm.forward(inputs, caches[name])
                    times[name].append((perf_counter() - t0) * 1000)
                    rollback_to(caches[name], args.context)
            b, e = (statistics.median(times[n][3:]) for n in ("base", "exp"))
            print(f"k={k:3d}  base {b:6.2f} ms  exp {e:6.2f} ms  x{b / e:.3f}  identical logits: {torch.equal(logits['base'], logits['exp'])}", flush=True)


if __name__ == "__main__":
    main()
