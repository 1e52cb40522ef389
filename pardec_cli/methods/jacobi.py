"""Jacobi decoding (Santilli et al. 2023; Song et al. 2021): iterate a window to its fixed point.

Keep a window of W guesses for the next tokens. Each step verifies the window as a chain
in the target's one forward; that same forward gives the target's prediction after every
guess, which becomes the next iteration's guess for the following position. A prefix that
stops changing is the fixed point: plain greedy decoding would produce it, and it is
accepted. New slots at the end of the window are filled with the token that last followed
the previous one in the context (a bigram guess), which converges faster than noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Needs, Outcome, StartContext
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import MethodEnv, ProposerBase


class Successors:
    """For each token, the token that followed its latest occurrence in a growing context."""

    def __init__(self) -> None:
        self.next: dict[int, int] = {}
        self._seen = 0

    def extend_to(self, context: Sequence[int]) -> None:
        for i in range(max(self._seen - 1, 0), len(context) - 1):
            self.next[context[i]] = context[i + 1]
        self._seen = len(context)

    def fill(self, guesses: list[int], after: int, length: int) -> list[int]:
        """Extend `guesses` (which follow token `after`) to `length` tokens by bigram guesses."""
        last = guesses[-1] if guesses else after
        while len(guesses) < length:
            last = self.next.get(last, last)
            guesses.append(last)
        return guesses


class Jacobi(ProposerBase):
    """Chain drafts: the window of the previous Jacobi iteration, verified each step."""

    name = "jacobi"

    def __init__(self, env: MethodEnv, *, window: int) -> None:
        del env
        if window < 1:
            raise PardecUsageError(f"jacobi needs window >= 1, got {window}")
        self.window = window
        self.guesses: list[int] = []
        self.successors = Successors()

    def start(self, ctx: StartContext) -> None:
        self.guesses = []
        self.successors = Successors()

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        k = min(self.window, max_tokens)
        if k <= 0:
            return EMPTY_DRAFT
        self.successors.extend_to(context)
        return Draft(tuple(self.successors.fill(self.guesses[:k], context[-1], k)))

    def needs(self) -> Needs:
        return Needs(top_k=1)  # the target's argmax after every window token: the next iteration

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        # Row a+1 is the target's next token after the first rejected guess, which sits
        # where the bonus token now is: the new guess for the position after the bonus.
        assert outcome.top_tokens is not None
        predicted = outcome.top_tokens[:, 0].tolist()  # [k+1]
        self.guesses = predicted[outcome.accepted + 1 :]

    def knobs(self) -> dict[str, Any]:
        return {"window": self.window}
