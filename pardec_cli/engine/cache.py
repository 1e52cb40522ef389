"""KV cache handling: creation, length, rollback and tree compaction.

Speculative methods append k drafted tokens to the cache during verification and must
drop the rejected ones afterwards. Hugging Face's DynamicCache supports that with
`crop`, whose meaning changed across versions (absolute length before 5.x, number of
tokens to remove now), so all rollbacks go through `rollback_to` here. A tree step keeps
a path whose nodes need not be contiguous: `keep_path` moves their keys and values into
place (a gather over the few kept positions, per layer) before cropping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pardec_cli.errors import CacheRollbackError


def cache_keyword(model: Any) -> str:
    """The keyword `model`'s forward takes its KV cache by: ``cache`` from transformers 5.24
    (where ``past_key_values`` warns that it is deprecated), ``past_key_values`` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_cache(config: Any) -> Any:
    """A fresh dynamic KV cache laid out for `config`'s layers."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


def cache_length(cache: Any) -> int:
    """Number of token positions currently held in the cache."""
    return int(cache.get_seq_length())


def check_rollback_supported(cache: Any) -> None:
    """Fail loudly, before the first decoding step, if rejected drafts could not be undone.

    Sliding-window and recurrent layers cannot be cropped back exactly; running a
    speculative method on them would silently corrupt the output.
    """
    name = type(cache).__name__
    if not hasattr(cache, "crop"):
        raise CacheRollbackError(f"the model's KV cache ({name}) cannot be rolled back", cache_type=name)
    if getattr(cache, "is_croppable", True) is False:
        raise CacheRollbackError(
            f"the model's KV cache ({name}) has layers that cannot be rolled back exactly (sliding-window or recurrent)",
            cache_type=name,
        )


def rollback_to(cache: Any, length: int) -> None:
    """Drop every cached position at index >= `length`."""
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)
    elif extra < 0:
        raise ValueError(f"cannot roll the cache forward: holds {length + extra}, asked {length}")


def keep_path(cache: Any, start: int, path: Sequence[int]) -> None:
    """Keep positions [0, start) and then start + path[0], start + path[1], ...; drop the rest.

    `start` is where the draft's nodes begin in the cache, `path` the kept nodes (strictly
    increasing, as a root-to-node path of a topologically ordered tree is). A path that is
    a prefix (0, 1, ..., a-1), as every chain's is, is a plain rollback.
    """
    kept = len(path)
    if any(node != i for i, node in enumerate(path)):
        import torch

        layers = getattr(cache, "layers", None)
        if layers is None:
            raise CacheRollbackError(
                f"the model's KV cache ({type(cache).__name__}) cannot keep a tree path",
                cache_type=type(cache).__name__,
                hint="use a method that drafts chains (pld, draft, layerskip) with this model",
            )
        device = None
        for layer in layers:
            keys: Any = getattr(layer, "keys", None)
            values: Any = getattr(layer, "values", None)
            if keys is None or keys.dim() != 4 or keys.shape[-2] == 0:
                continue  # a layer that holds nothing (skipped, or shared with another)
            if device != keys.device:
                device = keys.device
                index = torch.tensor([start + node for node in path], dtype=torch.long, device=device)
            # [B, H, S, D]: gather the kept rows first, then write them in place (O(path), not O(cache)).
            keys[:, :, start : start + kept] = keys.index_select(-2, index)
            values[:, :, start : start + kept] = values.index_select(-2, index)
    rollback_to(cache, start + kept)
