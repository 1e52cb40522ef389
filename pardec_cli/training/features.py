"""The frozen target's hidden states over a corpus, computed once and kept for every epoch.

One forward per sequence (no LM head: only the last position's logits are formed), under
no_grad (not inference mode: the states are later inputs of ops that autograd records);
the chosen states are kept in memory as [L, F] float tensors, and saved to a cache file
(safetensors, named by a hash of the sequences and layers) that the next run -- of
another head kind, or a --resume -- loads instead of running the target again. A corpus
whose states would not fit `max_bytes` is cut (the report says how much was used).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from pardec_cli.training.corpus import TrainingSequence


@dataclass
class FeatureSet:
    """Per sequence: its tokens [L] (long), the target's features [L, F], and where its labels start."""

    tokens: list[torch.Tensor]
    features: list[torch.Tensor]
    learn_from: list[int]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(int(t.shape[0]) for t in self.tokens)

    def split(self, every: int) -> tuple[FeatureSet, FeatureSet]:
        """(train, held out): every `every`-th sequence is held out (at least one when there are two or more)."""
        held = [i for i in range(len(self)) if i % every == every - 1] or ([len(self) - 1] if len(self) > 1 else [])
        keep = [i for i in range(len(self)) if i not in set(held)]

        def pick(indices: list[int]) -> FeatureSet:
            return FeatureSet([self.tokens[i] for i in indices], [self.features[i] for i in indices],
                              [self.learn_from[i] for i in indices])  # fmt: skip

        return pick(keep), pick(held)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap fingerprint of a model's weights (sums of a few slices), so caches follow re-imported weights."""
    params = list(model.parameters())
    picked = [params[0], params[len(params) // 2], params[-1]]
    return ",".join(f"{float(p.detach().flatten()[:4096].double().sum()):.6e}" for p in picked)


def features_cache_file(folder: Path, sequences: Sequence[TrainingSequence], layers: Sequence[int], fingerprint: str) -> Path:
    """Where the states of these sequences and layers, from the model with this fingerprint, are cached."""
    key = [fingerprint, list(layers), [[s.tokens, s.learn_from] for s in sequences]]
    digest = hashlib.sha1(json.dumps(key).encode()).hexdigest()
    return folder / f"features-{digest[:16]}.safetensors"


def compute_features(
    target: object,
    sequences: Sequence[TrainingSequence],
    layers: Sequence[int],
    *,
    max_bytes: int = 3 << 30,
    cache_file: Path | None = None,
    report: Callable[[int, int], None] | None = None,
) -> FeatureSet:
    """Run the target (a LanguageModel) over each sequence and keep the hidden states `layers` names."""
    if cache_file is not None and cache_file.is_file():
        cached = _load(cache_file)
        if cached is not None:
            return cached
    out = FeatureSet([], [], [])
    used = 0
    with torch.no_grad():
        for index, seq in enumerate(sequences):
            cache = target.new_cache()  # type: ignore[attr-defined]
            _, features = target.forward_features(seq.tokens, cache, layers, last_only=True)  # type: ignore[attr-defined]
            size = features.numel() * 4
            if used + size > max_bytes and out.tokens:
                break
            used += size
            out.tokens.append(torch.tensor(seq.tokens, dtype=torch.long))
            out.features.append(features.float().cpu().clone())
            out.learn_from.append(seq.learn_from)
            if report:
                report(index + 1, len(sequences))
    if cache_file is not None:
        _save(out, cache_file)
    return out


def _save(data: FeatureSet, file: Path) -> None:
    """One safetensors file: all states [N, F], all tokens [N], and per sequence its length and label start."""
    from safetensors.torch import save_file

    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    save_file({
        "features": torch.cat(data.features), "tokens": torch.cat(data.tokens),
        "lengths": torch.tensor([t.shape[0] for t in data.tokens]), "learn_from": torch.tensor(data.learn_from),
    }, str(tmp))  # fmt: skip
    tmp.replace(file)


def _load(file: Path) -> FeatureSet | None:
    from safetensors.torch import load_file

    try:
        saved = load_file(str(file))
        lengths = saved["lengths"].tolist()
        return FeatureSet(list(saved["tokens"].split(lengths)), list(saved["features"].split(lengths)),
                          saved["learn_from"].tolist())  # fmt: skip
    except Exception:  # a damaged cache is recomputed
        return None
