"""Measure one forward of a model with full, int8 and int4 weights: the data behind
`pardec_cli.weight_modes.AUTO_CPU` (what `--weights auto` picks on a CPU).

Loads the model once per (dtype, weights), fills a KV cache with a `--context`-token
prompt, then times forwards of 1 and 16 new tokens, interleaving every configuration
round after round for `--seconds` so that a busy machine slows them all alike; prints
the median and the fastest time of each.

    python -m devtools.measure_weights [-m MODEL] [--threads 2] [--seconds 120]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None, help="model spec (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args()

    import torch

    from pardec_cli.engine.cache import cache_keyword
    from pardec_cli.store.loading import load_model
    from pardec_cli.store.resolve import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model(args.model).path
    models = {(dtype, mode): load_model(path, dtype=dtype, device="cpu", weights=mode)[0]
              for dtype in args.dtypes.split(",") for mode in ("full", "int8", "int4")}  # fmt: skip
    context = torch.randint(0, 1000, (1, args.context))
    times: dict[tuple[str, str, int], list[float]] = {(*key, k): [] for key in models for k in (1, 16)}
    with torch.no_grad():
        caches = {key: model(context, use_cache=True)[cache_keyword(model)] for key, model in models.items()}
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            for key, model in models.items():
                for k in (1, 16):
                    new = torch.randint(0, 1000, (1, k))
                    start = time.perf_counter()
                    model(new, use_cache=True, **{cache_keyword(model): caches[key]})
                    times[(*key, k)].append(time.perf_counter() - start)
                    caches[key].crop(-k)  # back to the context
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    for (dtype, mode, k), values in times.items():
        values.sort()
        print(f"{dtype:9} {mode:5} k={k:<3} median {values[len(values) // 2] * 1000:7.1f} ms   "
              f"fastest {values[0] * 1000:7.1f} ms   ({len(values)} runs)")  # fmt: skip


if __name__ == "__main__":
    main()
