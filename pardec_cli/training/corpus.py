"""What heads learn from: token sequences, and which of their positions to learn.

Two sources:

- Self-distillation (the default, and for any prompt list): the target's own greedy
  replies to prompts, through its chat template. The replies are exactly the text the
  heads will have to guess at generation time, so no download and no mismatch between
  the corpus and the model's style. The built-in prompts (package data,
  ``data/train_prompts.jsonl``: explanations, advice, writing, code and code edits,
  summaries, extraction, translation, math, questions over a passage) cover the task
  profiles. Replies are generated in batches (left-padded) and appended to a cache file
  as each batch finishes, so an interrupted run loses nothing and a second run -- of
  another head kind, say -- reuses them.
- Text (``--data FILE|DIR``): ``.txt``/``.md`` files, and ``.jsonl`` lines with a "text"
  field, are learned as they are; ``.jsonl`` lines with a "prompt" (or Spec-Bench
  "turns") are prompts to self-distill.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from time import perf_counter
from typing import Any

from pardec_cli.errors import PardecUsageError

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)


@dataclass(frozen=True)
class TrainingSequence:
    """Token ids and the first position whose token is a label (the reply; 0 for plain text)."""

    tokens: tuple[int, ...]
    learn_from: int


@dataclass
class Corpus:
    """Prompts to self-distill and texts to learn as they are."""

    prompts: list[str]
    texts: list[str]
    source: str


def builtin_prompts() -> list[str]:
    """The prompts shipped with pardec, for self-distillation."""
    text = resources.files("pardec_cli").joinpath("data", "train_prompts.jsonl").read_text("utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def read_corpus(path: Path | None) -> Corpus:
    """The built-in prompts (path None), or the prompts and texts of a file or a directory's files."""
    if path is None:
        return Corpus(builtin_prompts(), [], "built-in prompts (self-distilled)")
    if not path.exists():
        raise PardecUsageError(f"--data {path}: no such file or directory")
    files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise PardecUsageError(f"--data {path}: no .txt, .md or .jsonl files in it")
    corpus = Corpus([], [], str(path))
    for file in files:
        if file.suffix in JSONL_SUFFIXES:
            _read_jsonl(file, corpus)
        else:
            try:
                text = file.read_text("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PardecUsageError(f"--data: cannot read {file}: {exc}") from None
            if text.strip():
                corpus.texts.append(text)
    if not corpus.prompts and not corpus.texts:
        raise PardecUsageError(f"--data {path} holds no text")
    return corpus


def _read_jsonl(file: Path, corpus: Corpus) -> None:
    try:
        lines = file.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PardecUsageError(f"--data: cannot read {file}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise PardecUsageError(f"{file}:{number}: not valid JSON") from None
        if isinstance(record, str):
            corpus.prompts.append(record)
        elif isinstance(record, dict) and isinstance(record.get("text"), str):
            corpus.texts.append(record["text"])
        elif isinstance(record, dict) and isinstance(record.get("prompt"), str):
            corpus.prompts.append(record["prompt"])
        elif isinstance(record, dict) and isinstance(record.get("turns"), list) and record["turns"]:
            corpus.prompts.append(str(record["turns"][0]))
        else:
            raise PardecUsageError(f"{file}:{number}: expected a \"text\", \"prompt\" or \"turns\" field")


def text_sequences(texts: Sequence[str], tokenizer: Any, max_len: int) -> list[TrainingSequence]:
    """Plain texts cut into windows of at most `max_len` tokens, every position a label."""
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        for start in range(0, len(ids), max_len):
            window = ids[start : start + max_len]
            if len(window) >= 8:
                out.append(TrainingSequence(tuple(window), 0))
    return out


# ------------------------------------------------------------- self-distillation


def distill_cache_file(folder: Path, prompts: Sequence[str], reply_tokens: int) -> Path:
    """The cache of replies for this prompt list and reply length, under `folder`."""
    digest = hashlib.sha1(json.dumps([list(prompts), reply_tokens]).encode("utf-8")).hexdigest()[:12]
    return folder / f"distilled-{digest}.jsonl"


def _cached_replies(file: Path) -> dict[str, list[int]]:
    replies: dict[str, list[int]] = {}
    try:
        lines = file.read_text("utf-8").splitlines()
    except OSError:
        return replies
    for line in lines:
        try:
            record = json.loads(line)
            replies[str(record["prompt"])] = [int(t) for t in record["reply"]]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by an interruption
    return replies


def distill(
    session: Any,
    prompts: Sequence[str],
    *,
    reply_tokens: int,
    cache_file: Path,
    batch_size: int = 16,
    deadline: float | None = None,
    report: Callable[[int, int, int], None] | None = None,
) -> list[TrainingSequence]:
    """The target's greedy replies to `prompts` (chat template), as prompt + reply sequences.

    Replies already in `cache_file` are reused; new ones are appended batch by batch.
    Generation stops starting new batches after `deadline` (a perf_counter() time).
    `report(done, total, reply tokens so far)` is called after each batch.
    """
    cached = _cached_replies(cache_file)
    encoded = {p: session.encode(p) for p in prompts}
    todo = sorted((p for p in dict.fromkeys(prompts) if p not in cached), key=lambda p: len(encoded[p]))
    done = len(prompts) - len(todo)
    tokens_so_far = sum(len(cached[p]) for p in prompts if p in cached)
    if report:
        report(done, len(prompts), tokens_so_far)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    for batch in _batches(todo, batch_size):
        if deadline is not None and perf_counter() > deadline:
            break
        replies = _generate(session, [encoded[p] for p in batch], reply_tokens)
        with open(cache_file, "a", encoding="utf-8") as f:
            for prompt, reply in zip(batch, replies):
                f.write(json.dumps({"prompt": prompt, "reply": reply}) + "\n")
                cached[prompt] = reply
        done += len(batch)
        tokens_so_far += sum(len(r) for r in replies)
        if report:
            report(done, len(prompts), tokens_so_far)
    return [
        TrainingSequence(tuple(encoded[p]) + tuple(cached[p]), len(encoded[p]))
        for p in prompts
        if p in cached and cached[p]
    ]


def _batches(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _generate(session: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy replies of the target to a batch of encoded prompts (left-padded), each cut after its first EOS."""
    import torch

    eos = sorted(session.eos_token_ids)
    pad = eos[0] if eos else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=session.target.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=session.target.device)
    with torch.inference_mode():
        out = session.target.model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos or None, pad_token_id=pad,
        )  # fmt: skip
    replies = []
    for row in out[:, width:].tolist():
        for i, token in enumerate(row):
            if token in eos:
                row = row[: i + 1]
                break
        replies.append(row)
    return replies
