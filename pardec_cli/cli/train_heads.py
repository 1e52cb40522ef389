"""`pardec train-heads`: train Medusa or EAGLE heads for a local model, then use them with --method."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pardec_cli.cli.options import FiniteFloat, model_options
from pardec_cli.cli.output import is_terminal, loading_status


@click.command("train-heads")
@model_options
@click.option("--kind", type=click.Choice(["medusa", "eagle", "eagle3"]), required=True,
              help="medusa: Medusa heads; eagle: an EAGLE-1/2 head (the target's LM head, for --method eagle); "
              "eagle3: an EAGLE-3 head (three layers' features, its own small LM head, for --method eagle3).")
@click.option("--data", type=click.Path(exists=True, path_type=Path), default=None, metavar="FILE|DIR",
              help="Training text: .txt/.md files, .jsonl lines with \"text\" (learned as is) or \"prompt\"/\"turns\" "
              "(replied to by the model, then learned). Default: the model's own replies to pardec's built-in prompts.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Stop after this many training steps.")
@click.option("--budget", "budget_min", type=FiniteFloat(min=0.1), default=None, metavar="MINUTES",
              help="Stop after this many minutes in all (replies, hidden states and training). "
              "Default: 30, unless --steps is given.")
@click.option("--heads", "num_heads", type=click.IntRange(1, 10), default=4, show_default=True,
              help="Number of Medusa heads (head k guesses the token k + 2 places ahead).")
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Use only the first N prompts.")
@click.option("--reply-tokens", type=click.IntRange(min=8), default=192, show_default=True,
              help="Longest reply generated per prompt.")
@click.option("--draft-vocab", type=click.IntRange(min=0), default=8192, show_default=True,
              help="Draft from the N most frequent tokens of the corpus (0: all it uses). Smaller drafts faster on a CPU.")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=None, help="Peak learning rate (default 1e-3).")
@click.option("--unroll", type=click.IntRange(1, 5), default=2, show_default=True,
              help="EAGLE: training-time-test steps (the head also learns from its own guesses, as when drafting deeper).")
@click.option("--resume", is_flag=True, help="Continue training the heads saved earlier (their weights and optimizer).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
def train_heads(model: str | None, dtype: str, weights: str, device: str, offline: bool | None, kind: str, data: Path | None,
                steps: int | None, budget_min: float | None, num_heads: int, samples: int | None, reply_tokens: int,
                draft_vocab: int, lr: float | None, unroll: int, resume: bool, seed: int) -> None:
    """Train Medusa or EAGLE heads for MODEL (its weights stay frozen) and install them.

    The heads learn from the model's own greedy replies to a built-in set of prompts
    (chat, code, summaries, extraction, math...), generated once and cached, or from
    --data. They are saved in the published layout (FasterDecoding's Medusa, yuhuili's
    EAGLE) into pardec's store next to the model -- at every checkpoint (5 minutes), at
    the end, and on Ctrl-C -- where `--method medusa|eagle|eagle3` finds them.

    \b
    Examples:
      pardec train-heads --kind eagle --budget 20
      pardec train-heads -m qwen2.5-0.5b --kind medusa --steps 2000
      pardec train-heads --kind eagle --data my_chats.jsonl --resume
      pardec gen --method eagle --stats "Explain the KV cache"
    """
    from pardec_cli.session import Session
    from pardec_cli.training.progress import ProgressLine, clock
    from pardec_cli.training.run import TrainingInterrupted, TrainOptions, train_heads as run

    options = TrainOptions(
        kind=kind, data=data, steps=steps, budget_s=budget_min * 60 if budget_min else None, num_heads=num_heads,
        samples=samples, reply_tokens=reply_tokens, draft_vocab=draft_vocab, lr=lr, unroll=unroll, resume=resume,
        seed=seed,
    )  # fmt: skip
    with loading_status("loading model"):
        session = Session.load(model, dtype=dtype, device=device, offline=offline, progress=is_terminal(sys.stderr),
                               weights=weights)
    line = ProgressLine(sys.stderr, terminal=is_terminal(sys.stderr))

    def say(text: str) -> None:
        line.clear()
        click.echo(f"pardec: {text}", err=True)

    say(f"training {kind} heads for {session.model_name} ({session.dtype} on {session.device})")
    try:
        result = run(session, options, say=say, show=line.show)
    except TrainingInterrupted as stop:
        line.clear()
        where = f" in {stop.saved}" if stop.saved else ""
        click.echo(f"pardec: stopped: {stop.kept}{where}", err=True)
        raise
    line.clear()
    state = result.state
    for note in result.notes:
        say(note)
    first = state.history[0][1] if state.history else None
    curve = f"loss {first:.3f} -> {state.loss:.3f}" if first is not None and state.loss is not None else ""
    say(f"{state.step} steps in {clock(state.seconds)}, {curve}")
    for name, values in result.evaluation.items():
        say(f"held-out {name.replace('_', ' ')} (agreement with the model): {' '.join(f'{v:.2f}' for v in values)}, "
            f"from the heads of step {state.best_step}, the best on held-out text")
    say(f"saved to {result.folder}")
    method = {"medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3"}[kind]
    model_flag = f" -m {model}" if model else ""
    click.echo(f"pardec: use them: pardec gen{model_flag} --method {method} \"...\"", err=True)
