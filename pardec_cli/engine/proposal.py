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
    """A proposed continuation of the context: a chain of k tokens, or a tree of k nodes.

    `parents` is None for a chain (token i follows token i-1). For a tree, node i holds
    `tokens[i]` and hangs under `parents[i]`: -1 for the last context token (the root) or
    an earlier node (parents[i] < i). Siblings are tried in node order; deterministic
    siblings should hold distinct tokens (a repeat is wasted work).
    `pardec_cli.engine.tree.TreeBuilder` builds such trees, merging shared prefixes.

    `probs` is the proposer's own distribution for each drafted token, [k, V] float32,
    when it sampled them from one (a draft model under sampling; siblings drawn
    independently): speculative sampling then accepts token i with min(1, p/q). None
    means the tokens were chosen deterministically (a point mass q), which the
    verification rule handles exactly too.
    """

    tokens: tuple[int, ...] = ()
    probs: torch.Tensor | None = None
    parents: tuple[int, ...] | None = None
    #: Which configuration drafted it, when a proposer switches between several
    #: (`methods.adaptive`); the loop copies it into the step's event. Empty otherwise.
    arm: str = ""

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    @classmethod
    def tree(cls, tokens: Sequence[int], parents: Sequence[int]) -> Draft:
        """A draft from (token, parent) lists; a tree that is a chain becomes a plain chain."""
        tokens, parents = tuple(int(t) for t in tokens), tuple(int(p) for p in parents)
        if len(tokens) != len(parents):
            raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents")
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must be -1 or an earlier node")
        if all(parent == i - 1 for i, parent in enumerate(parents)):
            return cls(tokens)
        return cls(tokens, parents=parents)

    def without_last(self) -> Draft:
        """The draft less its last node (a leaf: parents come before their children)."""
        if not self.tokens:
            return self
        probs = None if self.probs is None else self.probs[:-1]
        if self.parents is None:
            return Draft(self.tokens[:-1], probs, None, self.arm)
        shorter = Draft.tree(self.tokens[:-1], self.parents[:-1])  # a tree left with one branch is a chain
        return Draft(shorter.tokens, probs, shorter.parents, self.arm)


EMPTY_DRAFT = Draft()


def fit_to_tiles(draft: Draft, tile: int) -> Draft:
    """`draft` less its last node when that node alone would start a new tile of rows.

    A step verifies the root and the draft's nodes, 1 + k rows; a target whose matmuls
    compute rows in tiles (`LanguageModel.row_tile`) pays nearly a whole tile for one row
    past a tile's end, more than that row's best case (one more token of 1 + k) adds. The
    output is unchanged: what is verified is still verified exactly.
    """
    rows = len(draft) + 1
    if tile > 1 and rows > tile and rows % tile == 1:
        return draft.without_last()
    return draft


@dataclass(frozen=True)
class Outcome:
    """What the target made of a draft, for the proposer to learn from.

    accepted: how many drafted tokens were kept; path: their node indices, root first
    (a chain keeps (0, ..., accepted-1)).

    For proposers whose `needs().top_k` is above 0 (else these are None / empty):
    top_tokens: [k+1, top_k] long, the target's most likely next tokens, best first,
    after the root (row 0) and after each node of this draft (row i+1), kept or not:
    Jacobi and lookahead iterate on them. step_inputs / step_top_tokens: every input of
    the step's forward (root first) and its row of top tokens; the same as the draft's
    unless the draft was one part of a combination, whose other parts' nodes the target
    scored too: token recycling learns from all of them.

    For proposers whose `needs().feature_layers` name some (else None):
    features: [1 + accepted, F], the target's hidden states (as `feature_layers` asks) at
    the root and at each kept node, root first: the positions whose next token became
    known in this step (the last row produced the target's own next token). Medusa reads
    the last row; EAGLE feeds all of them to its draft layer.

    forward_s: seconds the target's forward over the root and this draft took with the
    verdict, by the loop's clock; None where no such step was timed for this proposer
    alone (an idle arm of adaptive decoding, a part of a combination).
    """

    accepted: int
    path: tuple[int, ...] = ()
    top_tokens: torch.Tensor | None = None
    step_inputs: tuple[int, ...] = ()
    step_top_tokens: torch.Tensor | None = None
    features: torch.Tensor | None = None
    forward_s: float | None = None


@dataclass(frozen=True)
class Needs:
    """What a proposer asks the loop to compute for it, beyond the verdict (read once per generation).

    top_k: how many of the target's top next tokens per verified position go into
    `Outcome.top_tokens` / `step_top_tokens` (0: none, and nothing is computed).
    feature_layers: the target's hidden states the proposer reads (indices into
    transformers' `hidden_states`: 0 the embeddings, i the input of layer i, -1 the final
    normed state; see `LanguageModel.forward_features`). The loop takes them from its own
    forwards (no second pass): those of every prompt position once, to
    `Proposer.prefilled(features [P, F])`, and those of the kept path in `Outcome.features`.
    """

    top_k: int = 0
    feature_layers: tuple[int, ...] = ()

    @classmethod
    def union(cls, needs: Sequence[Needs]) -> Needs:
        """What a proposer wrapping others needs: the widest top-k, every layer any of them reads."""
        layers = tuple(dict.fromkeys(layer for need in needs for layer in need.feature_layers))
        return cls(max((need.top_k for need in needs), default=0), layers)


NO_NEEDS = Needs()


@dataclass(frozen=True)
class StartContext:
    """What a proposer learns once per generation, before the first step."""

    target: LanguageModel
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    generator: Any  # torch.Generator | None: the generation's private RNG


class Proposer(Protocol):
    """A decoding method. Implementations live in `pardec_cli.methods` (their base class
    `methods.base.ProposerBase` gives `needs`, `prefilled` and `needs_rollback` defaults).

    The loop calls, per generation: `needs()` once, `start`, `prefilled` (only when
    `needs().feature_layers` names some), then per step `propose` and, right after the
    target verified that draft, `update`. A proposer wrapping others (`methods.combine`,
    `methods.adaptive`) may also call a part's `update` with `EMPTY_DRAFT` for a step
    that part did not draft: it then only learns the new context (and `step_inputs`,
    `step_top_tokens`, `features`, which describe the step whoever drafted it).
    """

    #: Registry name, e.g. "pld".
    name: str
    #: False only for methods that never draft (vanilla): they run on caches that
    #: cannot be rolled back.
    needs_rollback: bool
    #: True when `propose` is cheap (no model forward) and may be called without its draft
    #: being verified: the next `update` (with `EMPTY_DRAFT`) finds the proposer consistent.
    #: `methods.adaptive` then scores an idle arm's would-be drafts against the tokens that
    #: followed, instead of running it to see whether it pays.
    dry_runs: bool

    def needs(self) -> Needs:
        """What the loop must compute for this proposer (`NO_NEEDS`: nothing)."""

    def start(self, ctx: StartContext) -> None:
        """Reset per-generation state. Called before the prefill."""

    def prefilled(self, features: torch.Tensor) -> None:
        """The prompt's hidden states [P, F] (the layers `needs().feature_layers` names),
        once, right after the prefill; not called when it names none."""

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        """Guess what follows `context` (prompt + output so far): a chain of at most
        `max_tokens` tokens, or a tree whose paths are at most that long (deeper nodes
        are wasted work: they can never be emitted)."""

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        """Learn which nodes of `draft` were kept (`outcome.path`).

        `context` is the new context, already extended with the accepted tokens and the
        target's own next token.
        """

    def knobs(self) -> dict[str, Any]:
        """The settings in effect, for stats, `--explain` and the benchmark tables."""
