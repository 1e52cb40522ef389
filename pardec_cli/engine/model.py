"""A causal LM as the loop sees it: a forward over new tokens on top of a KV cache.

Wraps a Hugging Face `PreTrainedModel` without changing it (no attributes stashed on
the model, no patched classes), so the same object can serve as target and, through
`methods.layerskip`, as its own drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pardec_cli.engine.attention import CPU_ATTENTION, KERNEL_ATTENTION
from pardec_cli.engine.cache import cache_keyword, cache_length, new_cache
from pardec_cli.engine.tree import tree_attention
from pardec_cli.errors import PardecUsageError
from pardec_cli.quant import row_tile

# Attention implementations that apply a 4-D additive float mask as given.
TREE_ATTENTION = ("sdpa", "eager", CPU_ATTENTION, KERNEL_ATTENTION)


class LanguageModel:
    """The few operations decoding needs from a causal language model."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        first = next(model.parameters())
        self.device = first.device
        self.dtype = first.dtype
        #: Rows the step computes in tiles of (`quant.row_tile`); the loop fits drafts to them.
        self.row_tile = row_tile(model)
        self._cache_keyword = cache_keyword(model)

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head: the width of the logits this model returns."""
        head = self.model.get_output_embeddings()
        return int(head.weight.shape[0]) if head is not None else int(self.config.vocab_size)

    @property
    def max_context(self) -> int | None:
        """The longest sequence the model was trained for, if its config says."""
        return getattr(self.config, "max_position_embeddings", None)

    def new_cache(self, tokens: int = 0) -> Any:
        """A fresh KV cache; `tokens` (prompt + tokens to generate, 0 if unknown) lets a
        preallocating cache size itself. The dynamic cache grows as needed."""
        return new_cache(self.config)

    def warm(self, *, hidden_layers: bool = False, contexts: Sequence[int] = ()) -> None:
        """Prepare the decoding steps ahead of time, before anything is measured or a user
        waits (the compiled runner compiles its graphs here, for generations that reach the
        token counts in `contexts` when that matters); nothing to do eagerly."""

    def as_input(self, token_ids: Sequence[int]) -> torch.Tensor:
        """token ids -> LongTensor [1, n] on the model's device."""
        return torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)

    def forward(
        self,
        token_ids: Sequence[int],
        cache: Any,
        *,
        last_only: bool = False,
        parents: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Run the model over `token_ids` appended after what `cache` holds.

        Returns logits [n, V] for each new position (row i predicts the token after
        token_ids[i]), or [1, V] for the last position only when `last_only` (prefill:
        saves the n x V LM-head product). The cache grows by n positions.

        With `parents` (one per token after the first; see `engine.tree`), the tokens are
        a tree under token_ids[0]: each attends to the cache and its own ancestors only,
        at position cache length + depth, through a 4-D mask and explicit position ids.
        """
        return self._run(token_ids, cache, last_only, parents, hidden=False).logits[0]

    def forward_rows(self, token_ids: Sequence[int], cache: Any, *, parents: Sequence[int] | None = None) -> Any:
        """`forward` for a caller that reads the logits row by row (verification): a [n, V]
        tensor here; a runner whose head can run for some rows only may return
        `engine.verify.HeadRows`, computing the rows as they are read."""
        return self.forward(token_ids, cache, parents=parents)

    def forward_features(
        self,
        token_ids: Sequence[int],
        cache: Any,
        layers: Sequence[int],
        *,
        last_only: bool = False,
        parents: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`, plus the hidden states that Medusa and EAGLE heads read, from the same pass.

        `layers` index transformers' `hidden_states` tuple: 0 is the token embeddings,
        i the input of decoder layer i (the output of layer i - 1), -1 the final state
        after the last norm (what the LM head reads). Returns (logits as `forward` does,
        features [n, len(layers) * hidden]: the chosen states of every new position,
        concatenated in the order of `layers`).
        """
        out = self._run(token_ids, cache, last_only, parents, hidden=True)
        states = out.hidden_states
        features = torch.cat([states[i][0] for i in layers], dim=-1) if len(layers) > 1 else states[layers[0]][0]
        return out.logits[0], features

    def check_feature_layers(self, layers: Sequence[int]) -> None:
        """Raise `PardecUsageError` unless every index in `layers` names a hidden state of this model."""
        count = int(self.config.num_hidden_layers) + 1  # the embeddings and every layer's output
        bad = [i for i in layers if not -count <= i < count]
        if not layers or bad:
            raise PardecUsageError(
                f"hidden state {bad[0] if bad else '(none)'} does not exist: the model has {count - 1} layers"
            )

    def _run(
        self, token_ids: Sequence[int], cache: Any, last_only: bool, parents: Sequence[int] | None, *, hidden: bool
    ) -> Any:
        extra: dict[str, Any] = {}
        if parents is not None:
            attention = getattr(self.config, "_attn_implementation", None) or "eager"
            if attention not in TREE_ATTENTION:
                raise PardecUsageError(
                    f"tree drafts need an attention that takes a 4-D mask; the model uses {attention!r}",
                    hint="use a method that drafts chains (pld, draft, layerskip), or load the model with sdpa attention",
                )
            mask, positions = tree_attention(parents, cache_length(cache), dtype=self.dtype, device=self.device)
            extra = {"attention_mask": mask, "position_ids": positions}
        if hidden:
            extra["output_hidden_states"] = True
        return self.model(
            input_ids=self.as_input(token_ids),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            **{self._cache_keyword: cache},
            **extra,
        )
