"""Hand generation to vLLM, with pardec's choice of method (`--engine vllm`).

pardec decodes one request at a time on one device; vLLM runs the same kinds of
speculative decoding batched, across GPUs and nodes. This package keeps what pardec is
for (choosing the method and its knobs, finding the model and its accelerators in
pardec's store) and gives vLLM the rest:

    translate.py  pardec method + knobs -> vLLM's `speculative_config` (one table; pure)
    launch.py     parallel sizes, `vllm.EngineArgs` keywords, the `vllm serve` command line (pure)
    plan.py       the model, its accelerators and the method resolved from the store (no vLLM)
    runner.py     vLLM's engine, imported lazily: streamed text and speculative metrics

Only `runner.py` imports vLLM, and only when a command runs with `--engine vllm`.
"""
