"""Time the compiled step with the dense output head against `quant.Int8Head`, side by side.

Loads the model three times with `--weights int4` (the CPU default for a GGUF-backed
model): with the dense tied head put back, with `Int8Head` on ``torch._int_mm``, and with
`Int8Head` on oneDNN's prepacked int8 matmul (what loads where it is available); builds a compiled runner for each
(saved steps load; missing ones compile once), fills each cache with a `--context`-token
prompt and times forwards of k new tokens, the runners interleaved round by round.

    python -m devtools.head_speed [-m MODEL] [--context 300] [--repeats 20] [--ks 1,4,16,32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from time import perf_counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--ks", default="1,4,16,32")
    args = parser.parse_args()

    import torch
    from torch import nn

    from pardec_cli.engine.cache import rollback_to
    from pardec_cli.engine.runner import CompiledLanguageModel
    from pardec_cli.quant import Int8Head
    from pardec_cli.session import Session, compiled_steps_dir

    runners = {}
    for name in ("dense head", "int8 _int_mm", "int8 oneDNN"):
        model = Session.load(args.model, dtype="bfloat16", device="cpu", compile="off", weights="int4").target.model
        head = model.get_output_embeddings()
        if not isinstance(head, Int8Head):
            sys.exit("this model did not load with the int8 head (not on a CPU, or not a linear head)")
        if name == "dense head":
            dense = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
            dense.weight, dense.bias = head.weight, head.bias
            model.set_output_embeddings(dense)
        elif name == "int8 _int_mm":
            dense = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
            dense.weight, dense.bias = head.weight, head.bias
            model.set_output_embeddings(Int8Head(dense, prepack=False))
        elif head.kernel == "_int_mm":
            sys.exit("oneDNN's int8 matmul is not available here, or slower than _int_mm (the head runs on _int_mm)")
        runner = CompiledLanguageModel(model, step_dir=compiled_steps_dir(), compile_missing=True,
                                       on_notice=lambda m: print(m, file=sys.stderr))  # fmt: skip
        runner.warm()
        runners[name] = runner
    prompt = torch.randint(100, 1000, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        caches = {}
        for name, runner in runners.items():
            caches[name] = runner.new_cache(args.context + 128)
            runner.forward(prompt, caches[name], last_only=True)
        for k in (int(k) for k in args.ks.split(",")):
            times: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(args.repeats + 2):
                for name, runner in runners.items():
                    began = perf_counter()
                    runner.forward(list(range(200, 200 + k)), caches[name])
                    times[name].append((perf_counter() - began) * 1e3)
                    rollback_to(caches[name], args.context)
            print(f"k={k:3d}  " + "  ".join(f"{name} {statistics.median(v[2:]):6.2f} ms" for name, v in times.items()),
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
