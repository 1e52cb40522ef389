"""Suffix drafting (after SuffixDecoding, Oliaro et al. 2024): frequent continuations of the longest match.

Two suffix tries with occurrence counts hold every substring of up to `depth` tokens:
one over this generation's prompt and output (grown as tokens arrive), one over the
earlier outputs of this proposer (a session's method keeps them from one prompt to the
next; added when the next generation starts; the newest `history_tokens` are kept). Each step finds, in each trie, the longest suffix of the context (at
most `max_match` tokens) that occurred before with a continuation, then grows one draft
tree best-first from both matches: a continuation's score is the product of the
conditional frequencies count(child) / count(children) along its path. The tree gets
`factor` nodes per matched token (at most `max_nodes`), so a long match, which predicts
well, drafts wide and deep; branches below `min_prob` are not drafted.

With `min_gain` above 0 the proposer also learns, per length of the match (1, 2, 3, 4 or
more tokens), how many tokens its recent drafts after such matches kept, and stops drafting
after matches of a length whose drafts keep fewer than `min_gain` (a step of plain decoding
instead), retrying every `GAIN_RETRY`-th time so that the estimate follows the text.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Sequence
from math import ceil
from typing import Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Outcome, StartContext
from pardec_cli.engine.tree import ROOT, TreeBuilder
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import MethodEnv, ProposerBase

_STRIDE = 1 << 32  # edge key = node * _STRIDE + token
#: Match lengths `min_gain` tells apart: 1, 2, 3, and 4 or more tokens.
GAIN_BUCKETS = 4
#: Weight of the older drafts in a match length's mean of kept tokens (the last ~5 count).
GAIN_DECAY = 0.8
#: A gated match length still drafts every this many times: its estimate stays current.
GAIN_RETRY = 8
#: Drafts seen after a match length before its estimate can stop drafting there.
GAIN_EVIDENCE = 2


class SuffixTrie:
    """All substrings of length <= `depth` of the texts added, as a trie with occurrence counts.

    Appending a token extends every open suffix of the current text (those shorter than
    `depth`) by one: O(depth) per token. `open_suffixes` are then the trie nodes of the
    current text's suffixes, shortest first. Nodes live in flat arrays (compact: one
    dict entry and a few ints per node).
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._edges: dict[int, int] = {}
        self.token = array("i", [-1])
        self.count = array("i", [0])
        self.level = array("i", [0])
        self._first = array("i", [-1])  # first child
        self._next = array("i", [-1])  # next sibling
        self.open_suffixes: list[int] = []

    def __len__(self) -> int:
        return len(self.count)

    def new_text(self) -> None:
        """Start a new text: later tokens do not continue the previous one."""
        self.open_suffixes = []

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        edges, count, level, depth = self._edges, self.count, self.level, self.depth
        opened: list[int] = []
        for node in (0, *self.open_suffixes):
            key = node * _STRIDE + token
            child = edges.get(key)
            if child is None:
                child = edges[key] = len(count)
                self.token.append(token)
                count.append(0)
                level.append(level[node] + 1)
                self._first.append(-1)
                self._next.append(self._first[node])
                self._first[node] = child
            count[child] += 1
            if level[child] < depth:
                opened.append(child)
        self.open_suffixes = opened

    def children(self, node: int) -> list[int]:
        out: list[int] = []
        child = self._first[node]
        while child != -1:
            out.append(child)
            child = self._next[child]
        return out

    def has_children(self, node: int) -> bool:
        return self._first[node] != -1

    def find(self, tokens: Sequence[int]) -> int | None:
        node = 0
        for token in tokens:
            child = self._edges.get(node * _STRIDE + token)
            if child is None:
                return None
            node = child
        return node

    def longest_match(self, context: Sequence[int], max_match: int) -> tuple[int, int] | None:
        """(node, length) of the longest suffix of `context` (<= max_match) seen with a continuation."""
        for length in range(min(max_match, len(context), self.depth - 1), 0, -1):
            node = self.find(context[len(context) - length :])
            if node is not None and self.has_children(node):
                return node, length
        return None


class History:
    """Earlier outputs of one model, in one trie, bounded by `limit` tokens (oldest dropped)."""

    def __init__(self, depth: int, limit: int) -> None:
        self.depth, self.limit = depth, limit
        self.outputs: deque[tuple[int, ...]] = deque()
        self.tokens = 0
        self.trie = SuffixTrie(depth)

    def add(self, output: Sequence[int]) -> None:
        output = tuple(output[-self.limit :])
        if not output:
            return
        self.outputs.append(output)
        self.tokens += len(output)
        if self.tokens > self.limit:  # rebuild from the newest outputs that fit in half the limit
            while self.tokens > self.limit // 2:
                self.tokens -= len(self.outputs.popleft())
            self.trie = SuffixTrie(self.depth)
            for kept in self.outputs:
                self.trie.new_text()
                self.trie.extend(kept)
            return
        self.trie.new_text()
        self.trie.extend(output)


class SuffixIndex:
    """What suffix drafting reads: this generation's trie (prompt and output so far) and
    the earlier outputs' `History`. One per proposer, or one for every suffix proposer
    built from a `MethodEnv` with `indexes` (adaptive's arms: each size of suffix would
    otherwise index the same text again, at O(depth) per token)."""

    def __init__(self, depth: int, history_tokens: int) -> None:
        self.depth = depth
        self.history = History(depth, history_tokens) if history_tokens else None
        self.trie = SuffixTrie(depth)
        self.seen = 0  # context tokens added to the trie
        self.prompt_length = 0
        self.context: Sequence[int] = ()
        self._started: StartContext | None = None

    def start(self, ctx: StartContext) -> None:
        """A new generation: the last one's output joins the history, the prompt is indexed
        (once, however many proposers share this index)."""
        if ctx is self._started:
            return
        self._started = ctx
        if self.history is not None and len(self.context) > self.prompt_length:
            self.history.add(self.context[self.prompt_length :])
        self.trie = SuffixTrie(self.depth)
        self.trie.extend(ctx.prompt_ids)
        self.seen = self.prompt_length = len(ctx.prompt_ids)
        self.context = ()

    def catch_up(self, context: Sequence[int]) -> None:
        """Index the tokens of `context` not indexed yet."""
        self.context = context
        self.trie.extend(context[self.seen :])
        self.seen = len(context)


class SuffixDrafting(ProposerBase):
    """Tree drafts: the most frequent continuations of the context's longest earlier match."""

    name = "suffix"
    # Trie walks. The tries catch up in `start` and `update`, not in `propose`: an idle
    # arm of adaptive that drafted rarely would otherwise pay for every token since its
    # last draft (the whole prompt, at first) in the dry run that times its drafting.
    dry_runs = True

    def __init__(
        self, env: MethodEnv, *, depth: int, max_match: int, factor: float, max_nodes: int, min_prob: float,
        history_tokens: int, min_match: int = 1, min_gain: float = 0.5,
    ) -> None:
        if depth < 2 or max_match < 1:
            raise PardecUsageError(f"suffix needs depth >= 2 and max_match >= 1, got {depth} and {max_match}")
        if not 1 <= min_match <= max_match:
            raise PardecUsageError(f"suffix needs 1 <= min_match <= max_match, got min_match={min_match}")
        if factor <= 0 or max_nodes < 1 or not 0.0 <= min_prob < 1.0 or history_tokens < 0:
            raise PardecUsageError("suffix needs factor > 0, max_nodes >= 1, 0 <= min_prob < 1 and history_tokens >= 0")
        # A match of m tokens leaves depth - m tokens of continuation in the tries.
        self.depth, self.max_match, self.factor = depth, min(max_match, depth - 1), factor
        self.max_nodes, self.min_prob, self.history_tokens = max_nodes, min_prob, history_tokens
        # A continuation seen once after a one-token match scores 1.0 against min_prob:
        # shorter matches than this draft nothing.
        self.min_match = min(min_match, self.max_match)
        if min_gain < 0:
            raise PardecUsageError(f"suffix needs min_gain >= 0, got {min_gain}")
        self.min_gain = min_gain
        self._reset_gain()
        # Shared only where the env says so (adaptive's arms, which see the same text): a
        # benchmark running several methods on one prompt must not let one copy that
        # prompt's output from another.
        own = SuffixIndex(depth, history_tokens)
        self.index = own if env.indexes is None else env.indexes.setdefault(("suffix", depth, history_tokens), own)

    @property
    def trie(self) -> SuffixTrie:
        return self.index.trie

    @property
    def history(self) -> History | None:
        return self.index.history

    def start(self, ctx: StartContext) -> None:
        self.index.start(ctx)
        self._reset_gain()

    def _reset_gain(self) -> None:
        # Per match-length bucket (index 1..GAIN_BUCKETS): mean tokens kept by recent drafts
        # (None: none yet), how many drafts it has seen, drafts skipped since the last try;
        # the last draft's bucket.
        self._gain: list[float | None] = [None] * (GAIN_BUCKETS + 1)
        self._evidence = [0] * (GAIN_BUCKETS + 1)
        self._gated = [0] * (GAIN_BUCKETS + 1)
        self._bucket = 0

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self.index.catch_up(context)
        matches: list[tuple[SuffixTrie, int, int]] = []
        here = self._match_current(context)
        if here is not None:
            matches.append((self.trie, *here))
        if self.history is not None:
            earlier = self.history.trie.longest_match(context, self.max_match)
            if earlier is not None:
                matches.append((self.history.trie, *earlier))
        matches = [match for match in matches if match[2] >= self.min_match]
        if not matches or max_tokens <= 0:
            return EMPTY_DRAFT
        longest = max(length for _, _, length in matches)
        bucket = min(longest, GAIN_BUCKETS)
        gain = self._gain[bucket]
        if self.min_gain > 0 and gain is not None and self._evidence[bucket] >= GAIN_EVIDENCE and gain < self.min_gain:
            self._gated[bucket] += 1
            if self._gated[bucket] % GAIN_RETRY:
                return EMPTY_DRAFT
        self._bucket = bucket
        return self._grow(matches, min(self.max_nodes, ceil(self.factor * longest)), max_tokens)

    def _match_current(self, context: Sequence[int]) -> tuple[int, int] | None:
        """The longest suffix of the context that occurred earlier in it with a continuation.

        The trie's open suffixes are exactly the context's suffixes, shortest first.
        """
        suffixes = self.trie.open_suffixes
        for length in range(min(self.max_match, len(suffixes)), 0, -1):
            node = suffixes[length - 1]
            if self.trie.has_children(node):
                return node, length
        return None

    def _grow(self, matches: list[tuple[SuffixTrie, int, int]], budget: int, max_depth: int) -> Draft:
        builder = TreeBuilder(max_nodes=budget, max_depth=max_depth)
        heap: list[tuple[float, int, SuffixTrie, int, int]] = []  # (-score, order, trie, node, parent id)
        order = 0

        def push_children(trie: SuffixTrie, node: int, score: float, parent: int) -> None:
            nonlocal order
            children = trie.children(node)
            total = sum(trie.count[c] for c in children)
            for child in children:
                child_score = score * trie.count[child] / total
                if child_score >= self.min_prob:
                    heapq.heappush(heap, (-child_score, order, trie, child, parent))
                    order += 1

        for trie, node, _ in matches:
            push_children(trie, node, 1.0, ROOT)
        while heap and not builder.full:
            score, _, trie, node, parent = heapq.heappop(heap)
            added = builder.child(parent, trie.token[node])
            if added is not None:
                push_children(trie, node, -score, added)
        return builder.draft() if len(builder) else EMPTY_DRAFT

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        self.index.catch_up(context)
        if self.min_gain > 0 and draft.tokens and self._bucket:
            gain = self._gain[self._bucket]
            kept = float(outcome.accepted)
            self._gain[self._bucket] = kept if gain is None else GAIN_DECAY * gain + (1 - GAIN_DECAY) * kept
            self._evidence[self._bucket] += 1

    def knobs(self) -> dict[str, Any]:
        return {
            "depth": self.depth, "max_match": self.max_match, "factor": self.factor, "max_nodes": self.max_nodes,
            "min_prob": self.min_prob, "history_tokens": self.history_tokens, "min_match": self.min_match,
            "min_gain": self.min_gain,
        }
