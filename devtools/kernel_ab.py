"""The native step built from edited copies of pardec's AVX2 source, timed against the installed one in one process.

    python -m devtools.kernel_ab VARIANT.cpp [MORE.cpp ...] [--rows 1,4] [--rounds 5] [--context 300]

Each variant is a copy of pardec_cli/data/avx2_kernels.cpp with a change in it. It is built
under an op namespace of its own (pardec_avx2b, pardec_avx2c, ...; into a folder of the
kernels' cache named after its text, so an unchanged variant is built once) and loaded beside
the installed library. Every library gets the same ``LlamaWeights`` arguments
(`engine.native.weight_args`) and the same KV cache, filled by a prefill of `--context`
tokens; then a chain of R new rows after that cache (`llama_step` as plain decoding and
drafted chains call it) is timed through each library in turn, step by step, so that every
library sees the same machine. Prints whether each variant's logits are the installed
library's bit for bit, then per round and row count the installed step's median and each
variant's median over it.

Why one process: on a shared 2-core VM, whole runs alternated in separate processes moved by
5-10% from run to run; interleaved here, a copy of the installed source stays within about
1.5% of it (docs/runner.md, "Int8 records in one pass"). Needs a CPU with AVX2 and a model that
takes the native step (the embedded model does, with the default weights).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path
from time import perf_counter
from typing import Any

NAMESPACE = "pardec_avx2"
PROMPT = "Write a long story about a dragon who learns to code in Python and builds a compiler. "


def build_variant(source: Path, index: int, root: Path) -> str:
    """Build `source` with its op namespace renamed (pardec_avx2 -> pardec_avx2b for index 0,
    c for 1, ...) into a folder under `root` named after the renamed text; returns the namespace."""
    import torch.utils.cpp_extension as cpp

    from pardec_cli import kernels
    from pardec_cli.hardware import cpu_info

    namespace = NAMESPACE + "bcdefgh"[index]
    text = source.read_text(encoding="utf-8").replace(NAMESPACE, namespace)
    folder = root / f"ab-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernels.cpp").write_text(text, encoding="utf-8")
    library = kernels.avx2_library(cpu_info().flags)
    cpp.load(name=namespace, sources=[str(folder / "kernels.cpp")], build_directory=str(folder),
             extra_cflags=list(library.cflags), extra_ldflags=list(library.ldflags), is_python_module=False)  # fmt: skip
    return namespace


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", type=Path, help="edited copies of pardec_cli/data/avx2_kernels.cpp (up to 7)")
    parser.add_argument("-m", "--model", default=None)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--rows", default="1,4", help="rows of the timed steps, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="one-row steps per library a round (fewer for more rows)")
    parser.add_argument("--context", type=int, default=300)
    args = parser.parse_args()
    if len(args.variants) > 7:
        sys.exit("at most 7 variants")
    missing = [str(v) for v in args.variants if not v.is_file()]
    if missing:
        sys.exit(f"no such file: {', '.join(missing)}")
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        sys.exit(f"--rows takes whole numbers separated by commas, not {args.rows!r}")
    if min(rows) < 1:
        sys.exit("--rows must be 1 or more")
    if args.context < max(rows):
        sys.exit(f"--context must be at least the most rows timed ({max(rows)})")

    import torch

    from pardec_cli import api
    from pardec_cli.engine.native import weight_args
    from pardec_cli.home import kernels_dir

    session = api.load(args.model, weights=args.weights)
    runner = session.target
    native = getattr(runner, "native", None)
    if native is None:
        sys.exit(f"{session.model_name} does not run the native step here (runner: {session.runner})")
    names = [build_variant(v, i, kernels_dir()) for i, v in enumerate(args.variants)]
    constructor = weight_args(runner.model)
    libraries: list[tuple[str, Any, Any]] = [("installed", torch.ops.pardec_avx2.llama_step, torch.classes.pardec_avx2.LlamaWeights(*constructor))]
    for variant, namespace in zip(args.variants, names):
        libraries.append((variant.name, getattr(torch.ops, namespace).llama_step, getattr(torch.classes, namespace).LlamaWeights(*constructor)))

    ids = session.encode(PROMPT * (args.context // 15 + 1))[: args.context]
    cache = runner.new_cache(len(ids) + max(rows) + 8)
    with torch.inference_mode():
        runner.forward_rows(ids, cache)
    buffers = cache.buffers()
    for _, _, weights in libraries:
        weights.set_cache([k for k, _ in buffers], [v for _, v in buffers])
    start = cache.length
    cos, sin = native.rope_tables(start + max(rows) + 1)
    no_positions, no_mask = torch.empty(0, dtype=torch.long), torch.empty(0)
    chains = {count: torch.tensor(ids[-count:]) for count in rows}  # made once, outside the timed steps

    def step(op: Any, weights: Any, count: int) -> torch.Tensor:
        # rows start..start+count-1 as a chain over the cache (each library rewrites the same rows alike)
        return op(weights, chains[count], cos, sin, no_positions, no_mask, start, None, 0, start + count)

    print(f"{session.model_name}, {session.runner} step, {session.held_weights} weights, a {start}-token cache", flush=True)
    with torch.inference_mode():
        for count in rows:
            reference = step(libraries[0][1], libraries[0][2], count)
            same = ", ".join(f"{label} {'yes' if torch.equal(reference, step(op, w, count)) else 'NO'}" for label, op, w in libraries[1:])
            print(f"{_rows(count)}, the same logits: {same}", flush=True)
        for round_ in range(args.rounds):
            cells = []
            for count in rows:
                times: list[list[float]] = [[] for _ in libraries]
                for _ in range(max(8, args.steps // count)):
                    for (_, op, weights), spent in zip(libraries, times):
                        began = perf_counter()
                        step(op, weights, count)
                        spent.append(perf_counter() - began)
                medians = [statistics.median(t) * 1e3 for t in times]
                ratios = ", ".join(f"{label} {m / medians[0]:.3f}x" for (label, _, _), m in zip(libraries[1:], medians[1:]))
                cells.append(f"{_rows(count)} {medians[0]:.2f} ms: {ratios}")
            print(f"round {round_ + 1}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
