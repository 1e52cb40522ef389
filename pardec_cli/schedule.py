"""How bench and tune measure, shared so their numbers mean the same: one warm-up rule and
one interleaving schedule. Torch-free; below both in the layers (neither imports the other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

P = TypeVar("P")

# Every configuration first decodes this many tokens once, unmeasured: allocator, kernel
# and cache warm-up (and the compiled runner's graphs) stay out of every timed run. The
# warm-up's proposer is then dropped and timed runs use a new one: methods remember
# replies (suffix drafting's history), and would copy the warm-up's start of the prompt.
WARM_UP_TOKENS = 8


def interleaved(labels: Sequence[str], prompts: Sequence[P]) -> list[tuple[int, P, str]]:
    """(prompt index, prompt, label) in measuring order: prompt by prompt, every label on
    it, the order rotated one place per prompt, so slow drift of the machine (heat,
    other load) falls on every label alike. `pardec tune` and `pardec bench` share it."""
    order = list(labels)
    schedule = []
    for index, prompt in enumerate(prompts):
        shift = index % len(order)
        schedule += [(index, prompt, label) for label in order[shift:] + order[:shift]]
    return schedule
