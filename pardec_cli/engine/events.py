"""What the decoding loop reports: one event per step, and per-generation statistics.

The CLI, the TUI, the tuner and the benchmark all consume these; none of them decodes.
This module imports no torch so that front ends can type against it cheaply.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Why a generation ended. "stop" (a stop string matched) is decided by the text layer.
FINISH_EOS = "eos"
FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_CANCELLED = "cancelled"
FINISH_REPETITION = "repetition"  # the text layer's RepetitionGuard saw a loop


@dataclass(frozen=True)
class StepEvent:
    """One decoding step.

    Step 0 is the prefill, which emits the first token and drafts nothing. Every later
    step verifies `drafted` proposed tokens (the nodes of a tree, all its branches
    counted) in one target forward, keeps `accepted` of them (one path) and emits them
    plus one token chosen by the target (so `len(tokens)` is `accepted + 1`, fewer only
    when EOS or the token limit cut the step short).
    """

    index: int
    tokens: tuple[int, ...]
    drafted: int
    accepted: int
    propose_s: float
    verify_s: float
    elapsed_s: float  # since the generation started (prefill included)
    finish_reason: str | None = None
    arm: str = ""  # the configuration that drafted this step, when the method switches between several
    # The target's forward alone, part of verify_s (the rest is the host's: verifying, the
    # cache's kept path, the proposer's update). On a CPU the forward itself; where the
    # device computes asynchronously (CUDA) only its launch, its compute lands in the rest.
    forward_s: float = 0.0


@dataclass
class ArmTotals:
    """What one configuration of a switching method (`StepEvent.arm`) did in a generation."""

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0  # drafting and verifying
    # What auto learns from an arm's steps (`selection.learned.generation_rows`): the nodes it
    # drafted, its drafting seconds, and its steps that drafted nothing with their verify seconds.
    drafted: int = 0
    propose_s: float = 0.0
    base_steps: int = 0
    base_verify_s: float = 0.0


@dataclass
class GenerationStats:
    """Summary of one generation, built from its step events."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0  # decoding steps after the prefill
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    ttft_s: float = 0.0  # time to first token (prefill + first sample)
    total_s: float = 0.0
    propose_s: float = 0.0
    verify_s: float = 0.0
    accepted_per_step: list[int] = field(default_factory=list, repr=False)
    # Methods that switch configurations while decoding (adaptive): steps, tokens and time
    # per configuration, in order of first use, and how often the configuration changed.
    arms: dict[str, ArmTotals] = field(default_factory=dict)
    switches: int = 0
    last_arm: str = field(default="", repr=False)

    def add(self, event: StepEvent) -> None:
        """Fold one step event into the totals."""
        self.generated_tokens += len(event.tokens)
        self.total_s = event.elapsed_s
        self.propose_s += event.propose_s
        self.verify_s += event.verify_s
        if event.index == 0:
            self.ttft_s = event.elapsed_s
            return
        self.steps += 1
        self.drafted_tokens += event.drafted
        self.accepted_tokens += event.accepted
        self.accepted_per_step.append(event.accepted)
        if event.arm:
            if self.last_arm and event.arm != self.last_arm:
                self.switches += 1
            self.last_arm = event.arm
            totals = self.arms.setdefault(event.arm, ArmTotals())
            totals.steps += 1
            totals.tokens += len(event.tokens)
            totals.seconds += event.propose_s + event.verify_s
            totals.drafted += event.drafted
            totals.propose_s += event.propose_s
            if not event.drafted:
                totals.base_steps += 1
                totals.base_verify_s += event.verify_s

    @property
    def tokens_per_s(self) -> float:
        """End-to-end rate: generated tokens over total time, prefill included."""
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Rate after the first token."""
        span = self.total_s - self.ttft_s
        return (self.generated_tokens - 1) / span if span > 0 else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        """Tokens emitted per decoding step (accepted drafts + the target's own token); 1.0 for vanilla."""
        return (self.generated_tokens - 1) / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens that the target accepted (0 when nothing was drafted).

        A tree keeps one path of its branches, so its share is low by design; compare
        trees by `mean_tokens_per_step`.
        """
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationStats:
        """The stats a `to_dict` document (from a server's reply, say) describes; derived
        rates are recomputed, unknown keys ignored."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["arms"] = {label: ArmTotals(int(a["steps"]), int(a["tokens"]), float(a["seconds"]))
                          for label, a in (data.get("arms") or {}).items()}
        return cls(**values)

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready summary (without the per-step list)."""
        data = asdict(self)
        data.pop("accepted_per_step")
        data.pop("last_arm")
        if not self.arms:  # a method that does not switch: the document stays as it was
            data.pop("arms"), data.pop("switches")
        else:
            data["arms"] = {label: {"steps": a.steps, "tokens": a.tokens, "seconds": round(a.seconds, 5)}
                            for label, a in self.arms.items()}
        data.update(
            tokens_per_s=round(self.tokens_per_s, 3),
            decode_tokens_per_s=round(self.decode_tokens_per_s, 3),
            mean_tokens_per_step=round(self.mean_tokens_per_step, 4),
            acceptance_rate=round(self.acceptance_rate, 4),
        )
        for key in ("ttft_s", "total_s", "propose_s", "verify_s"):
            data[key] = round(float(data[key]), 5)
        return data
