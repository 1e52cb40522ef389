"""Draft trees: the shape the loop verifies, its attention mask and positions, and a builder.

A draft is n candidate nodes after the context. Node i holds `tokens[i]` and hangs under
`parents[i]`: -1 for the root (the last context token, fed as the first input of the
step) or an earlier node (parents[i] < i, so the node order is topological). A chain is
the tree whose parents are (-1, 0, 1, ..., n-2).

The target sees the inputs [root, node 0, ..., node n-1] (row r = node r-1). Each input
attends to the whole cache and to its own ancestors (itself included), and sits at
position `past + depth`, so every node is scored exactly as if its root-to-node path had
been decoded one token at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from pardec_cli.engine.proposal import Draft

ROOT = -1


def children_by_row(parents: Sequence[int] | None, n: int) -> list[list[int]]:
    """children[r]: the nodes under input row r (row 0 = root, row i+1 = node i), in node order."""
    children: list[list[int]] = [[] for _ in range(n + 1)]
    if parents is None:
        for i in range(n):
            children[i].append(i)
        return children
    for i, parent in enumerate(parents):
        children[parent + 1].append(i)
    return children


def kept_along(draft: Draft, following: Sequence[int]) -> int | None:
    """How many nodes of `draft` greedy verification keeps when the target's tokens are
    `following` (what came after the root, in order); None while `following` is too
    short to tell. The walk of `engine.verify.verify_greedy`, with the tokens known."""
    children = children_by_row(draft.parents, len(draft.tokens))
    row = kept = 0
    while children[row]:
        if kept >= len(following):
            return None
        row = next((child + 1 for child in children[row] if draft.tokens[child] == following[kept]), -1)
        if row < 0:
            return kept
        kept += 1
    return kept


def depths(parents: Sequence[int]) -> list[int]:
    """depth of each node: 1 for a child of the root."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent == ROOT else out[parent] + 1)
    return out


def ancestor_matrix(parents: Sequence[int]) -> np.ndarray:
    """[n+1, n+1] bool: entry (r, c) is True when input c is input r or one of its ancestors."""
    n = len(parents)
    seen: np.ndarray = np.zeros((n + 1, n + 1), dtype=bool)
    seen[0, 0] = True
    for i, parent in enumerate(parents):
        row = seen[i + 1]
        row[:] = seen[parent + 1]
        row[i + 1] = True
    return seen


def tree_attention(
    parents: Sequence[int], past: int, *, dtype: torch.dtype, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4-D additive attention mask and the position ids for one tree step.

    past: positions already in the cache (the root goes at position `past`).
    Returns mask [1, 1, n+1, past+n+1] (0 where attending, the dtype's minimum elsewhere;
    transformers passes a 4-D mask to the attention unchanged) and position_ids [1, n+1].
    """
    n = len(parents)
    allowed = torch.from_numpy(ancestor_matrix(parents))  # [n+1, n+1]
    mask = torch.zeros((1, 1, n + 1, past + n + 1), dtype=dtype)
    mask[0, 0, :, past:].masked_fill_(~allowed, torch.finfo(dtype).min)
    positions = torch.tensor([[past, *(past + d for d in depths(parents))]], dtype=torch.long)
    return mask.to(device), positions.to(device)


class TreeBuilder:
    """Grows a draft tree as a trie: adding a token that a node already has as a child
    returns that child, so paths from several sources share their common prefixes.

    `max_nodes` caps the size (adds beyond it return None), `max_depth` the path length
    (deeper adds return None). Node ids are the indices of the finished draft.
    """

    def __init__(self, *, max_nodes: int | None = None, max_depth: int | None = None) -> None:
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self._depth: list[int] = []
        self._child: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def full(self) -> bool:
        return self.max_nodes is not None and len(self.tokens) >= self.max_nodes

    def child(self, parent: int | None, token: int) -> int | None:
        """The node for `token` under `parent` (ROOT or a node), created if needed; None if
        the parent is None (a dropped node) or the node would exceed the caps."""
        if parent is None:
            return None
        node = self._child.get((parent, token))
        if node is not None:
            return node
        depth = 1 if parent == ROOT else self._depth[parent] + 1
        if self.full or (self.max_depth is not None and depth > self.max_depth):
            return None
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self._depth.append(depth)
        self._child[(parent, token)] = node
        return node

    def path(self, tokens: Iterable[int], parent: int = ROOT) -> list[int]:
        """Add a path of tokens under `parent`; returns the node ids it got (shorter when capped)."""
        ids: list[int] = []
        node: int | None = parent
        for token in tokens:
            node = self.child(node, token)
            if node is None:
                break
            ids.append(node)
        return ids

    def graft(self, tokens: Sequence[int], parents: Sequence[int] | None) -> list[int | None]:
        """Add a whole tree (chain when parents is None); returns each of its nodes' id here."""
        ids: list[int | None] = []
        for i, token in enumerate(tokens):
            parent = (i - 1 if i else ROOT) if parents is None else parents[i]
            ids.append(self.child(ROOT if parent == ROOT else ids[parent], token))
        return ids

    def draft(self) -> Draft:
        """The finished draft (a plain chain when the tree has one branch)."""
        return Draft.tree(self.tokens, self.parents)
