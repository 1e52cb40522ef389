"""Layer-skip self-speculation (Draft & Verify, Zhang et al. 2023; LayerSkip, Elhoushi et al. 2024).

The target drafts for itself by running only some of its layers (by default its first
N), then its final norm and LM head; the full model verifies. No extra weights: the draft
is a *view* that shares the target's modules, built once. It keeps its own KV cache,
which `ModelDrafter` keeps consistent with the target's rollbacks.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from pardec_cli.engine.model import LanguageModel
from pardec_cli.engine.proposal import EMPTY_DRAFT, Draft, Outcome, StartContext
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import AdaptiveLength, MethodEnv, ProposerBase
from pardec_cli.methods.drafter import ModelDrafter


def parse_layer_list(text: str, num_layers: int) -> list[int]:
    """'0-5,8,11' -> [0, 1, 2, 3, 4, 5, 8, 11], validated against the model's depth."""
    layers: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                layers.update(range(lo, hi + 1))
            else:
                layers.add(int(part))
    except ValueError:
        raise PardecUsageError(f"layer_list {text!r} is not like '0-5,8,11'") from None
    ordered = sorted(layers)
    if not ordered:
        raise PardecUsageError("layer_list is empty")
    if ordered[0] != 0:
        # The KV cache measures its length on layer 0, so the draft must run it.
        raise PardecUsageError(f"layer_list must include layer 0, got {text!r}")
    if ordered[-1] >= num_layers:
        raise PardecUsageError(f"layer_list names layer {ordered[-1]} but the model has {num_layers} (0-{num_layers - 1})")
    return ordered


def skip_middle_third(num_layers: int) -> list[int]:
    """The default draft: the first and the last third of the layers (Draft & Verify style).

    Models not trained for early exit predict poorly from their first layers alone: on
    SmolLM2-135M (30 layers, bf16, 5 prompts) drafting with layers 0-9 accepted 1.04
    tokens per step, 0-19 gave 1.14, and 0-9 plus 20-29 gave 1.26.
    """
    third = max(1, num_layers // 3)
    if num_layers < 3:
        return [0]
    return [*range(third), *range(num_layers - third, num_layers)]


def shallow_view(model: Any, layers: list[int]) -> Any:
    """A model of the same class that runs only `layers` of `model`, sharing every weight.

    Works for decoders laid out like Llama (`model.model.layers`, `embed_tokens`, `norm`,
    `rotary_emb`, and an LM head): the Llama, Mistral, Qwen2 and SmolLM families.
    """
    decoder = getattr(model, "model", None)
    needed = ("layers", "embed_tokens", "norm")
    if decoder is None or not all(hasattr(decoder, attr) for attr in needed):
        raise PardecUsageError(
            f"layerskip needs a Llama-style decoder; {type(model).__name__} is laid out differently"
        )
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    with torch.device("meta"):  # allocate nothing: every module is replaced below
        view = type(model)(config)
    view.model.embed_tokens = decoder.embed_tokens
    view.model.layers = torch.nn.ModuleList([decoder.layers[i] for i in layers])
    view.model.norm = decoder.norm
    if hasattr(decoder, "rotary_emb"):
        view.model.rotary_emb = decoder.rotary_emb
    view.lm_head = model.get_output_embeddings()
    leftovers = [name for name, p in view.named_parameters() if p.is_meta]
    leftovers += [name for name, b in view.named_buffers() if b.is_meta]
    if leftovers:
        raise PardecUsageError(f"layerskip cannot share {leftovers[0]} with {type(model).__name__}")
    return view.eval()


class LayerSkip(ProposerBase):
    """Chain drafts from the target's own early layers; draft length adapts to acceptance."""

    name = "layerskip"

    def __init__(
        self, env: MethodEnv, *, layers: int, layer_list: str, k: int, min_k: int, max_k: int, adaptive: bool
    ) -> None:
        total = int(env.target.config.num_hidden_layers)
        if layer_list:
            chosen = parse_layer_list(layer_list, total)
        elif layers:
            if not 1 <= layers < total:
                raise PardecUsageError(
                    f"layerskip layers must be between 1 and {total - 1}, or 0 for the default draft "
                    f"(the first and last third), got {layers}"
                )
            chosen = list(range(layers))
        else:
            chosen = skip_middle_third(total)
        self.layers = chosen
        self.length = AdaptiveLength(k, min_k, max_k, adaptive)
        view = LanguageModel(shallow_view(env.target.model, chosen))
        contiguous = chosen == list(range(len(chosen)))
        # A prefix of layers keeps its indices 0..n-1 and fits a cache laid out for the
        # view's config; a list with gaps keeps the target's layer indices, so its cache
        # must grow lazily to the highest index.
        cache_factory = view.new_cache if contiguous else _lazy_cache
        self.drafter = ModelDrafter(view, env.target.vocab_size, cache_factory)

    def start(self, ctx: StartContext) -> None:
        self.drafter.start(ctx)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        k = min(self.length.k, max_tokens)
        return self.drafter.draft(context, k) if k > 0 else EMPTY_DRAFT

    def update(self, context: Sequence[int], draft: Draft, outcome: Outcome) -> None:
        self.length.update(len(draft), outcome.accepted)

    def knobs(self) -> dict[str, Any]:
        layers = self.layers
        described = f"0-{layers[-1]}" if layers == list(range(len(layers))) else ",".join(map(str, layers))
        return {"layers": described, "k": self.length.k, "min_k": self.length.min_k, "max_k": self.length.max_k}


def _lazy_cache() -> Any:
    from transformers import DynamicCache

    return DynamicCache()
