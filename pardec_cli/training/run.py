"""`pardec train-heads` without the printing: corpus -> target features -> heads -> the store.

    1. the corpus: the target's own replies to prompts (self-distillation; cached), and/or text;
    2. the draft vocabulary: the tokens the corpus' labels use, most frequent first;
    3. the frozen target's hidden states over the corpus, once;
    4. training (`trainer.Trainer`), saving the heads in their published layout into
       ``heads_root()/<model key>/<kind>/`` at every checkpoint, at the end and on Ctrl-C.

The whole run keeps to the time budget: replies are generated for at most half of it,
training gets what is left.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from pardec_cli.errors import PardecUsageError
from pardec_cli.heads.eagle import EagleDrafter, eagle3_feature_layers, init_scale, new_eagle_config, save_eagle
from pardec_cli.heads.files import load_tensors
from pardec_cli.heads.medusa import MedusaHeads, save_medusa
from pardec_cli.heads.vocab import DraftVocab
from pardec_cli.store import records
from pardec_cli.store.heads import HEAD_KINDS, MARKER_NAME, heads_root, read_marker, replace_dir, trained_heads_dir
from pardec_cli.training.corpus import TrainingSequence, distill, distill_cache_file, read_corpus, text_sequences
from pardec_cli.training.features import compute_features, features_cache_file, weights_fingerprint
from pardec_cli.training.objectives import EagleObjective, MedusaObjective
from pardec_cli.training.trainer import Trainer, TrainSettings, TrainState

TRAINING_STATE = "pardec-training-state.pt"
DEFAULT_LR = {"medusa": 1e-3, "eagle": 1e-3, "eagle3": 1e-3}


@dataclass
class TrainOptions:
    """What `pardec train-heads` was asked for."""

    kind: str
    data: Path | None = None
    steps: int | None = None
    budget_s: float | None = None
    num_heads: int = 4  # Medusa
    samples: int | None = None  # prompts to self-distill (default: all)
    reply_tokens: int = 192
    draft_vocab: int = 8192
    lr: float | None = None
    unroll: int = 2  # EAGLE training-time-test steps
    batch_size: int = 16  # replies generated at once
    max_len: int = 256  # tokens per EAGLE training window (and per chunk of plain text)
    resume: bool = False
    seed: int = 0
    checkpoint_s: float = 300.0


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during `train_heads`: where the heads were saved (None: before training began) and what was kept."""

    def __init__(self, saved: Path | None, kept: str) -> None:
        super().__init__(kept)
        self.saved, self.kept = saved, kept


@dataclass
class TrainResult:
    folder: Path
    state: TrainState
    evaluation: dict[str, Any]
    corpus_sequences: int
    corpus_tokens: int
    draft_vocab: int
    notes: list[str] = field(default_factory=list)


Say = Callable[[str], None]
Show = Callable[[str], None]


def train_heads(session: Any, options: TrainOptions, *, say: Say, show: Show) -> TrainResult:
    """Train heads of `options.kind` for the session's model; see the module docstring.

    `say(line)` reports a finished stage, `show(line)` the current progress (a line that
    a terminal redraws).
    """
    if options.kind not in HEAD_KINDS:
        raise PardecUsageError(f"unknown head kind {options.kind!r}; choose from {', '.join(HEAD_KINDS)}")
    start = perf_counter()
    budget = options.budget_s if options.budget_s is not None else (None if options.steps else 1800.0)
    deadline = start + budget if budget else None
    key = session.heads_key()
    folder = trained_heads_dir(key, options.kind)
    target = session.target
    target.model.requires_grad_(False)
    torch.manual_seed(options.seed)

    try:
        sequences, source = _corpus(session, options, key, deadline, say, show)
    except KeyboardInterrupt:
        raise TrainingInterrupted(None, "the replies generated so far are cached for the next run") from None
    previous = read_marker(folder) if options.resume else {}
    if options.resume and not previous:
        raise PardecUsageError(f"--resume: no {options.kind} heads to resume in {folder}")
    vocab_ids = [int(t) for t in previous["draft_vocab"]] if previous.get("draft_vocab") else _draft_vocab(
        sequences, options.draft_vocab, session.eos_token_ids, target.vocab_size
    )
    # EAGLE-3 reads three layers; the final state (-1) is every kind's source of labels.
    layers = (*eagle3_feature_layers(int(target.config.num_hidden_layers)), -1) if options.kind == "eagle3" else (-1,)
    target.check_feature_layers(layers)
    show(f"computing the model's hidden states over {len(sequences)} sequences")
    try:
        data = compute_features(
            target, sequences, layers,
            cache_file=features_cache_file(heads_root() / key / ".cache", sequences, layers, weights_fingerprint(target.model)),
            report=lambda i, n: show(f"hidden states: {i}/{n} sequences"),
        )  # fmt: skip
    except KeyboardInterrupt:
        raise TrainingInterrupted(None, "the replies are cached for the next run") from None
    notes = []
    if len(data) < len(sequences):
        notes.append(f"used {len(data)} of {len(sequences)} sequences (memory limit for the hidden states)")
    train, held_out = data.split(10)
    say(f"corpus: {len(data)} sequences, {data.num_tokens} tokens ({source}); draft vocabulary {len(vocab_ids)} tokens")

    objective, head = _objective(session, options, vocab_ids, folder if options.resume else None)
    objective.bind(train, held_out)
    remaining = None if deadline is None else max(1.0, deadline - perf_counter())
    settings = TrainSettings(
        steps=options.steps, budget_s=remaining, lr=options.lr or DEFAULT_LR[options.kind],
        checkpoint_s=options.checkpoint_s, seed=options.seed,
    )  # fmt: skip
    state, optimizer_state = _resume_state(folder) if options.resume else (None, None)
    if state is not None and options.steps:
        settings.steps = state.step + options.steps  # --steps counts the new steps
    if state is not None:
        state.finished = state.interrupted = False
    meta = {
        "model": session.model_name, "model_key": key, "source": source, "sequences": len(data),
        "tokens": data.num_tokens, "options": _jsonable(asdict(options)),
    }  # fmt: skip

    def save(state: TrainState, optimizer: torch.optim.Optimizer) -> None:
        _save(session, options.kind, head, folder, vocab_ids, state, optimizer, meta)

    def report(state: TrainState, progress: float) -> None:
        eta = state.seconds / progress - state.seconds if progress > 0 else 0.0
        from pardec_cli.training.progress import clock

        total = f"/{settings.steps}" if settings.steps else ""
        best = f"  held-out {state.best_score:.2f} (step {state.best_step})" if state.best_score is not None else ""
        show(f"step {state.step}{total}  loss {state.loss:.3f}  top-1 {state.accuracy:.2f}{best}  "
             f"{clock(state.seconds)} elapsed, {clock(eta)} left")  # fmt: skip

    trainer = Trainer(objective, settings, save=save, report=report, state=state, optimizer_state=optimizer_state)
    try:
        final = trainer.run()
    except KeyboardInterrupt:
        raise TrainingInterrupted(folder, f"the heads trained so far ({trainer.state.step} steps) are saved") from None
    return TrainResult(folder, final, final.evaluation, len(data), data.num_tokens, len(vocab_ids), notes)


# ------------------------------------------------------------------- stages


def _corpus(
    session: Any, options: TrainOptions, key: str, deadline: float | None, say: Say, show: Show
) -> tuple[list[TrainingSequence], str]:
    corpus = read_corpus(options.data)
    prompts = corpus.prompts[: options.samples] if options.samples else corpus.prompts
    sequences = text_sequences(corpus.texts, session.tokenizer, options.max_len)
    if prompts:
        cache = distill_cache_file(heads_root() / key / ".cache", prompts, options.reply_tokens)
        began = perf_counter()
        # Replies get at most half of the time budget; training needs the rest.
        stop = None if deadline is None else began + (deadline - began) / 2

        cached: list[int] = []  # prompts already replied to in an earlier run

        def report(done: int, total: int, tokens: int) -> None:
            from pardec_cli.training.progress import clock

            if not cached:
                cached.append(done)
            rate = (done - cached[0]) / max(perf_counter() - began, 1e-6)
            eta = f", about {clock((total - done) / rate)} left" if done < total and rate > 0 else ""
            show(f"generating the model's replies: {done}/{total} prompts, {tokens} tokens{eta}")

        replies = distill(session, prompts, reply_tokens=options.reply_tokens, cache_file=cache,
                          batch_size=options.batch_size, deadline=stop, report=report)  # fmt: skip
        if len(replies) < len(prompts):
            say(f"replies: {len(replies)} of {len(prompts)} prompts in the time budget (the rest next time: they are cached)")
        sequences += replies
    if len(sequences) < 2:
        raise PardecUsageError("the corpus is too small to train on", hint="give more text with --data, or a larger --budget")
    return sequences, corpus.source


def _draft_vocab(
    sequences: Sequence[TrainingSequence], size: int, eos: set[int], vocab_size: int
) -> list[int]:
    """The label tokens of the corpus, most frequent first (ties by id), at most `size`; EOS always in."""
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(seq.tokens[max(seq.learn_from, 1) :])
    ordered = [t for t, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if t < vocab_size]
    chosen = [t for t in eos if t < vocab_size] + [t for t in ordered if t not in eos]
    return chosen[: max(size, 1)] if size > 0 else chosen


def _objective(session: Any, options: TrainOptions, vocab_ids: list[int], resume_from: Path | None) -> tuple[Any, Any]:
    """(the objective, the module that is saved) for `options.kind`."""
    target = session.target
    lm_head = target.model.get_output_embeddings().weight.detach()  # [V, h]
    target_vocab = DraftVocab.restricted(lm_head.float(), vocab_ids)  # the labels' source
    hidden = int(target.config.hidden_size)
    if options.kind == "medusa":
        heads = MedusaHeads(options.num_heads, 1, hidden).float()
        if resume_from is not None:
            _load_resumed(heads, resume_from / "medusa_lm_head.safetensors", lambda name: f"blocks.{name}",
                          skip=lambda name: name.endswith(f".{heads.num_layers}.weight"))  # fmt: skip
        return MedusaObjective(heads, target_vocab), heads
    version = 3 if options.kind == "eagle3" else 1
    config = new_eagle_config(target.config, version, draft_vocab_size=len(vocab_ids))
    embed = target.model.get_input_embeddings().weight.detach().float()
    drafter = EagleDrafter(config, embed)
    init_scale(drafter)
    if version == 3:
        ids = torch.tensor(vocab_ids, dtype=torch.long)
        with torch.no_grad():
            drafter.lm_head.weight.copy_(lm_head.float().index_select(0, ids))  # start from the target's own rows
            drafter.d2t.copy_(ids - torch.arange(len(vocab_ids)))
            drafter.t2d.zero_()
            drafter.t2d[ids] = True
    if resume_from is not None:
        _load_resumed(drafter, resume_from / "model.safetensors", lambda name: name)
    drafter.float()
    vocab = DraftVocab(drafter.lm_head.weight, torch.tensor(vocab_ids)) if version == 3 else target_vocab
    objective = EagleObjective(drafter, vocab, target_vocab, unroll=options.unroll, regression=version == 1,
                               max_len=options.max_len)  # fmt: skip
    return objective, drafter


def _load_resumed(module: torch.nn.Module, file: Path, rename: Callable[[str], str], skip: Callable[[str], bool] = lambda n: False) -> None:
    tensors = {rename(k): v for k, v in load_tensors(file, "heads to resume").items() if not skip(k)}
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    bad = [m for m in missing if not m.startswith("rotary.")]
    if bad or unexpected:
        raise PardecUsageError(f"--resume: the saved heads do not fit these options ({(bad or unexpected)[0]})")


def _resume_state(folder: Path) -> tuple[TrainState | None, dict[str, Any] | None]:
    marker = read_marker(folder)
    state = TrainState(step=int(marker.get("steps", 0)), seconds=float(marker.get("train_seconds", 0.0)),
                       history=[tuple(h) for h in marker.get("loss_history", [])])  # fmt: skip
    file = folder / TRAINING_STATE
    optimizer = torch.load(str(file), map_location="cpu", weights_only=True) if file.is_file() else None
    return state, optimizer


def _save(
    session: Any, kind: str, head: Any, folder: Path, vocab_ids: list[int], state: TrainState,
    optimizer: torch.optim.Optimizer, meta: dict[str, Any],
) -> None:  # fmt: skip
    """Write the heads (published layout), the optimizer state and the marker into `folder`, atomically."""
    target = session.target
    base_model = session.model_repo or session.model_name
    marker = {
        "format": 1, "kind": kind, "created": records.now(), **meta,
        "steps": state.step, "train_seconds": round(state.seconds, 1), "loss": state.loss,
        "interrupted": state.interrupted, "finished": state.finished, "eval": state.evaluation,
        "best_step": state.best_step,
        "loss_history": state.history, "draft_vocab": vocab_ids,
    }  # fmt: skip

    def write(tmp: Path) -> None:
        if kind == "medusa":
            lm_head = target.model.get_output_embeddings().weight.detach()
            file_dtype = lm_head.dtype if lm_head.dtype != torch.float32 else torch.bfloat16
            save_medusa(head, tmp, lm_head=lm_head, base_model=base_model, dtype=file_dtype)
        else:
            save_eagle(head, tmp, base_model=base_model)
        torch.save(optimizer.state_dict(), str(tmp / TRAINING_STATE))
        (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=1) + "\n", "utf-8")  # last: marks it complete

    replace_dir(folder, write)


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}
