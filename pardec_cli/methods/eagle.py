"""EAGLE-2 drafting (Li et al. 2024) with EAGLE-1/2 heads (`eagle`) or EAGLE-3 heads (`eagle3`).

The draft head (`pardec_cli.heads.eagle`) keeps a KV cache over the positions whose
target features it has seen: position i pairs the target's features at i with the token
x[i+1]. Each step it first catches up on the features the last verification produced
(the root and the kept path: the cache follows the accepted path because only those
positions are ever fed), then grows a dynamic tree:

    level 1: the top-k tokens after the root, scored by their log-probability;
    level d: feed the frontier (k nodes) through the draft layer in one pass, each
             attending to the cache and to its own ancestors; each frontier node's top-k
             children get score = parent's score + their log-probability; the k
             best-scoring children become the next frontier;
    finally: keep the `nodes` best-scoring candidates of all levels (a child never scores
             above its parent, so the kept set is a tree) -- EAGLE-2's rerank.

The tree's entries are then cropped from the draft cache. Drafts are deterministic
(top-k), so the engine's tree verification is exact for greedy decoding and for sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Needs, Outcome, StartContext
from pardec_cli.errors import PardecUsageError
from pardec_cli.heads.eagle import DraftCache, EagleDrafter, eagle3_feature_layers, load_eagle
from pardec_cli.heads.vocab import DraftVocab
from pardec_cli.methods.base import MethodEnv, ProposerBase
from pardec_cli.methods.heads_support import draft_vocabulary, heads_notes, locate_heads, with_prompt_tokens


class Eagle(ProposerBase):
    """Dynamic draft trees from an EAGLE-1/2 head."""

    name = "eagle"
    kind = "eagle"
    version = 1

    def __init__(
        self, env: MethodEnv, *, heads: str, topk: int, depth: int, nodes: int, draft_vocab: int = -1
    ) -> None:
        if topk < 1 or depth < 1 or nodes < 1:
            raise PardecUsageError(f"{self.name} needs topk, depth and nodes >= 1, got {topk}, {depth}, {nodes}")
        folder = locate_heads(env, self.kind, heads)
        # EAGLE-3 heads bring their own draft vocabulary (d2t); EAGLE-1 heads score with the target's LM head.
        vocab = draft_vocabulary(heads_notes(env, folder), draft_vocab) if self.version == 1 else None
        drafter = load_eagle(folder, env.target, env.model_name, draft_vocab=vocab)
        if drafter.config.version != self.version:
            other = "eagle3" if drafter.config.version == 3 else "eagle"
            raise PardecUsageError(
                f"the heads in {folder} are EAGLE-{drafter.config.version} heads", hint=f"use --method {other}"
            )
        self.drafter: EagleDrafter = drafter
        assert drafter.vocab is not None
        self.vocab = drafter.vocab
        self.vocab_ids = vocab  # EAGLE-1 with a draft vocabulary: extended by each prompt's tokens
        self.lm_head = env.target.model.get_output_embeddings().weight
        self.folder = folder
        self.topk, self.depth, self.nodes = min(topk, len(self.vocab)), depth, nodes
        layers = int(env.target.config.num_hidden_layers)
        self.feature_layers = (-1,) if self.version == 1 else eagle3_feature_layers(layers)
        self.cache = DraftCache()
        self._pending: list[torch.Tensor] = []  # target features not yet fed to the draft layer, [*, F] each
        # The draft confidence of each node of the last draft: its path's summed draft log-probabilities.
        self.last_scores: tuple[float, ...] = ()

    def start(self, ctx: StartContext) -> None:
        self.cache = DraftCache()
        self._pending = []
        if self.vocab_ids is not None:
            ids = with_prompt_tokens(self.vocab_ids, ctx.prompt_ids, int(self.lm_head.shape[0]))
            self.vocab = DraftVocab.restricted(self.lm_head, ids)

    def needs(self) -> Needs:
        return Needs(feature_layers=self.feature_layers)

    def prefilled(self, features: torch.Tensor) -> None:
        self._pending = [features]

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        assert outcome.features is not None
        self._pending.append(outcome.features)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        if max_tokens < 1 or not self._pending:
            return EMPTY_DRAFT
        with torch.inference_mode():
            last = self._catch_up(context)  # [h]: the draft's guess of the root's state
            draft = self._grow_tree(last, len(context) - 1, max_tokens)
        self.cache.crop(len(context) - 1)
        return draft

    def _catch_up(self, context: Sequence[int]) -> torch.Tensor:
        """Feed the pending features (positions len(cache) .. n-1, n = len(context) - 1) with their next tokens."""
        device = self.drafter.fc.weight.device
        start, n = len(self.cache), len(context) - 1
        features = torch.cat(self._pending) if len(self._pending) > 1 else self._pending[0]  # [n - start, F]
        self._pending = []
        if features.shape[0] != n - start:
            raise RuntimeError(f"eagle: {features.shape[0]} new features for {n - start} positions")
        tokens = torch.tensor([context[start + 1 : n + 1]], device=device)
        positions = torch.arange(start, n, device=device)[None]
        out = self.drafter(features[None], tokens, positions, cache=self.cache)  # [1, n - start, h]
        return out[0, -1]

    def _grow_tree(self, last: torch.Tensor, n: int, max_tokens: int) -> Draft:
        """EAGLE-2's dynamic tree under the root (position n), at most `max_tokens` deep."""
        k, device = self.topk, last.device
        drafter, vocab = self.drafter, self.vocab
        log_probs, ids = vocab.top(drafter.head_input(last)[None], k)  # [1, k] each
        tokens: list[int] = ids[0].tolist()
        parents: list[int] = [-1] * len(tokens)
        scores: list[float] = log_probs[0].tolist()
        frontier = list(range(len(tokens)))  # candidates to feed next, all at the same level
        inputs = last.expand(len(frontier), -1)  # [k, h]: what each frontier node's draft input carries
        slot: dict[int, int] = {}  # candidate -> its entry in the draft cache
        for level in range(1, min(self.depth, max_tokens)):
            past = len(self.cache)
            mask = torch.zeros(len(frontier), past + len(frontier), dtype=torch.bool, device=device)
            mask[:, :n] = True  # the accepted context
            for row, cand in enumerate(frontier):
                mask[row, past + row] = True
                above = parents[cand]
                while above >= 0:
                    mask[row, slot[above]] = True
                    above = parents[above]
                slot[cand] = past + row
            positions = torch.full((1, len(frontier)), n + level - 1, device=device)
            feed = torch.tensor([[tokens[c] for c in frontier]], device=device)
            out = drafter(inputs[None], feed, positions, cache=self.cache, mask=mask[None, None])[0]  # [F, h]
            child_lp, child_ids = vocab.top(drafter.head_input(out), k)  # [F, k]
            cumulative = torch.tensor([scores[c] for c in frontier], device=device)[:, None] + child_lp  # [F, k]
            first = len(tokens)
            tokens += child_ids.flatten().tolist()
            parents += [c for c in frontier for _ in range(child_ids.shape[1])]
            scores += cumulative.flatten().tolist()
            best = torch.topk(cumulative.flatten(), min(k, cumulative.numel())).indices  # next frontier
            frontier = [first + int(i) for i in best]
            inputs = out.index_select(0, best // child_ids.shape[1])
        draft, self.last_scores = _rerank(tokens, parents, scores, self.nodes)
        return draft

    def knobs(self) -> dict[str, Any]:
        vocab = len(self.vocab_ids) if self.vocab_ids is not None else 0
        return {"heads": str(self.folder), "topk": self.topk, "depth": self.depth, "nodes": self.nodes,
                "draft_vocab": vocab}  # fmt: skip


class Eagle3(Eagle):
    """Dynamic draft trees from an EAGLE-3 head (three target layers, its own draft vocabulary)."""

    name = "eagle3"
    kind = "eagle3"
    version = 3


def _rerank(tokens: list[int], parents: list[int], scores: list[float], nodes: int) -> tuple[Draft, tuple[float, ...]]:
    """The `nodes` best-scoring candidates, as a draft tree in creation order (parents first), and their scores.

    A child's score never exceeds its parent's, and a parent was created first, so
    walking candidates by (score desc, creation asc) meets every parent before its
    children; a child is kept only if its parent was.
    """
    order = sorted(range(len(tokens)), key=lambda c: (-scores[c], c))
    kept: set[int] = set()
    for cand in order:
        if len(kept) >= nodes:
            break
        if parents[cand] < 0 or parents[cand] in kept:
            kept.add(cand)
    chosen = sorted(kept)
    index = {cand: i for i, cand in enumerate(chosen)}
    draft = Draft.tree([tokens[c] for c in chosen], [index[parents[c]] if parents[c] >= 0 else -1 for c in chosen])
    return draft, tuple(scores[c] for c in chosen)
