"""Count the aten ops a decoding step makes outside the runner's step graph, per method.

On a GPU each such op is a kernel launch (or, for a read of a value, a wait for the GPU);
the step graph itself is one CUDA-graph replay. Runs on the CPU as a proxy: the compiled
runner with CUDA's fixed shapes (padded rows, attention over the whole buffer) and a
`compile_fn` that runs the step eagerly with the count paused.

    python -m devtools.step_ops
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: (method, knobs) timed: plain decoding, a 16-token copy, a 64-node tree, a combination.
METHODS: list[tuple[str, dict[str, Any]]] = [
    ("vanilla", {}), ("pld", {"num_draft": 16}), ("suffix", {"max_nodes": 64}), ("suffix+recycling", {}),
]
#: Ops that read a value back to the host (a wait on a GPU).
HOST_READS = ("_local_scalar_dense", "item", "nonzero", "equal", "is_nonzero")


class OpCounter(TorchDispatchMode):
    """Counts aten ops by name while not `paused`."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.paused:
            self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    from pardec_cli.engine.loop import decode
    from pardec_cli.engine.runner import CompiledLanguageModel
    from pardec_cli.methods import registry
    from pardec_cli.methods.base import MethodEnv
    from tests.test_exactness import FakeTokenizer
    from tests.tiny_models import peaked, tiny_llama

    counter = OpCounter()

    def paused_step(fn: Any, **_: Any) -> Any:
        def step(*args: Any) -> Any:
            counter.paused = True
            try:
                return fn(*args)
            finally:
                counter.paused = False

        return step

    model = peaked(tiny_llama(0, vocab=512, layers=2, hidden=32, max_positions=2048), scale=2.0)
    runner = CompiledLanguageModel(model, compile_fn=paused_step, fixed_shapes=True, native=False)
    prompt = [int(t) for t in torch.randint(3, 500, (64,), generator=torch.Generator().manual_seed(0))] * 4
    for name, knobs in METHODS:
        env = MethodEnv(runner, FakeTokenizer(512), model_name="tiny")
        list(decode(runner, registry.create(name, knobs, env), prompt, max_new_tokens=16))  # builds the graphs
        counter.ops.clear()
        proposer = registry.create(name, knobs, env)
        with torch.inference_mode(), counter:
            events = list(decode(runner, proposer, prompt, max_new_tokens=96))
        steps = len(events) - 1  # after the prefill
        tokens = sum(len(e.tokens) for e in events[1:])
        reads = sum(n for op, n in counter.ops.items() if op in HOST_READS)
        print(f"{name:18s} {tokens / steps:5.2f} tokens/step  {sum(counter.ops.values()) / steps:6.1f} ops/step outside "
              f"the graph, {reads / steps:.2f} host reads/step; most: {counter.ops.most_common(8)}")


if __name__ == "__main__":
    main()
