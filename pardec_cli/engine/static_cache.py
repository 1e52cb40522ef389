"""A preallocated KV cache whose rollback is a length change: what a compiled step needs.

A compiled forward wants fixed tensors: every layer's keys and values live in one
[1, H_kv, capacity, D] buffer for the whole generation, new rows are written in place at
the positions the runner sets for the step (`write_positions`), and attention reads the
whole buffer through a mask that hides everything at or beyond `length`. Dropping
rejected drafts is then `length -= n` (nothing moves), and keeping a tree path is the
same gather the dynamic cache does (`engine.cache.keep_path` works on both, through
`layers[i].keys/values`, `get_seq_length` and `crop`).

Capacity grows in powers of two (`grow`): each growth copies the filled part once.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

MIN_CAPACITY = 256


def capacity_for(tokens: int) -> int:
    """The smallest power-of-two capacity (at least MIN_CAPACITY) that holds `tokens`."""
    capacity = MIN_CAPACITY
    while capacity < tokens:
        capacity *= 2
    return capacity


def _static_address(*buffers: torch.Tensor) -> None:
    # CUDA graphs replay fixed addresses: buffers mutated inside a graph must be marked, or
    # the compiled step would skip CUDA graphs. Harmless on CPU.
    for buffer in buffers:
        torch._dynamo.mark_static_address(buffer)


class _Slots:
    """What the current forward needs from every layer: where its rows go (`positions`,
    [q] long) and how many rows attention reads (`window`: the step's mask [1, 1, q, W],
    W <= capacity; None: the whole buffer). The width is read from a tensor's shape so
    that a compiled step keeps it symbolic: one graph for every width."""

    def __init__(self, device: torch.device) -> None:
        self.positions = torch.zeros(1, dtype=torch.long, device=device)
        self.window: torch.Tensor | None = None


class StaticLayerKV(CacheLayerMixin):
    """One layer's [1, H_kv, capacity, D] keys and values, written at `slots.positions`."""

    is_compileable = True
    is_croppable = True
    is_sliding = False

    def __init__(self, slots: _Slots, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.slots = slots
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values = keys, values
        _static_address(self.keys, self.values)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Never needed: the buffers are allocated up front (their shapes come from the config)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: [1, H_kv, q, D] -> rows slots.positions of the buffers; attention
        # reads the first W rows (the window), the mask hiding the unfilled ones: it does
        # not pay for the empty tail of a cache sized for a long generation.
        # A cache kept in another dtype than the model's (float16 for q4q8 layers: the runner's
        # `kv_dtype`) rounds the rows as they are written, as the native step does.
        positions = self.slots.positions
        self.keys.index_copy_(2, positions, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, positions, value_states.to(self.values.dtype))
        window = self.slots.window
        if window is None:
            return self.keys, self.values
        width = window.shape[-1]
        return self.keys[:, :, :width], self.values[:, :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2], 0

    def get_seq_length(self) -> int:  # the owning cache knows the length; layers only hold rows
        raise NotImplementedError("ask the StaticKVCache, not one of its layers")

    def get_max_length(self) -> int:
        return self.keys.shape[-2]


def cache_shape(config: Any, capacity: int) -> tuple[tuple[int, int, int, int], int]:
    """([1, H_kv, capacity, D], number of layers) of a static cache for `config`."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return (1, kv_heads, capacity, head_dim), int(text.num_hidden_layers)


class StaticKVCache(Cache):
    """The KV cache of a `runner.CompiledLanguageModel`: preallocated, rolled back by length.

    `buffers` (one (keys, values) pair per layer, each [1, H_kv, capacity, D]) reuses the
    buffers of a finished generation: the rows past `length` are hidden by the mask, so
    what they hold does not matter, and a CUDA graph recorded over them replays as is.
    """

    def __init__(
        self, config: Any, capacity: int, *, dtype: torch.dtype, device: torch.device,
        buffers: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        self.shape, count = cache_shape(config, capacity)
        self.slots = _Slots(device)
        if buffers is None:
            buffers = [(torch.zeros(self.shape, dtype=dtype, device=device), torch.zeros(self.shape, dtype=dtype, device=device)) for _ in range(count)]
        if len(buffers) != count or any(k.shape != self.shape or v.shape != self.shape for k, v in buffers):
            raise ValueError(f"buffers for a static cache must be {count} pairs of {list(self.shape)}")
        super().__init__(layers=[StaticLayerKV(self.slots, keys, values) for keys, values in buffers])
        self.length = 0

    def buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (keys, values) buffers, to hand to a later cache of this capacity."""
        return [(layer.keys, layer.values) for layer in self.layers]

    @property
    def capacity(self) -> int:
        return self.shape[2]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.capacity, 0

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last `-tokens_to_remove` positions (transformers' 5.x convention: a
        negative count); the rows stay in place, hidden by the mask, until overwritten."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to drop, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    @property
    def is_croppable(self) -> bool:
        return True

    @property
    def is_compileable(self) -> bool:
        return True

    def grow(self, capacity: int) -> None:
        """Reallocate every layer's buffers at `capacity` rows, keeping the filled ones."""
        if capacity <= self.capacity:
            return
        self.shape = (*self.shape[:2], capacity, self.shape[3])
        for layer in self.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = torch.zeros(self.shape, dtype=old.dtype, device=old.device)
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(layer, name, new)
            _static_address(layer.keys, layer.values)
