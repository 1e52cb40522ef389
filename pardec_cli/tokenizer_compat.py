"""Do two tokenizers map text to the same ids? (A drafter must share the target's.)

Speculative decoding compares token ids, so a drafter with a different tokenizer does
not slow down quietly: it drafts garbage. This check names what differs.
"""

from __future__ import annotations

from typing import Any

_SAMPLE_SIZE = 512


def tokenizer_mismatch(target: Any, drafter: Any) -> str | None:
    """None when the tokenizers agree; otherwise a short description of the first difference.

    Compared: the vocabulary size (trailing padding tolerated: only the ids both have are
    compared), the special tokens (BOS, EOS, UNK, PAD), and the token strings of a
    deterministic sample of ids spread over the shared range.
    """
    target_vocab = target.get_vocab()
    drafter_vocab = drafter.get_vocab()
    shared = min(len(target_vocab), len(drafter_vocab))
    if shared == 0:
        return "one of the tokenizers has an empty vocabulary"
    # Vocabularies that differ by more than a few percent are different tokenizers, not padding.
    if abs(len(target_vocab) - len(drafter_vocab)) > 0.05 * max(len(target_vocab), len(drafter_vocab)):
        return f"vocabulary sizes differ: target {len(target_vocab)}, drafter {len(drafter_vocab)}"
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token"):
        a, b = getattr(target, attr, None), getattr(drafter, attr, None)
        if a is not None and b is not None and str(a) != str(b):
            return f"special token {attr} differs: target {a!r}, drafter {b!r}"
    step = max(1, shared // _SAMPLE_SIZE)
    sample = list(range(0, shared, step))[:_SAMPLE_SIZE]
    a_tokens = target.convert_ids_to_tokens(sample)
    b_tokens = drafter.convert_ids_to_tokens(sample)
    for token_id, a, b in zip(sample, a_tokens, b_tokens):
        if a != b:
            return f"token {token_id} differs: target {a!r}, drafter {b!r}"
    return None
