"""Lookahead decoding (Fu et al. 2024): a 2-D Jacobi window that harvests n-grams, verified in one pass.

Two branches share each target forward, both as parts of one draft tree:

- The lookahead branch is a window of N-1 levels x W columns of Jacobi guesses. Level 0
  is a chain under the root (column j at depth j+1); level l of column j hangs under
  level l-1 of column j, so it sees level 0 up to its column and its own column above it
  (depth j+1+l): exactly the lookahead mask of the paper, expressed as a tree. The
  target's prediction after the newest level becomes the next level; the oldest level
  is dropped, and each column (oldest token, ..., newest, prediction) is an N-gram for
  the pool. Level 0 is itself verified: its converged prefix is accepted like Jacobi's.
- The verification branch: up to G pooled (N-1)-grams that start after the last token,
  merged into a trie under the root.

The pool maps a token to the (N-1)-grams seen after it, most recent kept; with
`prompt_pool` it also collects the n-grams of the prompt and of the output so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Needs, Outcome, StartContext
from pardec_cli.engine.tree import ROOT, TreeBuilder
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import MethodEnv, ProposerBase
from pardec_cli.methods.jacobi import Successors


class NgramPool:
    """token -> up to `per_key` (N-1)-grams that followed it, oldest first."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self.grams: dict[int, dict[tuple[int, ...], None]] = {}

    def add(self, key: int, gram: tuple[int, ...]) -> None:
        grams = self.grams.setdefault(key, {})
        grams.pop(gram, None)  # re-adding moves it to the most recent end
        grams[gram] = None
        if len(grams) > self.per_key:
            del grams[next(iter(grams))]

    def lookup(self, key: int, count: int) -> list[tuple[int, ...]]:
        """The `count` most recent grams after `key`, most recent first."""
        grams = self.grams.get(key)
        return list(reversed(grams))[:count] if grams else []


class Lookahead(ProposerBase):
    """Tree drafts: pooled n-grams plus the Jacobi window, both verified in one forward."""

    name = "lookahead"

    def __init__(self, env: MethodEnv, *, window: int, ngram: int, guesses: int, prompt_pool: bool) -> None:
        del env
        if window < 1 or ngram < 2 or guesses < 0:
            raise PardecUsageError(
                f"lookahead needs window >= 1, ngram >= 2 and guesses >= 0; got {window}, {ngram}, {guesses}"
            )
        self.window, self.ngram, self.guesses, self.prompt_pool = window, ngram, guesses, prompt_pool
        self._reset()

    def _reset(self) -> None:
        self.pool = NgramPool(per_key=max(self.guesses, 1))
        self.levels: list[list[int]] = []  # oldest first; each holds W tokens
        self.cells: list[list[int | None]] = []  # node id of each window token in the last draft
        self.successors = Successors()
        self._pooled_until = 0  # context n-grams ending before this index are pooled

    def start(self, ctx: StartContext) -> None:
        self._reset()

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self.successors.extend_to(context)
        if self.prompt_pool:
            self._pool_context(context)
        if not self.levels:  # level 0 starts as bigram guesses, like Jacobi's window
            self.levels = [self.successors.fill([], context[-1], self.window)]
        builder = TreeBuilder(max_depth=max_tokens)
        for gram in self.pool.lookup(context[-1], self.guesses):
            builder.path(gram)
        # Lookahead branch: level 0 is a chain; level l of column j hangs under level l-1.
        first: list[int | None] = []
        parent: int | None = ROOT
        for token in self.levels[0]:
            parent = builder.child(parent, token)
            first.append(parent)
        self.cells = [first]
        for level in self.levels[1:]:
            above = self.cells[-1]
            self.cells.append([builder.child(node, token) for node, token in zip(above, level)])
        return builder.draft() if len(builder) else EMPTY_DRAFT

    def needs(self) -> Needs:
        return Needs(top_k=1)  # the target's argmax after every window cell: the next level

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        if not len(draft):
            return
        assert outcome.top_tokens is not None
        predicted = outcome.top_tokens[:, 0].tolist()  # [k+1]
        newest = self.levels[-1]
        # A column cut off by the depth cap (near the token limit), or whose node the loop did
        # not verify (`fit_to_tiles` dropped the last one), keeps its old token.
        fresh = [predicted[node + 1] if node is not None and node < len(draft) else old
                 for node, old in zip(self.cells[-1], newest)]  # fmt: skip
        if len(self.levels) < self.ngram - 1:
            self.levels.append(fresh)  # warming up: one more level per step
            return
        for j, token in enumerate(fresh):
            self.pool.add(self.levels[0][j], (*(level[j] for level in self.levels[1:]), token))
        self.levels = [*self.levels[1:], fresh]

    def _pool_context(self, context: Sequence[int]) -> None:
        """Pool every N-gram of the context (prompt and output so far) not pooled yet."""
        n = self.ngram
        for start in range(self._pooled_until, len(context) - n + 1):
            self.pool.add(context[start], tuple(context[start + 1 : start + n]))
        self._pooled_until = max(self._pooled_until, len(context) - n + 1)

    def knobs(self) -> dict[str, Any]:
        return {"window": self.window, "ngram": self.ngram, "guesses": self.guesses, "prompt_pool": self.prompt_pool}
