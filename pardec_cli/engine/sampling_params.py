"""Sampling settings, torch-free so that front ends (the chat TUI, option parsing) can
build and validate them without importing torch. The distributions they define are
computed in `pardec_cli.engine.sampling`."""

from __future__ import annotations

from dataclasses import dataclass

from pardec_cli.errors import InvalidSamplingError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1.0 = no nucleus filter
    seed: int | None = None

    def __post_init__(self) -> None:
        # Typed errors with the setting's name: each front end words them (the CLI names its flags).
        if self.temperature < 0:
            raise InvalidSamplingError("temperature", ">= 0", self.temperature)
        if self.top_k < 0:
            raise InvalidSamplingError("top_k", ">= 0", self.top_k)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSamplingError("top_p", "in (0, 1]", self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
