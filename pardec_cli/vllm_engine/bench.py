"""`pardec bench --engine vllm`: the same prompts and methods, decoded by vLLM.

vLLM takes its speculative method when the engine starts, so the prompts are grouped by
the engine keywords their method needs (a named method: one group; `auto`: one per
distinct choice), and each group runs on its own engine after a warm-up request. The
runs are `pardec_cli.bench.Run` records, so the same tables report them: with
`--engine pardec,vllm` next to pardec's own engine's (labelled `vllm:METHOD`). vLLM runs
after pardec's, not interleaved: on a GPU, vLLM reserves most of its memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

from pardec_cli.bench import AUTO, BenchPrompt, MethodChoice, Run


def vllm_runs(
    resolved: Any,
    prompts: Sequence[BenchPrompt],
    choices: Sequence[MethodChoice],
    *,
    max_new_tokens: int,
    profile: str = AUTO,
    dtype: str = "auto",
    offline: bool | None = None,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    label_prefix: str = "",
    progress: Callable[[int, int, BenchPrompt], None] | None = None,
) -> list[Run]:
    """Greedy runs of every method in `choices` on every prompt, through vLLM.

    Methods vLLM lacks fail before any engine starts (the translation's error names the
    closest one it has). Labels are the choices' labels behind `label_prefix`.
    """
    from pardec_cli.vllm_engine.plan import plan_method, require_vllm

    require_vllm()
    # engine keywords (as JSON) -> (plan, [(label, prompt, what auto chose)])
    groups: dict[str, tuple[Any, list[tuple[str, BenchPrompt, str | None]]]] = {}
    for choice in choices:
        label = label_prefix + choice.label
        # A named method plans alike for every prompt; auto chooses per prompt.
        planned = prompts if choice.name == AUTO else prompts[:1]
        for prompt in planned:
            plan = plan_method(
                resolved, method=choice.name, options=choice.options, prompt=prompt.text, profile=profile,
                dtype=dtype, offline=offline, tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
            )
            jobs = groups.setdefault(json.dumps(plan.args, sort_keys=True), (plan, []))[1]
            if choice.name == AUTO:
                jobs.append((label, prompt, plan.method))
            else:
                jobs += [(label, p, None) for p in prompts]
    runs: list[Run] = []
    total = sum(len(jobs) for _, jobs in groups.values())
    for plan, jobs in groups.values():
        runs += _run_group(plan, jobs, max_new_tokens, progress, done=len(runs), total=total)
    return runs


def _run_group(plan: Any, jobs: list[tuple[str, BenchPrompt, str | None]], max_new_tokens: int,
               progress: Callable[[int, int, BenchPrompt], None] | None, *, done: int, total: int) -> list[Run]:
    from pardec_cli.session import encode_prompt
    from pardec_cli.vllm_engine.runner import VllmEngine

    engine = VllmEngine(plan.args)
    try:
        encoded = [(label, prompt, chosen, encode_prompt(engine.tokenizer, prompt.text)) for label, prompt, chosen in jobs]
        if encoded:  # warm-up: compiled shapes, allocator
            _generate(engine, encoded[0][3], 8)
        runs = []
        for label, prompt, chosen, ids in encoded:
            start = perf_counter()
            stream = _generate(engine, ids, max_new_tokens)
            seconds = perf_counter() - start
            s = stream.stats
            runs.append(Run(label, prompt.prompt_id, prompt.category, s.generated_tokens, seconds, s.steps,
                            s.drafted_tokens, s.accepted_tokens, list(stream.token_ids), chosen))
            if progress:
                progress(done + len(runs), total, prompt)
        return runs
    finally:
        engine.close()


def _generate(engine: Any, ids: list[int], max_new_tokens: int) -> Any:
    stream = engine.stream(ids, max_tokens=max_new_tokens)
    for _ in stream:
        pass
    return stream
