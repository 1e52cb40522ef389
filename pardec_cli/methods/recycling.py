"""Token recycling (Luo et al. 2024, "Turning Trash into Treasure"): drafts from the target's own leftovers.

Every verification forward scores many tokens and throws most of the scores away. Token
recycling keeps them: an adjacency table stores, for each token, the target's top-k next
tokens the last time it was an input. A draft tree is read from the table by a fixed
template that starts at the last context token: the template's node of rank r under a
node holding token t holds table[t][r]. After the forward, the table rows of every input
(root and all nodes; in a combination, every part's nodes) are overwritten with the fresh top-k.

The template is the `nodes` most promising (depth <= `depth`, rank < `topk`) positions
under a prior where rank r is right with probability ~ 0.5 * 0.55^r, independently per
level; it is computed once. The table starts empty (then the first steps draft little),
is seeded with the prompt's bigrams where it knows nothing, and persists across the
generations of this proposer (a session's method keeps it warm from one prompt to the
next). It is not shared between proposers: a benchmark that runs several methods on the
same prompt must not let one learn that prompt's continuations from another.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Needs, Outcome, StartContext
from pardec_cli.engine.tree import ROOT, TreeBuilder
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import MethodEnv, ProposerBase

RANK_PRIOR_FIRST, RANK_PRIOR_DECAY = 0.5, 0.55


def tree_template(nodes: int, depth: int, topk: int) -> list[tuple[int, int]]:
    """(parent template index or -1, rank) of the `nodes` best positions, parents first.

    Best-first over the prior path probability (a product of per-rank priors), so a node
    always comes after its parent and a wider tree spends its budget where it pays.
    """
    prior = [RANK_PRIOR_FIRST * RANK_PRIOR_DECAY**rank for rank in range(topk)]
    template: list[tuple[int, int]] = []
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, order, parent, rank, depth)
    order = 0
    for rank in range(topk):
        heapq.heappush(heap, (-prior[rank], order, ROOT, rank, 1))
        order += 1
    while heap and len(template) < nodes:
        score, _, parent, rank, level = heapq.heappop(heap)
        index = len(template)
        template.append((parent, rank))
        if level < depth:
            for child_rank in range(topk):
                heapq.heappush(heap, (score * prior[child_rank], order, index, child_rank, level + 1))
                order += 1
    return template


class TokenRecycling(ProposerBase):
    """Tree drafts read from an adjacency table of the target's recent top-k predictions."""

    name = "recycling"
    dry_runs = True  # reads its table; learns only from the step's inputs

    def __init__(self, env: MethodEnv, *, topk: int, nodes: int, depth: int) -> None:
        if topk < 1 or nodes < 1 or depth < 1:
            raise PardecUsageError(f"recycling needs topk, nodes and depth >= 1, got {topk}, {nodes}, {depth}")
        topk = min(topk, env.target.vocab_size)
        self.topk, self.nodes, self.depth = topk, nodes, depth
        self.template = tree_template(nodes, depth, topk)
        # table[t]: the target's top-k next tokens the last time t was an input (-1: unknown).
        self.table = np.full((env.target.vocab_size, topk), -1, dtype=np.int32)

    def start(self, ctx: StartContext) -> None:
        # Seed rows the table knows nothing about with the prompt's bigrams (rank 0).
        prompt = np.asarray(ctx.prompt_ids, dtype=np.int64)
        if len(prompt) > 1:
            firsts, seconds = prompt[:-1], prompt[1:]
            unknown = self.table[firsts, 0] < 0
            self.table[firsts[unknown], 0] = seconds[unknown]

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        builder = TreeBuilder(max_depth=max_tokens)
        table = self.table
        node_of: list[int | None] = []  # template index -> node id (None: pruned)
        token_of: list[int] = []
        root = context[-1]
        for parent, rank in self.template:
            if parent == ROOT:
                above, above_token = ROOT, root
            else:
                above, above_token = node_of[parent], token_of[parent]
            token = int(table[above_token, rank]) if above is not None else -1
            node_of.append(builder.child(above, token) if token >= 0 else None)
            token_of.append(token)
        return builder.draft() if len(builder) else EMPTY_DRAFT

    def needs(self) -> Needs:
        return Needs(top_k=self.topk)  # every input's fresh row of the table

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        # Every input of the step (in a combination, the other parts' nodes too) gets its fresh row.
        assert outcome.step_top_tokens is not None
        inputs = np.asarray(outcome.step_inputs, dtype=np.int64)
        self.table[inputs] = outcome.step_top_tokens[:, : self.topk].cpu().numpy()

    def knobs(self) -> dict[str, Any]:
        return {"topk": self.topk, "nodes": self.nodes, "depth": self.depth}
