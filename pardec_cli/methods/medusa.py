"""Medusa (Cai et al. 2024): extra heads on the target's last hidden state guess the next tokens.

After each verification the loop hands over the target's final hidden state at the
position that produced its own next token (the root of the next draft); head k guesses
the token k + 1 places after that root. The tree is a template of (depth, rank) slots:
the node at depth d with rank r holds head (d - 1)'s r-th most likely token, under its
template parent. Default template: Medusa's published 63-node sparse tree (mc_sim_7b_63,
ordered by how often each slot is accepted), cut to `nodes`; `tree=prior` grows one
best-first from a rank prior instead, `width` wide. The engine verifies it (greedy, or
exact multi-candidate rejection sampling: Medusa's lossy "typical acceptance" is not
offered).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Needs, Outcome, StartContext
from pardec_cli.engine.tree import ROOT, TreeBuilder
from pardec_cli.errors import PardecUsageError
from pardec_cli.heads.medusa import load_medusa
from pardec_cli.methods.base import MethodEnv, ProposerBase
from pardec_cli.methods.heads_support import draft_vocabulary, heads_notes, locate_heads, with_prompt_tokens
from pardec_cli.methods.recycling import tree_template

if TYPE_CHECKING:
    import torch

# Medusa's default tree for Vicuna-7B (FasterDecoding/Medusa, medusa_choices.py): each
# entry is a path of per-head ranks, most often accepted first.
MEDUSA_SPARSE_TREE: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
)  # fmt: skip

TREES = ("sparse", "prior")


def sparse_template(paths: Sequence[tuple[int, ...]], nodes: int, depth: int, width: int) -> list[tuple[int, int]]:
    """(parent template index or ROOT, rank) for the first `nodes` usable paths.

    A path is usable when it is at most `depth` long, its ranks are below `width`, and
    its prefix was taken (so parents always come first).
    """
    index: dict[tuple[int, ...], int] = {}
    template: list[tuple[int, int]] = []
    for path in paths:
        if len(template) >= nodes:
            break
        if len(path) > depth or max(path) >= width or (len(path) > 1 and path[:-1] not in index):
            continue
        index[path] = len(template)
        template.append((index[path[:-1]] if len(path) > 1 else ROOT, path[-1]))
    return template


class Medusa(ProposerBase):
    """Tree drafts from Medusa heads' top-k guesses."""

    name = "medusa"

    def __init__(
        self, env: MethodEnv, *, heads: str, tree: str, nodes: int, width: int, depth: int, draft_vocab: int
    ) -> None:
        if tree not in TREES:
            raise PardecUsageError(f"medusa tree must be one of {', '.join(TREES)}, got {tree!r}")
        if nodes < 1 or width < 1 or depth < 0:
            raise PardecUsageError(f"medusa needs nodes and width >= 1 and depth >= 0, got {nodes}, {width}, {depth}")
        folder = locate_heads(env, "medusa", heads)
        vocab = draft_vocabulary(heads_notes(env, folder), draft_vocab)
        self.heads = load_medusa(folder, env.target, env.model_name, draft_vocab=vocab)
        self.vocab_ids, self.vocab_size = vocab, env.target.vocab_size
        self.folder = folder
        self.depth = min(depth or self.heads.num_heads, self.heads.num_heads)
        self.width = min(width, min(len(v) for v in self.heads.vocabs))
        self.tree = tree
        if tree == "sparse":
            self.template = sparse_template(MEDUSA_SPARSE_TREE, nodes, self.depth, self.width)
        else:
            self.template = tree_template(nodes, self.depth, self.width)
        self.levels = _levels(self.template)
        self.draft_vocab_size = len(vocab) if vocab else 0
        self._state = None  # [h]: the target's final hidden state at the next draft's root

    def start(self, ctx: StartContext) -> None:
        self._state = None
        if self.vocab_ids is not None:
            self.heads.use_vocab(with_prompt_tokens(self.vocab_ids, ctx.prompt_ids, self.vocab_size))

    def needs(self) -> Needs:
        return Needs(feature_layers=(-1,))  # the final, normed hidden state

    def prefilled(self, features: torch.Tensor) -> None:
        self._state = features[-1]

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        if self._state is None or max_tokens < 1:
            return EMPTY_DRAFT
        top = self.heads.top(self._state, self.width).tolist()  # [H, width] target ids
        builder = TreeBuilder(max_depth=max_tokens)
        node_of: list[int | None] = []
        for (parent, rank), level in zip(self.template, self.levels):
            above = ROOT if parent == ROOT else node_of[parent]
            node_of.append(builder.child(above, top[level - 1][rank]))
        return builder.draft() if len(builder) else EMPTY_DRAFT

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        assert outcome.features is not None
        self._state = outcome.features[-1]

    def knobs(self) -> dict[str, Any]:
        return {
            "heads": str(self.folder), "tree": self.tree, "nodes": len(self.template), "width": self.width,
            "depth": self.depth, "draft_vocab": self.draft_vocab_size,
        }  # fmt: skip


def _levels(template: list[tuple[int, int]]) -> list[int]:
    """Depth of every template slot (1: a child of the root)."""
    levels: list[int] = []
    for parent, _ in template:
        levels.append(1 if parent == ROOT else levels[parent] + 1)
    return levels
