"""The training loop: AdamW on the head's parameters, a step and/or time budget, checkpoints, Ctrl-C.

The learning rate warms up linearly, then follows a cosine down to a tenth of its peak
over the run's progress -- the larger of steps done / `steps` and time spent /
`budget_s`, so a time-limited run anneals as its time runs out. Every `eval_s` seconds
the heads are scored on held-out text and the best weights so far are kept: a small
corpus is soon learned by heart, and the heads that guess unseen text best are the
ones to keep. Every `checkpoint_s` seconds, at the end, and on Ctrl-C
(KeyboardInterrupt) the best heads are saved through the `save` callback, then the
interrupt goes on to the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Protocol

import torch


class Objective(Protocol):
    """A head's loss over batches (see `training.objectives`)."""

    def parameters(self) -> Any: ...

    def step_loss(self, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        """(loss of one random batch, its top-1 accuracy)."""

    def evaluate(self) -> dict[str, Any]:
        """Held-out metrics."""

    def score(self, evaluation: dict[str, Any]) -> float:
        """One number from `evaluate`'s metrics: higher is better."""

    def state(self) -> dict[str, torch.Tensor]:
        """A copy of the weights."""

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Put weights from `state` back."""


@dataclass
class TrainSettings:
    steps: int | None = None  # stop after this many optimizer steps
    budget_s: float | None = None  # stop after this many seconds of training
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    clip: float = 1.0
    checkpoint_s: float = 300.0
    eval_s: float = 60.0
    seed: int = 0


@dataclass
class TrainState:
    """Where a run stands: steps done, seconds spent, the loss curve (step, smoothed loss, accuracy)."""

    step: int = 0
    seconds: float = 0.0
    loss: float | None = None
    accuracy: float | None = None
    history: list[tuple[int, float, float]] = field(default_factory=list)
    interrupted: bool = False
    finished: bool = False
    evaluation: dict[str, Any] = field(default_factory=dict)  # held-out metrics of the best heads
    best_step: int = 0
    best_score: float | None = None


def lr_factor(progress: float, step: int, warmup: int) -> float:
    """Warm-up, then cosine from 1 to 0.1 as `progress` goes from 0 to 1."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


class Trainer:
    """Runs an objective's optimizer steps until the step count or the time budget is spent."""

    def __init__(
        self,
        objective: Objective,
        settings: TrainSettings,
        *,
        save: Callable[[TrainState, torch.optim.Optimizer], None],
        report: Callable[[TrainState, float], None] | None = None,
        state: TrainState | None = None,
        optimizer_state: dict[str, Any] | None = None,
    ) -> None:
        if settings.steps is None and settings.budget_s is None:
            raise ValueError("training needs a step count or a time budget")
        self.objective, self.settings = objective, settings
        self.save, self.report = save, report
        self.state = state or TrainState()
        params = [p for p in objective.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        if optimizer_state:
            self.optimizer.load_state_dict(optimizer_state)
        self.params = params
        self.generator = torch.Generator().manual_seed(settings.seed + self.state.step)

    def progress(self, elapsed: float) -> float:
        s = self.settings
        parts = []
        if s.steps:
            parts.append(self.state.step / s.steps)
        if s.budget_s:
            parts.append(elapsed / s.budget_s)
        return max(parts) if parts else 0.0

    def run(self) -> TrainState:
        """Train to the end of the budget; returns the final state (the best heads are saved)."""
        state, s = self.state, self.settings
        started = perf_counter() - state.seconds
        last_checkpoint = last_eval = perf_counter()
        smooth: float | None = None
        try:
            while self.progress(perf_counter() - started) < 1.0:
                factor = lr_factor(self.progress(perf_counter() - started), state.step, s.warmup)
                for group in self.optimizer.param_groups:
                    group["lr"] = s.lr * factor
                loss, accuracy = self.objective.step_loss(self.generator)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if s.clip:
                    torch.nn.utils.clip_grad_norm_(self.params, s.clip)
                self.optimizer.step()
                state.step += 1
                value = float(loss.detach())
                smooth = value if smooth is None else 0.9 * smooth + 0.1 * value
                state.loss, state.accuracy = smooth, accuracy
                state.seconds = perf_counter() - started
                if state.step % 5 == 0 or state.step <= 5:
                    _record(state, smooth, accuracy)
                if self.report:
                    self.report(state, self.progress(state.seconds))
                if perf_counter() - last_eval >= s.eval_s:
                    self._evaluate()
                    last_eval = perf_counter()
                if perf_counter() - last_checkpoint >= s.checkpoint_s:
                    self._save_best()
                    last_checkpoint = perf_counter()
        except KeyboardInterrupt:
            state.interrupted = True
            state.seconds = perf_counter() - started
            self._evaluate()
            self._save_best()
            raise
        state.finished = True
        if state.loss is not None:
            _record(state, state.loss, state.accuracy or 0.0)
        self._evaluate()
        self._save_best()
        return state

    def _evaluate(self) -> None:
        """Score the current heads on held-out text; keep them if they are the best so far."""
        evaluation = self.objective.evaluate()
        score = self.objective.score(evaluation) if evaluation else None
        state = self.state
        if score is None or state.best_score is None or score > state.best_score:
            state.best_score, state.best_step, state.evaluation = score, state.step, evaluation
            self._best = self.objective.state()

    def _save_best(self) -> None:
        """Save the best heads so far (the current ones put back afterwards)."""
        best = getattr(self, "_best", None)
        current = self.objective.state() if best is not None else None
        if best is not None:
            self.objective.load(best)
        try:
            self.save(self.state, self.optimizer)
        finally:
            if current is not None:
                self.objective.load(current)


def _record(state: TrainState, loss: float, accuracy: float) -> None:
    """Keep the loss curve short: about a hundred points, evenly thinned."""
    if state.history and state.history[-1][0] == state.step:
        return
    state.history.append((state.step, round(loss, 4), round(accuracy, 4)))
    if len(state.history) > 120:
        state.history = state.history[::2]
