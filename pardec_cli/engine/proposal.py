"""The contract between the decoding loop and the methods (proposers).

A proposer guesses the tokens that follow the context; the loop verifies the guess with
one target forward and reports back how much of it was kept. That is all a method is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from pardec_cli.engine.model import LanguageModel
    from pardec_cli.engine.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """A proposed continuation of the context (a chain of k tokens).

    `probs` is the proposer's own distribution for each drafted token, [k, V] float32,
    when it sampled them from one (a draft model under sampling): speculative sampling
    then accepts token i with min(1, p/q). None means the tokens were chosen
    deterministically (a point mass q), which the verification rule handles exactly too.
    """

    tokens: tuple[int, ...] = ()
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft()


@dataclass(frozen=True)
class StartContext:
    """What a proposer learns once per generation, before the first step."""

    target: LanguageModel
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    generator: Any  # torch.Generator | None: the generation's private RNG


class Proposer(Protocol):
    """A decoding method. Implementations live in `pardec_cli.methods`."""

    #: Registry name, e.g. "pld".
    name: str
    #: False only for methods that never draft (vanilla): they run on caches that
    #: cannot be rolled back.
    needs_rollback: bool

    def start(self, ctx: StartContext) -> None:
        """Reset per-generation state. Called before the prefill."""

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        """Guess up to `max_tokens` tokens that follow `context` (prompt + output so far)."""

    def update(self, context: Sequence[int], draft: Draft, accepted: int) -> None:
        """Learn that the first `accepted` tokens of `draft` were kept.

        `context` is the new context, already extended with the accepted tokens and the
        target's own next token.
        """

    def knobs(self) -> dict[str, Any]:
        """The settings in effect, for stats, `--explain` and the benchmark tables."""
