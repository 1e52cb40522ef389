"""Measure the verification cost curve: forward time of n new tokens over a realistic context.

The context is `context_tokens` tokens of a built-in tuning prompt, prefilled once;
each measurement feeds n tokens on top of it as a draft tree (a chain written with the
tree mask, the way tree methods verify) and rolls the cache back. Every n is measured
`repeats` times, in rounds of every n still due in shuffled order (so machine drift does
not fall on one n), and the fastest time is kept: on a shared machine the minimum is the
most repeatable figure.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pardec_cli.selection.costmodel import CURVE_POINTS, CostCurve


def measure_curve(
    session: Any,
    context_ids: Sequence[int],
    *,
    points: Sequence[int] = CURVE_POINTS,
    repeats: int | Mapping[int, int] = 3,
    on_point: Callable[[int, int], None] | None = None,
    budget_s: float | None = None,
) -> CostCurve:
    """Time one forward of each n in `points` after `context_ids` on `session`'s model,
    `repeats` times (or `repeats[n]` times), in rounds of every n still due (each round
    shuffled); each n keeps its fastest.

    With `budget_s`, no round starts once the timed forwards have taken that long: every n
    is timed at least once, and a slow step (an eager float32 one on a small CPU) is not
    timed dozens of times. `on_point(done, total)` is called after each timing (progress;
    `total` assumes every round). A KeyboardInterrupt propagates: a half-measured curve is
    not kept.
    """
    import torch

    from pardec_cli.engine.cache import rollback_to
    from pardec_cli.hardware import synchronize_device

    target = session.target
    context = list(context_ids)
    longest = max(*points, 4)  # the warm-up below feeds 4 tokens
    filler = (context * (longest // max(len(context), 1) + 1))[:longest]  # tokens to feed: their values do not matter
    due = {n: repeats[n] if isinstance(repeats, Mapping) else repeats for n in points}
    rounds = [[n for n in points if due[n] > r] for r in range(max(due.values(), default=0))]
    shuffler = random.Random(0)
    for order in rounds:
        shuffler.shuffle(order)
    total, done, spent = sum(due.values()), 0, 0.0
    best: dict[int, float] = {}
    with torch.inference_mode():
        cache = target.new_cache()
        target.forward(context, cache, last_only=True)
        target.forward(filler[:4], cache, parents=(-1, 0, 1))  # warm-up: kernels, allocator
        rollback_to(cache, len(context))
        for order in rounds:
            if budget_s is not None and best and spent >= budget_s:
                break
            for n in order:
                parents = tuple(range(-1, n - 2)) if n > 1 else None
                # On a GPU the forward returns once launched: each is timed to its end (a
                # CUDA-graph replay's launch alone read the same for 1 and 64 rows).
                synchronize_device(target.device)
                start = time.perf_counter()
                target.forward(filler[:n], cache, parents=parents)
                synchronize_device(target.device)
                elapsed = time.perf_counter() - start
                rollback_to(cache, len(context))
                best[n] = min(best.get(n, float("inf")), elapsed * 1000)
                spent += elapsed
                done += 1
                if on_point:
                    on_point(done, total)
    day = time.strftime("%Y-%m-%d")
    return CostCurve.from_mapping(best, f"measured by pardec tune on {day}, {len(context)}-token context")


#: Where `measure_step_curve` measures (as `pardec tune`: a realistic decoding position)
#: and at which sizes: the draft sizes auto weighs, in whole row tiles (`engine.proposal.fit_to_tiles`).
STEP_CURVE_CONTEXT_TOKENS = 300
STEP_CURVE_POINTS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
_CONTEXT_TEXT = ("The quick brown fox jumps over the lazy dog while the farmer counts his sheep, "
                 "and the river carries the last leaves of autumn down to the sea. ")  # fmt: skip


def plain_context(session: Any, tokens: int = STEP_CURVE_CONTEXT_TOKENS) -> list[int]:
    """`tokens` token ids of plain prose (no chat template) to measure steps after."""
    return session.encode(_CONTEXT_TEXT * (tokens // 20 + 1), raw=True)[:tokens]


#: How often `measure_step_curve` times each size: most often the few-millisecond sizes
#: auto's drafts usually verify, whose ratios to one token decide its first choice (with
#: 2 timings each a busy machine's slow one-token step made 4 tokens look cheap; docs/adaptive.md).
STEP_CURVE_REPEATS: dict[int, int] = {1: 8, 2: 8, 4: 8, 8: 3, 16: 2, 32: 2}


#: The longer text after which `measure_step_curve` times 1 and `STEP_CURVE_LONG_ROWS`
#: rows again, for what each row costs per token of text (`CostCurve.row_ms_per_1k`).
STEP_CURVE_LONG_CONTEXT_TOKENS = 1500
STEP_CURVE_LONG_ROWS = 8


#: The forwards `measure_step_curve` times at most this long (seconds), and it measures the
#: longer text only when the first text's prefill and timings took less: a fast step (4 ms)
#: fits every repeat in a fraction of it; an eager float32 step on a 2-core AVX2 CPU (80 ms)
#: took 13 s with every repeat.
STEP_CURVE_BUDGET_S = 1.5


def measure_step_curve(session: Any, *, repeats: int | Mapping[int, int] = STEP_CURVE_REPEATS,
                       budget_s: float = STEP_CURVE_BUDGET_S) -> CostCurve:
    """The cost curve of `session`'s own steps (its runner, dtype and weights), measured in
    about two seconds: for `--method auto` where `pardec tune` never ran (`Session.auto_selector`).
    Besides the curve after `STEP_CURVE_CONTEXT_TOKENS` tokens, 1 and 8 rows after
    `STEP_CURVE_LONG_CONTEXT_TOKENS` (where the model's context holds them and the steps are
    fast enough to measure within `budget_s`): the rows' extra cost there over the 7 rows'
    extra cost at the curve, per row and 1000 tokens."""
    started = time.monotonic()
    curve = measure_curve(session, plain_context(session), points=STEP_CURVE_POINTS, repeats=repeats, budget_s=budget_s)
    day = time.strftime("%Y-%m-%d")
    per_1k = 0.0
    limit = session.target.max_context
    long_tokens = STEP_CURVE_LONG_CONTEXT_TOKENS
    in_time = time.monotonic() - started < budget_s
    if in_time and (limit is None or long_tokens + STEP_CURVE_LONG_ROWS < limit):
        rows = STEP_CURVE_LONG_ROWS
        long = measure_curve(session, plain_context(session, long_tokens), points=(1, rows), repeats=3)
        grown = (long.ms(rows) - long.ms(1)) - (curve.ms(rows) - curve.ms(1))
        per_1k = max(grown / (rows - 1), 0.0) / ((long_tokens - STEP_CURVE_CONTEXT_TOKENS) / 1000)
    return CostCurve(curve.points, f"measured on {day} by the first auto run of these {session.step_kind} steps",
                     context_tokens=STEP_CURVE_CONTEXT_TOKENS, row_ms_per_1k=per_1k)
