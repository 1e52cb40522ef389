"""Plain autoregressive decoding: the proposer that proposes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Outcome, StartContext
from pardec_cli.methods.base import MethodEnv, ProposerBase


class Vanilla(ProposerBase):
    """One token per target forward; the reference every other method must match."""

    name = "vanilla"
    needs_rollback = False
    dry_runs = True  # it drafts nothing

    def __init__(self, env: MethodEnv) -> None:
        del env

    def start(self, ctx: StartContext) -> None:
        del ctx

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return EMPTY_DRAFT

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        pass

    def knobs(self) -> dict[str, Any]:
        return {}
