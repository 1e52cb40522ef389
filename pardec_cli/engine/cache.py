"""KV cache handling: creation, length and rollback.

Speculative methods append k drafted tokens to the cache during verification and must
drop the rejected ones afterwards. Hugging Face's DynamicCache supports that with
`crop`, whose meaning changed across versions (absolute length before 5.x, number of
tokens to remove now), so all rollbacks go through `rollback_to` here.
"""

from __future__ import annotations

from typing import Any

from pardec_cli.errors import CacheRollbackError


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
    if not hasattr(cache, "crop"):
        raise CacheRollbackError(
            f"the model's KV cache ({type(cache).__name__}) cannot be rolled back",
            hint="use --method vanilla with this model",
        )
    if getattr(cache, "is_croppable", True) is False:
        raise CacheRollbackError(
            f"the model's KV cache ({type(cache).__name__}) has layers that cannot be rolled back "
            "exactly (sliding-window or recurrent)",
            hint="use --method vanilla with this model",
        )


def rollback_to(cache: Any, length: int) -> None:
    """Drop every cached position at index >= `length`."""
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)
    elif extra < 0:
        raise ValueError(f"cannot roll the cache forward: holds {length + extra}, asked {length}")
