"""Token ids -> text, incrementally, with stop strings.

Two problems the terminal must not see:
- A multi-byte character split over several tokens decodes to U+FFFD until its last
  byte arrives, so text is released only once it no longer ends in a partial character.
- A stop string may span token boundaries: text that could still become the start of a
  stop string is held back until it either completes one (then it is dropped and the
  generation ends) or can no longer do so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a growing list of token ids into new text, one chunk per push.

    Decodes a short window (from `prefix_offset`) instead of the whole output, so the
    cost per step stays constant; comparing against the window's earlier decoding keeps
    spaces and merges that depend on the previous tokens right.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the newly complete text (possibly empty)."""
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            new_text = full[len(prefix) :]
            # The tokens just released become the left context of the next window.
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return new_text
        return ""

    def flush(self) -> str:
        """Whatever is left at the end (an incomplete character is emitted as U+FFFD)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.read_offset = self.prefix_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""


class StopMatcher:
    """Finds stop strings in streamed text and holds back possible partial matches."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Feed new text; return what is safe to show. Sets `stopped` on a match."""
        if self.stopped:
            return ""
        if not self.stop:
            return text
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[: min(hits)], ""
            return out
        hold = self._partial_match_length()
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """At the end of generation, held-back text was not a stop string after all."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _partial_match_length(self) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:n]):
                    best = n
                    break
        return best


class RepetitionGuard:
    """Ends a reply caught in a loop: the same block of tokens repeated back to back.

    Small models decoding a chat reply can fall into a loop ("a fast ship, a quick ship,
    a fast ship, ...") that runs to the token limit; greedy decoding always does once it
    starts, and prompt-lookup and suffix drafting then accept the loop at full speed. The
    guard watches the emitted tokens and trips when the last `span` tokens are at least
    `min_repeats` copies of one block of at most `max_period` tokens, with `span` at least
    `min_tokens`. It only decides where the reply *ends*: every token before that was
    chosen by the loop's own rule (greedy or exact speculative sampling), so the text is a
    prefix of what decoding without the guard produces, and sampling stays exact.

    Incremental: `runs[p]` is how many of the latest tokens equal the token `p` before
    them; the last `runs[p] + p` tokens then repeat with period p. O(max_period) per token.
    """

    def __init__(self, *, max_period: int = 64, min_repeats: int = 4, min_tokens: int = 64) -> None:
        self.max_period, self.min_repeats, self.min_tokens = max_period, min_repeats, min_tokens
        self.tokens: list[int] = []
        self.runs = [0] * (max_period + 1)  # runs[0] unused
        self.tripped = False

    def push(self, token_ids: Sequence[int]) -> int | None:
        """Feed emitted tokens; return how many of them to keep when a loop is found
        (the reply then ends after them), else None."""
        for n, token in enumerate(token_ids, start=1):
            self.tokens.append(token)
            i = len(self.tokens) - 1
            for p in range(1, min(self.max_period, i) + 1):
                self.runs[p] = self.runs[p] + 1 if self.tokens[i - p] == token else 0
                span = self.runs[p] + p
                if span >= self.min_tokens and span >= p * self.min_repeats:
                    self.tripped = True
                    return n
        return None
