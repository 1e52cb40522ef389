"""Verification rules: which drafted nodes the target keeps, and its own next token.

Both rules take the target's output for the inputs [root, node 0, ..., node k-1]: row 0
predicts the token after the last context token (the root), row i+1 the token after
node i. A chain is the tree where node i hangs under node i-1, so one walk serves both:
start at the root; among the children of the current node, keep one (or none) by the
rule below; move to it and repeat; the target's own token after the last kept node is
the bonus.

- Greedy: keep the child whose token is the argmax of the current row (siblings hold
  distinct tokens, so at most one matches). Output equals plain greedy decoding exactly.
- Sampling (Leviathan et al. / Chen et al. 2023 for one child; SpecInfer's multi-candidate
  rule, Miao et al. 2024, for several): p is the target's distribution at the current row.
  Try the children in order: keep child c with probability min(1, p(c) / q_c(c)); after a
  rejection replace p by norm(max(0, p - q_c)). q_c is the distribution c was drawn from,
  or a point mass on c for deterministic drafts (then the residual is p with c removed).
  If every child is rejected (or there are none), the bonus is sampled from the current
  p. The emitted tokens are distributed exactly as sampling from the target one token at
  a time, whatever the tree.

Each node gets one uniform number, drawn up front for the whole draft; a chain of k
tokens consumes the generator exactly like the classic chain rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from pardec_cli.engine.proposal import Draft
from pardec_cli.engine.sampling import greedy_token, sample_from
from pardec_cli.engine.tree import children_by_row


@dataclass(frozen=True)
class Verdict:
    """accepted: how many drafted tokens were kept; tokens: those plus the target's next token;
    path: the kept nodes' indices in the draft, root first."""

    accepted: int
    tokens: tuple[int, ...]
    path: tuple[int, ...] = ()


class Rows(Protocol):
    """Target distributions (or logits) by input row: a [k+1, V] tensor, `LazyRows` or `HeadRows`."""

    def __getitem__(self, row: int) -> torch.Tensor: ...


class LazyRows:
    """Processed target distributions computed only for the rows a walk visits.

    A tree of 64 nodes has 65 rows but a walk reads a handful; top-p sorts each row over
    the whole vocabulary, so computing all of them would cost more than the walk.
    """

    def __init__(self, logits: Rows, process: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._logits, self._process = logits, process
        self._done: dict[int, torch.Tensor] = {}

    def __getitem__(self, row: int) -> torch.Tensor:
        probs = self._done.get(row)
        if probs is None:
            probs = self._done[row] = self._process(self._logits[row])
        return probs


class HeadRows:
    """A step's logits [n, V] whose head runs for the rows read: the first tile's, then the rest.

    A walk reads a few of a draft's rows (the kept path and the bonus row), and a large
    vocabulary's head is a fifth to a quarter of a CPU step (SmolLM2's 49k words: 7.7 of
    31 ms at 16 rows on AVX2; docs/runner.md). Reading a row of the first `tile` computes
    those rows (one pass over the head's weights costs about the same for a tile's rows as
    for one); reading a row past them computes every other row in one more pass (a walk
    that got that far often goes further, and each pass reads the whole head from memory).
    `head` must give each row the same logits whatever rows come with it.
    """

    def __init__(self, normed: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], tile: int) -> None:
        self._normed, self._head, self._tile = normed, head, max(1, tile)  # normed: [n, E] final-normed rows
        self._parts: dict[int, torch.Tensor] = {}  # first row (0 or tile) -> logits of its rows [rows, V]
        self._readers: dict[int, Callable[[int], int]] = {}  # first row -> its part's `greedy_reader`

    def __len__(self) -> int:
        return int(self._normed.shape[0])

    def _part_of(self, row: int) -> tuple[int, int, torch.Tensor]:
        """(the first row of `row`'s part, `row`'s offset in it, the part's logits)."""
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} of {len(self)}")
        row %= len(self)
        first = 0 if row < self._tile else self._tile
        logits = self._parts.get(first)
        if logits is None:
            rows = self._normed[:first + self._tile] if first == 0 else self._normed[first:]
            logits = self._parts[first] = self._head(rows)
        return first, row - first, logits

    def __getitem__(self, row: int) -> torch.Tensor:
        """Row `row`'s logits [V]."""
        _, offset, logits = self._part_of(row)
        return logits[offset]

    def argmax(self, row: int) -> int:
        """The greedy token of row `row` (as `greedy_reader` reads a tensor's rows)."""
        first, offset, logits = self._part_of(row)
        read = self._readers.get(first)
        if read is None:
            read = self._readers[first] = greedy_reader(logits, all_rows=False)
        return read(offset)

    def computed(self) -> int:
        """How many rows' logits were computed so far."""
        return sum(int(part.shape[0]) for part in self._parts.values())


def greedy_reader(logits: torch.Tensor, *, all_rows: bool | None = None) -> Callable[[int], int]:
    """row -> the greedy token of that row of `logits` [n, V]. `all_rows`: take every row's
    argmax at once (None: off a CPU).

    On a CPU the argmax is taken only for the rows read (a walk's kept path and bonus row):
    over a 49k vocabulary it costs ~0.01 ms per row (`greedy_token`), which a tree of 32
    nodes would otherwise pay for every node. On an accelerator it is one kernel for every
    row and one transfer, where each row read would wait for its own.
    """
    if all_rows is None:
        all_rows = logits.device.type != "cpu"
    if all_rows:
        return logits.float().argmax(-1).tolist().__getitem__
    # float32 on a CPU: numpy's view of every row, one torch call for the step rather than
    # `greedy_token`'s four per row read (~40 us less per step with the caches flushed by
    # the step's weights, docs/runner.md); numpy's argmax is what `greedy_token` takes too.
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        table = (logits.detach() if logits.requires_grad else logits).numpy()
        return lambda row: int(table[row].argmax())
    return lambda row: greedy_token(logits[row])


def verify_greedy(draft: Draft, logits: torch.Tensor | HeadRows, *, all_rows: bool | None = None) -> Verdict:
    """logits: [k+1, V] (or `HeadRows`) for the inputs [root, *draft.tokens]; each row's
    greedy token is read as `greedy_reader` reads it (`all_rows` its option)."""
    tokens = draft.tokens
    children = children_by_row(draft.parents, len(tokens))
    path: list[int] = []
    row = 0
    read = logits.argmax if isinstance(logits, HeadRows) else greedy_reader(logits, all_rows=all_rows)
    while True:
        want = read(row)
        for child in children[row]:
            if tokens[child] == want:
                path.append(child)
                row = child + 1
                break
        else:
            return Verdict(len(path), (*(tokens[i] for i in path), want), tuple(path))


def verify_sampling(draft: Draft, target_probs: Rows, generator: torch.Generator | None) -> Verdict:
    """Exact speculative sampling over a chain or a tree.

    target_probs: the processed target distribution (temperature/top-k/top-p) per input
    row, [k+1, V] float32 or `LazyRows`. draft.probs: [k, V] (q of each node) or None for
    a deterministic draft.
    """
    tokens, q_all = draft.tokens, draft.probs
    k = len(tokens)
    if k == 0:
        return Verdict(0, (sample_from(target_probs[0], generator),))
    children = children_by_row(draft.parents, k)
    uniforms = torch.rand(k, generator=generator).tolist()  # one per node, drawn up front
    path: list[int] = []
    row = 0
    p = target_probs[0]
    private = False  # whether p is a residual this function may edit in place
    while True:
        kept = None
        for child in children[row]:
            token = tokens[child]
            q = q_all[child] if q_all is not None else None
            q_token = float(q[token]) if q is not None else 1.0
            if uniforms[child] < min(1.0, float(p[token]) / q_token):
                kept = child
                break
            # Rejected: p <- norm(max(0, p - q)); q is a point mass on `token` when deterministic.
            if q is not None:
                residual = torch.clamp(p - q, min=0.0)
            else:
                residual = p if private else p.clone()
                residual[token] = 0.0
            total = float(residual.sum())
            if total <= 0.0:
                break  # only when p == q, so rejection had probability 0: guard against rounding
            p, private = residual / total, True
        if kept is None:
            break  # every child rejected, or a leaf: the bonus comes from the current p
        path.append(kept)
        row = kept + 1
        p, private = target_probs[row], False
    return Verdict(len(path), (*(tokens[i] for i in path), sample_from(p, generator)), tuple(path))
