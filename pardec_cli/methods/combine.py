"""Several proposers drafting into one tree (`--method suffix+recycling`), verified in one pass.

Each part proposes as if alone; their drafts are merged into one trie (shared prefixes
become shared nodes), so the target scores every candidate of every part in the same
forward and the verifier picks the longest accepted path among all of them. Each part
then learns about its own nodes: its kept path (the longest prefix of the accepted path
that it drafted) and, if it asks, the target's top tokens at its nodes (and, for token
recycling, at every node of the step).

Only deterministic drafts are merged (the draft-free methods): a node drafted by two
parts would otherwise need two proposal distributions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Needs, Outcome, Proposer, StartContext
from pardec_cli.engine.tree import TreeBuilder
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import ProposerBase


class Combined(ProposerBase):
    """The union of its parts' drafts, as one tree."""

    def __init__(self, name: str, parts: Sequence[Proposer]) -> None:
        if len(parts) < 2:
            raise PardecUsageError(f"a combined method needs at least two parts, got {name!r}")
        self.name = name
        self.parts = list(parts)
        self.dry_runs = all(part.dry_runs for part in self.parts)
        self._needs = Needs.union([part.needs() for part in self.parts])
        self._drafts: list[Draft] = []
        self._node_ids: list[list[int | None]] = []  # per part: its node i -> merged node id

    def needs(self) -> Needs:
        return self._needs

    def start(self, ctx: StartContext) -> None:
        for part in self.parts:
            part.start(ctx)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        builder = TreeBuilder()
        self._drafts, self._node_ids = [], []
        for part in self.parts:
            draft = part.propose(context, max_tokens)
            if draft.probs is not None:
                raise PardecUsageError(f"method {part.name!r} drafts by sampling and cannot be combined")
            self._drafts.append(draft)
            self._node_ids.append(builder.graft(draft.tokens, draft.parents))
        return builder.draft() if len(builder) else EMPTY_DRAFT

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        if not draft.tokens:  # nothing merged this step (or a wrapper ran another proposer)
            self._drafts, self._node_ids = [EMPTY_DRAFT] * len(self.parts), [[] for _ in self.parts]
        else:
            self._drop_unverified(len(draft))
        for part, own, ids in zip(self.parts, self._drafts, self._node_ids):
            part.update(context, own, self._own_outcome(part, ids, outcome))

    def _drop_unverified(self, verified: int) -> None:
        """Each part forgets its nodes past the first `verified` merged ones, as never drafted:
        the loop may verify fewer than were merged (`fit_to_tiles` drops the last, a leaf)."""
        for i, (own, ids) in enumerate(zip(self._drafts, self._node_ids)):
            keep = [j for j, merged in enumerate(ids) if merged is None or merged < verified]
            if len(keep) == len(ids):
                continue
            index = {old: new for new, old in enumerate(keep)}
            tokens = [own.tokens[j] for j in keep]
            if own.parents is None:
                self._drafts[i] = Draft(tuple(tokens))
            else:
                self._drafts[i] = Draft.tree(tokens, [-1 if own.parents[j] < 0 else index[own.parents[j]] for j in keep])
            self._node_ids[i] = [ids[j] for j in keep]

    def _own_outcome(self, part: Proposer, ids: list[int | None], outcome: Outcome) -> Outcome:
        own_id = {merged: i for i, merged in enumerate(ids)}
        path: list[int] = []
        for merged in outcome.path:
            if merged not in own_id:
                break
            path.append(own_id[merged])
        top = None
        want = part.needs().top_k
        if want and outcome.top_tokens is not None:
            # Rows: the root, then the part's nodes (each node is in the merged tree: nothing is capped).
            rows = torch.tensor([0, *(merged + 1 for merged in ids)], device=outcome.top_tokens.device)
            top = outcome.top_tokens.index_select(0, rows)[:, :want]
        return Outcome(accepted=len(path), path=tuple(path), top_tokens=top, step_inputs=outcome.step_inputs,
                       step_top_tokens=outcome.step_top_tokens)

    def knobs(self) -> dict[str, Any]:
        return {f"{part.name}.{key}": value for part in self.parts for key, value in part.knobs().items()}
