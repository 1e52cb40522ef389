"""Do two tokenizers map text to the same ids? (A drafter must share the target's.)

Speculative decoding compares token ids, so a drafter with a different tokenizer does
not slow down quietly: it drafts garbage. This check names what differs. It runs when
a drafter is pulled (`pardec pull`) and when one is passed (`--draft-model`).
"""

from __future__ import annotations

from typing import Any

_SAMPLE_SIZE = 512
_EDGE = 64  # ids checked one by one at each end of the shared range
# Vocabularies whose sizes differ by more than this share are different tokenizers, not
# one tokenizer with a few extra (padding or reserved) tokens at the end.
_SIZE_TOLERANCE = 0.05
_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")


def sample_ids(shared: int, size: int = _SAMPLE_SIZE) -> list[int]:
    """A deterministic sample of ids in ``range(shared)``: both ends, and spread between."""
    if shared <= size:
        return list(range(shared))
    edge = min(_EDGE, size // 4)
    middle = size - 2 * edge
    step = (shared - 2 * edge) / middle
    spread = {edge + int(i * step) for i in range(middle)}
    return sorted({*range(edge), *spread, *range(shared - edge, shared)})


def _special_added_ids(tokenizer: Any) -> set[int]:
    """Ids of added tokens marked special (reserved and control tokens)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i) for i, tok in decoder.items() if getattr(tok, "special", False)}


def tokenizer_mismatch(target: Any, drafter: Any) -> str | None:
    """None when the tokenizers agree; otherwise a short description of the first difference.

    Compared:

    - the vocabulary size, tolerating a few extra tokens at the end of one of them
      (padding, reserved tokens): only the ids both have are compared after that;
    - the named special tokens (BOS, EOS, UNK, PAD) of each: each must have the same id
      in the other tokenizer (which token each *designates* may differ: the target
      decides when a reply ends);
    - the token strings of a deterministic sample of ids over the shared range. Two
      tokens that differ only as renamed reserved special tokens (both special, neither
      a named one) are tolerated: text never produces them.
    """
    target_vocab = target.get_vocab()
    drafter_vocab = drafter.get_vocab()
    shared = min(len(target_vocab), len(drafter_vocab))
    if shared == 0:
        return "one of the tokenizers has an empty vocabulary"
    if abs(len(target_vocab) - len(drafter_vocab)) > _SIZE_TOLERANCE * max(len(target_vocab), len(drafter_vocab)):
        return f"vocabulary sizes differ: target {len(target_vocab)}, drafter {len(drafter_vocab)}"

    named: set[str] = set()
    for owner, tokenizer in (("target", target), ("drafter", drafter)):
        for attr in _NAMED_SPECIALS:
            token = getattr(tokenizer, attr, None)
            if token is None:
                continue
            token = str(token)
            named.add(token)
            a, b = target_vocab.get(token), drafter_vocab.get(token)
            if a is None and b is None:
                continue
            if a is None or b is None:
                present = a if b is None else b
                if present is not None and present < shared:  # not just an extra token at the end
                    missing = "drafter" if b is None else "target"
                    return f"special token {token!r} (the {owner}'s {attr}) is missing from the {missing}"
            elif a != b:
                return f"special token {token!r} has id {a} in the target, {b} in the drafter"

    reserved = _special_added_ids(target) & _special_added_ids(drafter)
    sample = sample_ids(shared)
    a_tokens = target.convert_ids_to_tokens(sample)
    b_tokens = drafter.convert_ids_to_tokens(sample)
    for token_id, a, b in zip(sample, a_tokens, b_tokens):
        if a == b:
            continue
        if token_id in reserved and a not in named and b not in named:
            continue  # a renamed reserved token (e.g. Llama 3 -> 3.1)
        return f"token {token_id} differs: target {a!r}, drafter {b!r}"
    return None
