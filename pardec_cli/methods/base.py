"""What a method gets to build itself, and the pieces several methods share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pardec_cli.engine.model import LanguageModel
from pardec_cli.engine.proposal import NO_NEEDS, Needs


@dataclass(frozen=True)
class MethodEnv:
    """The target and its tokenizer, plus ways to find what some methods need.

    `load_model(spec)` returns (LanguageModel, tokenizer) on the target's device and
    dtype, and fails when that model does not share the target's tokenizer; `find_heads(kind)` the directory of the installed Medusa/EAGLE heads of that
    kind for the target, or None; `heads_notes(folder)` what pardec noted about heads it
    trained in `folder` (their own draft vocabulary; empty for published heads). All
    three are injected by the session layer so methods never touch the store.
    `model_name` names the target in messages. `indexes`, where set, holds the text
    indexes that proposers built from this env share, keyed by what they index
    (adaptive's arms see one text: one suffix trie serves every size of suffix); None:
    each proposer keeps its own. `step_ms(n, context)`, where set, is the time in ms of a
    forward verifying n tokens after `context` tokens of text on this target (the cost curve
    `--method auto` ranks with, measured on this machine where it could be), for methods
    that size their drafts by it.
    """

    target: LanguageModel
    tokenizer: Any
    load_model: Callable[[str], tuple[LanguageModel, Any]] | None = None
    find_heads: Callable[[str], Path | None] | None = None
    model_name: str = "the model"
    heads_notes: Callable[[Path], Mapping[str, Any]] | None = None
    indexes: dict[Any, Any] | None = None
    step_ms: Callable[[int, int], float] | None = None


class ProposerBase:
    """Defaults of the proposer contract (`engine.proposal.Proposer`): a method drafts, so
    it needs a cache that can be rolled back; it asks the loop for nothing more than the
    verdict; it ignores the prompt's hidden states; its drafts cannot be tried without
    verifying them. Methods override what they need."""

    needs_rollback = True
    dry_runs = False

    def needs(self) -> Needs:
        return NO_NEEDS

    def prefilled(self, features: Any) -> None:
        """Called only for proposers whose `needs()` names feature layers."""


class AdaptiveLength:
    """Draft length that follows recent acceptance (the rule Hugging Face uses).

    A fully accepted draft grows the next one by 2; any rejection shrinks it by 1.
    """

    def __init__(self, k: int, min_k: int, max_k: int, adaptive: bool) -> None:
        from pardec_cli.errors import PardecUsageError

        if not 1 <= min_k <= max_k:
            raise PardecUsageError(f"draft length bounds need 1 <= min_k <= max_k, got {min_k} and {max_k}")
        self.min_k, self.max_k, self.adaptive = min_k, max_k, adaptive
        self.k = min(max(k, min_k), max_k)

    def update(self, drafted: int, accepted: int) -> None:
        if not self.adaptive or drafted == 0:
            return
        if accepted == drafted:
            self.k = min(self.k + 2, self.max_k)
        else:
            self.k = max(self.k - 1, self.min_k)
