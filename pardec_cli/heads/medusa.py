"""Medusa heads (Cai et al. 2024; the FasterDecoding/medusa-* repos).

Head k (0-based) reads the target's final, post-norm hidden state h[t] -- the one its LM
head turns into x[t+1] -- and guesses x[t+2+k]: ``LMhead_k(block^L(h))``, each block a
residual ``x + SiLU(W x + b)``. Published files: config.json with ``medusa_num_heads``,
``medusa_num_layers`` and ``base_model_name_or_path``; weights ``medusa_lm_head.safetensors``
(newer) or ``medusa_lm_head.pt`` with tensors ``{head}.{layer}.linear.weight|bias`` and
``{head}.{num_layers}.weight`` (the head's LM head, [V, h], no bias). The head count is
read from the tensors: some configs under-report it.

Every head's LM head starts as a copy of the target's; heads trained with it frozen (as
`pardec train-heads` does) still hold such copies on disk, and pardec then keeps one
shared matrix in memory and scores all heads with it in one product.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pardec_cli.errors import ModelLoadError
from pardec_cli.heads.files import expect_shape, find_weights, load_tensors, mismatch, read_config, save_tensors
from pardec_cli.heads.vocab import DraftVocab

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin")
_BLOCK = re.compile(r"(\d+)\.(\d+)\.linear\.weight")
_HEAD = re.compile(r"(\d+)\.(\d+)\.weight")


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b), W [h, h] (zero at initialisation: the identity)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """The residual blocks of every head, and their LM heads.

    `lm_heads` holds one [V, h] matrix shared by all heads (their LM heads equal the
    target's) or one per head; `use_vocab` chooses the tokens they draft from.
    """

    def __init__(self, num_heads: int, num_layers: int, hidden: int) -> None:
        super().__init__()
        self.num_heads, self.num_layers = num_heads, num_layers
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResidualBlock(hidden) for _ in range(num_layers))) for _ in range(num_heads)
        )
        self.lm_heads: list[torch.Tensor] = []
        self.vocabs: list[DraftVocab] = []

    def use_vocab(self, token_ids: Sequence[int] | None) -> None:
        """Draft from `token_ids` only (None: the whole vocabulary)."""
        self.vocabs = [DraftVocab.restricted(weight, token_ids) for weight in self.lm_heads]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., h] -> every head's LM-head input [..., H, h]."""
        return torch.stack([block(hidden) for block in self.blocks], dim=-2)

    def top(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """hidden [h] (one position) -> target ids [H, k]: each head's k most likely tokens, best first."""
        states = self(hidden)  # [H, h]
        if len(self.vocabs) == 1:  # one shared LM head: score all heads in one product
            return self.vocabs[0].top(states, k)[1]
        return torch.cat([vocab.top(states[i : i + 1], k)[1] for i, vocab in enumerate(self.vocabs)])

    def published_state(self, lm_head: torch.Tensor) -> dict[str, torch.Tensor]:
        """Tensors in the published layout; each head gets `lm_head` [V, h] as its LM head."""
        state: dict[str, torch.Tensor] = {}
        for head, block in enumerate(self.blocks):
            for layer, res in enumerate(block):
                state[f"{head}.{layer}.linear.weight"] = res.linear.weight
                state[f"{head}.{layer}.linear.bias"] = res.linear.bias
            state[f"{head}.{self.num_layers}.weight"] = lm_head
        return state


def _strip_prefix(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept checkpoints saved from the whole Medusa model (``medusa_head.0.0...``)."""
    out = {}
    for name, tensor in tensors.items():
        for prefix in ("medusa_head.", "module.medusa_head."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        out[name] = tensor
    return out


def load_medusa(folder: Path, target: Any, model_name: str, *, draft_vocab: Sequence[int] | None = None) -> MedusaHeads:
    """Medusa heads from `folder`, checked against and bound to `target` (a LanguageModel).

    The head count comes from the tensors; a hidden size or vocabulary that differs from
    the model's is refused with a message naming it. `draft_vocab`: target ids to draft
    from instead of the whole vocabulary.
    """
    what = f"Medusa heads in {folder}"
    raw = read_config(folder, what)
    tensors = _strip_prefix(load_tensors(find_weights(folder, WEIGHT_FILES, what), what))
    blocks = [tuple(map(int, m.groups())) for m in map(_BLOCK.fullmatch, tensors) if m]
    if not blocks:
        raise ModelLoadError(f"{what}: no tensors named like '0.0.linear.weight' (not a Medusa layout)")
    num_heads = max(head for head, _ in blocks) + 1
    num_layers = max(layer for _, layer in blocks) + 1
    configured = raw.get("medusa_num_layers")
    if isinstance(configured, int) and configured != num_layers:
        raise ModelLoadError(f"{what}: config.json says {configured} layers per head, the weights have {num_layers}")
    hidden = int(target.config.hidden_size)
    first = tensors["0.0.linear.weight"]
    if first.shape[-1] != hidden:
        raise mismatch("Medusa heads", "hidden size", int(first.shape[-1]), hidden, model_name)
    out_name = f"0.{num_layers}.weight"
    if out_name in tensors and tensors[out_name].shape[0] != target.vocab_size:
        raise mismatch("Medusa heads", "vocabulary size", int(tensors[out_name].shape[0]), target.vocab_size, model_name)
    heads = MedusaHeads(num_heads, num_layers, hidden)
    state = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            for part, shape in (("weight", (hidden, hidden)), ("bias", (hidden,))):
                name = f"{head}.{layer}.linear.{part}"
                state[f"blocks.{head}.{layer}.linear.{part}"] = expect_shape(tensors, name, shape, what)
    heads.load_state_dict(state)
    heads.to(device=target.device, dtype=target.dtype)
    lm_head = target.model.get_output_embeddings().weight  # [V, h]
    own = [expect_shape(tensors, f"{h}.{num_layers}.weight", tuple(lm_head.shape), what) for h in range(num_heads)]
    as_saved: dict[torch.dtype, torch.Tensor] = {}  # the target's LM head in each dtype the heads use
    for w in own:
        as_saved.setdefault(w.dtype, lm_head.detach().to(device="cpu", dtype=w.dtype))
    if all(torch.equal(w, as_saved[w.dtype]) for w in own):
        # Every head's LM head is the target's own (possibly stored in a narrower dtype): share it.
        heads.lm_heads = [lm_head]
    else:
        heads.lm_heads = [w.to(device=target.device, dtype=target.dtype) for w in own]
    heads.use_vocab(draft_vocab)
    return heads.eval().requires_grad_(False)


def save_medusa(
    heads: MedusaHeads, folder: Path, *, lm_head: torch.Tensor, base_model: str, dtype: torch.dtype | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    """Write `heads` in the published layout: config.json + medusa_lm_head.safetensors.

    `lm_head` [V, h] is written as every head's LM head (in `dtype`, e.g. bfloat16 to
    halve the file; pardec recognises such copies as the target's own when loading).
    """
    config = {
        "medusa_num_heads": heads.num_heads,
        "medusa_num_layers": heads.num_layers,
        "base_model_name_or_path": base_model,
        "hidden_size": int(lm_head.shape[1]),
        "vocab_size": int(lm_head.shape[0]),
        **(extra_config or {}),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    head = lm_head.detach().to(dtype=dtype or lm_head.dtype)
    state = heads.published_state(head)
    save_tensors(state, folder / "medusa_lm_head.safetensors")
