"""Prompt lookup decoding (Saxena 2023): drafts copied from earlier text.

Outputs often repeat spans of their input (code edits, extraction, summaries that quote).
Match the last n tokens against everything seen so far (prompt and output), and propose
what followed an earlier occurrence. Longer n-grams are tried first.

Which occurrence: by default the *first* one. Measured on the embedded model (bf16, 128
new tokens, tokens per step): code_edit 3.69 first vs 3.28 most recent, Spec-Bench 1.77
vs 1.70. The first occurrence is usually in the prompt, in the text being rewritten or
quoted, which is what the reply goes on copying; the most recent one is often the reply's
own last use of a common n-gram. `prefer=recent` keeps the other rule.

With `branches` > 1 the draft is a tree: the continuations of up to that many distinct
earlier occurrences (the preferred ones of the longest n-gram first, then of shorter
n-grams), merged where they share a prefix, all verified in the one forward.

With `fit` the length of each draft is chosen per step (`LengthFit`): as many tokens, up
to `num_draft`, as are expected to pay for their verification, from the match's length,
how often copies after matches of that length held so far in this reply, and what
verifying rows costs on this machine. A one-token match's copy rarely holds beyond a
token or two, a three-token match's inside a quoted span for many (docs/auto.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Outcome, StartContext
from pardec_cli.engine.tree import TreeBuilder
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import MethodEnv, ProposerBase


PREFER_FIRST, PREFER_RECENT = "first", "recent"


class _PerGeneration:
    """An index of one generation's text, started once however many proposers share it."""

    _started: StartContext | None = None

    def start(self, ctx: StartContext) -> None:
        """A new generation: forget the last one's text and index this one's prompt."""
        if ctx is self._started:
            return
        self._started = ctx
        self._clear()
        self.extend_to(ctx.prompt_ids)

    def _clear(self) -> None:
        raise NotImplementedError

    def extend_to(self, context: Sequence[int]) -> None:
        raise NotImplementedError


class NgramIndex(_PerGeneration):
    """For each n-gram (min_n <= n <= max_n) of a growing token list, where it first and last ended.

    Only n-grams that are followed by at least one token are indexed, so the suffix being
    looked up never matches itself. Updating costs O(max_n) per new token. One index may
    serve several proposers (adaptive's arms, `MethodEnv.indexes`): each looks up with its
    own shortest n-gram and rule, which only reads the entries it would have indexed alone.
    """

    def __init__(self, min_n: int, max_n: int, prefer: str = PREFER_FIRST) -> None:
        self.min_n, self.max_n, self.prefer = min_n, max_n, prefer
        self._clear()

    def _clear(self) -> None:
        self.tokens: list[int] = []
        self._first_end: dict[tuple[int, ...], int] = {}
        self._last_end: dict[tuple[int, ...], int] = {}
        self._indexed_until = 0  # n-gram end positions < this are indexed

    def extend_to(self, context: Sequence[int]) -> None:
        """Catch up with `context`, which must extend the tokens seen so far."""
        if len(context) == len(self.tokens):
            return
        self.tokens.extend(context[len(self.tokens) :])
        for end in range(max(self._indexed_until, 1), len(self.tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(self.tokens[end - n : end])
                self._first_end.setdefault(key, end)
                self._last_end[key] = end
        self._indexed_until = max(self._indexed_until, len(self.tokens))

    def continuation(self, length: int, min_n: int | None = None, prefer: str | None = None) -> list[int]:
        """Up to `length` tokens that followed an earlier match (first or latest) of the
        longest suffix of at least `min_n` tokens (default: the index's own settings)."""
        return self.match(length, min_n, prefer)[1]

    def match(self, length: int, min_n: int | None = None, prefer: str | None = None) -> tuple[int, list[int]]:
        """(n, continuation): the length of the longest suffix matched (0: none) and what
        `continuation` returns."""
        size = len(self.tokens)
        lookup = self._first_end if (prefer or self.prefer) == PREFER_FIRST else self._last_end
        for n in range(min(self.max_n, size), max(self.min_n, min_n or 0) - 1, -1):
            end = lookup.get(tuple(self.tokens[size - n :]))
            if end is not None:
                return n, self.tokens[end : end + length]
        return 0, []


class MultiNgramIndex(_PerGeneration):
    """For each n-gram (min_n <= n <= max_n), where its first and its latest `keep` occurrences ended.

    Like `NgramIndex`, only n-grams followed by at least one token are indexed.
    """

    def __init__(self, min_n: int, max_n: int, keep: int, prefer: str = PREFER_FIRST) -> None:
        self.min_n, self.max_n, self.keep, self.prefer = min_n, max_n, keep, prefer
        self._clear()

    def _clear(self) -> None:
        self.tokens: list[int] = []
        self._first: dict[tuple[int, ...], list[int]] = {}  # the first `keep` ends, oldest first
        self._latest: dict[tuple[int, ...], list[int]] = {}  # the latest `keep` ends, oldest first
        self._indexed_until = 0

    def extend_to(self, context: Sequence[int]) -> None:
        if len(context) == len(self.tokens):
            return
        self.tokens.extend(context[len(self.tokens) :])
        for end in range(max(self._indexed_until, 1), len(self.tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(self.tokens[end - n : end])
                first = self._first.setdefault(key, [])
                if len(first) < self.keep:
                    first.append(end)
                latest = self._latest.setdefault(key, [])
                latest.append(end)
                if len(latest) > self.keep:
                    del latest[0]
        self._indexed_until = max(self._indexed_until, len(self.tokens))

    def continuations(self, length: int, count: int, min_n: int | None = None, prefer: str | None = None) -> list[list[int]]:
        """Up to `count` distinct continuations: longest n-gram of at least `min_n` tokens
        first; within one, the preferred occurrences first (the first ones, or the latest
        ones), then the others."""
        size = len(self.tokens)
        prefer = prefer or self.prefer
        found: list[list[int]] = []
        for n in range(min(self.max_n, size), max(self.min_n, min_n or 0) - 1, -1):
            key = tuple(self.tokens[size - n :])
            first, latest = self._first.get(key, []), self._latest.get(key, [])[::-1]
            for end in (first + latest) if prefer == PREFER_FIRST else (latest + first):
                continuation = self.tokens[end : end + length]
                if continuation not in found:
                    found.append(continuation)
                    if len(found) == count:
                        return found
        return found


#: Before a reply shows how its copies hold: per length of the match (1, 2, 3 or more
#: tokens), the chance that a copy's first token is right and that each later one is,
#: given the ones before it were; worth FIT_PRIOR_WEIGHT of the reply's own copies.
#: Greedy SmolLM2-135M over pardec's tuning prompts and the Spec-Bench, code-edit and
#: HumanEval dev prompts `pardec bench` does not report on (docs/auto.md, session 32).
FIT_PRIOR: dict[int, tuple[float, float]] = {1: (0.2, 0.6), 2: (0.5, 0.7), 3: (0.75, 0.85)}
FIT_PRIOR_WEIGHT = 10.0
#: Without a cost curve (a bare MethodEnv: tests, library use): each verified row beyond
#: the first taken to cost this share of a one-token step.
GUESSED_ROW_COST = 0.125
#: The reply's own steps replace the cost curve (priced for the text's length,
#: `CostCurve.ms_at`) once this many (discounted by TIME_DECAY a step) were timed at sizes
#: that vary: they see what the curve cannot, the machine's load and caches as they are.
TIMED_STEPS = 8.0
TIME_DECAY = 0.95
#: The cost curve's prices are looked up again each time the text grows by this many tokens.
CONTEXT_STEP = 64


class LengthFit:
    """Per step, the length of a copy to draft that gives the most tokens per millisecond.

    Drafting L tokens of a copy made after an n-token match emits 1 + E[tokens kept] for
    the cost of verifying 1 + L rows after the text so far, `step_ms(1 + L, context)`.
    What is kept is estimated per n and per depth j, as the chance that the j-th copied
    token is right when the ones before it were: counted over this reply's earlier copies,
    each scored against the text that came after it whether it was verified or not, on top
    of `FIT_PRIOR`.
    """

    def __init__(self, longest: int, step_ms: Callable[[int, int], float] | None, context: int = 0) -> None:
        """Priced at once for a text of `context` tokens (the prompt): the first lookup of a
        session's curve may build auto's selector (~50 ms), better before the first token."""
        self.longest = longest
        self._step_ms = step_ms or (lambda rows, context: 1.0 + GUESSED_ROW_COST * (rows - 1))
        self._ms: list[float] = []  # [longest + 1]: a step verifying 1 + k rows
        self._priced_at = -1  # the text length (in CONTEXT_STEP tokens) the curve priced `_ms` for
        self._by_timings = False  # `_ms` from the reply's own timed steps, no longer from the curve
        self._price(context)
        self._timed = [0.0] * 5  # discounted sums of 1, x, y, x * x, x * y over timed steps: x drafted rows, y ms
        # per match length (1, 2, 3+) and depth 1..longest: copies right there, copies scored there
        self._hits = {n: [0] * (longest + 1) for n in FIT_PRIOR}
        self._tries = {n: [0] * (longest + 1) for n in FIT_PRIOR}
        self._pending: list[tuple[int, int, list[int]]] = []  # (position it copies from, match length, copy)

    def _price(self, context: int) -> None:
        """`_ms` by the cost curve after `context` tokens, unless the reply's steps priced it."""
        if not self._by_timings and self._priced_at != context // CONTEXT_STEP:
            self._priced_at = context // CONTEXT_STEP
            self._ms = [float(self._step_ms(1 + k, context)) for k in range(self.longest + 1)]

    def choose(self, matched: int, position: int, copy: Sequence[int], limit: int) -> int:
        """How many tokens of `copy` (after a `matched`-token match, for the text from
        `position` on: its length) to draft, at most `limit`; 0: a plain step pays more."""
        self._price(position)
        n = min(matched, max(FIT_PRIOR))
        self._pending.append((position, n, list(copy)))
        first, later = FIT_PRIOR[n]
        hits, tries = self._hits[n], self._tries[n]
        best_rate, best, expected, reach = 1.0 / self._ms[0], 0, 0.0, 1.0
        for j in range(1, min(len(copy), limit, self.longest) + 1):
            prior = first if j == 1 else later
            reach *= (prior * FIT_PRIOR_WEIGHT + hits[j]) / (FIT_PRIOR_WEIGHT + tries[j])  # P(first j copied tokens right)
            expected += reach
            rate = (1.0 + expected) / self._ms[j]
            if rate > best_rate:
                best_rate, best = rate, j
        return best

    def timed(self, rows: int, seconds: float) -> None:
        """A step of this reply verified `rows` rows (the root and the draft) in `seconds`."""
        x, y = rows - 1, seconds * 1000.0
        self._timed = [TIME_DECAY * total + term for total, term in zip(self._timed, (1.0, x, y, x * x, x * y))]
        w, sx, sy, sxx, sxy = self._timed
        spread = sxx / w - (sx / w) ** 2  # the variance of the sizes timed
        if w < TIMED_STEPS or spread < 0.1:
            return
        per_row = max((sxy / w - sx * sy / w**2) / spread, 0.0)  # least squares: ms = base + per_row * x
        base = sy / w - per_row * sx / w
        if base > 0:
            self._ms = [base + per_row * k for k in range(self.longest + 1)]
            self._by_timings = True

    def observe(self, context: Sequence[int]) -> None:
        """Score the copies whose fate `context` (the text so far) now shows."""
        open_ = []
        for position, n, copy in self._pending:
            text = context[position : position + len(copy)]
            run = 0
            while run < len(text) and text[run] == copy[run]:
                run += 1
            if run == len(text) < len(copy):
                open_.append((position, n, copy))  # right so far, the rest not written yet
                continue
            for j in range(1, min(run + 1, len(copy)) + 1):  # depths reached: up to the first wrong one
                self._tries[n][j] += 1
                self._hits[n][j] += j <= run
        self._pending = open_


class PromptLookup(ProposerBase):
    """Chain drafts copied from the context; no model, no extra memory beyond an index."""

    name = "pld"
    dry_runs = True  # an n-gram lookup; the index catches up in `start` and `update` (see suffix's)

    def __init__(
        self, env: MethodEnv, *, max_ngram: int, min_ngram: int, num_draft: int, prefer: str = PREFER_FIRST,
        branches: int = 1, fit: bool = False,
    ) -> None:
        self.check_knobs(max_ngram=max_ngram, min_ngram=min_ngram, num_draft=num_draft, prefer=prefer, branches=branches,
                         fit=fit)
        self.max_ngram, self.min_ngram, self.num_draft, self.prefer = max_ngram, min_ngram, num_draft, prefer
        self.branches, self.fit = branches, fit
        self._step_ms = env.step_ms
        self._length: LengthFit | None = None
        # Shared only where the env says so (adaptive's arms, which see one text: three pld
        # arms indexed every token three times, a fifth of adaptive's own time a step);
        # indexed from one-token n-grams then, as any arm's lookup may want.
        if env.indexes is None:
            self.index = self._new_index(min_ngram)
        else:
            self.index = env.indexes.setdefault(("pld", max_ngram, branches), self._new_index(1))

    @staticmethod
    def check_knobs(*, max_ngram: int, min_ngram: int, num_draft: int, prefer: str = PREFER_FIRST, branches: int = 1,
                    fit: bool = False) -> None:
        """Raise PardecUsageError for knobs that make no prompt lookup (`registry.check_knobs`)."""
        if not 1 <= min_ngram <= max_ngram:
            raise PardecUsageError(f"pld needs 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        if num_draft < 1:
            raise PardecUsageError(f"pld needs num_draft >= 1, got {num_draft}")
        if prefer not in (PREFER_FIRST, PREFER_RECENT):
            raise PardecUsageError(f"pld prefer must be {PREFER_FIRST!r} or {PREFER_RECENT!r}, got {prefer!r}")
        if branches < 1:
            raise PardecUsageError(f"pld needs branches >= 1, got {branches}")
        if fit and branches > 1:
            raise PardecUsageError("pld fit chooses the length of one copy: it needs branches=1")

    def _new_index(self, min_n: int) -> NgramIndex | MultiNgramIndex:
        if self.branches == 1:
            return NgramIndex(min_n, self.max_ngram, self.prefer)
        return MultiNgramIndex(min_n, self.max_ngram, self.branches, self.prefer)

    def start(self, ctx: StartContext) -> None:
        self.index.start(ctx)
        if self.fit:
            self._length = LengthFit(self.num_draft, self._step_ms, len(ctx.prompt_ids))

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self.index.extend_to(context)
        length = min(self.num_draft, max_tokens)
        if isinstance(self.index, NgramIndex):
            if self._length is not None:
                # the whole copy is scored later, so the fit learns beyond the length it drafts
                matched, copy = self.index.match(self.num_draft, self.min_ngram, self.prefer)
                tokens = copy[: self._length.choose(matched, len(context), copy, length)] if copy else []
            else:
                tokens = self.index.continuation(length, self.min_ngram, self.prefer)
            return Draft(tuple(tokens)) if tokens else EMPTY_DRAFT
        builder = TreeBuilder()
        for continuation in self.index.continuations(length, self.branches, self.min_ngram, self.prefer):
            builder.path(continuation)
        return builder.draft() if len(builder) else EMPTY_DRAFT

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        self.index.extend_to(context)
        if self._length is not None:
            self._length.observe(context)
            if outcome.forward_s is not None:
                self._length.timed(1 + len(draft.tokens), outcome.forward_s)

    def knobs(self) -> dict[str, Any]:
        return {"max_ngram": self.max_ngram, "min_ngram": self.min_ngram, "num_draft": self.num_draft, "prefer": self.prefer,
                "branches": self.branches, "fit": self.fit}
