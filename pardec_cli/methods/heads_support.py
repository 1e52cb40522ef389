"""What the head-based methods (medusa, eagle, eagle3) share: finding their heads, and the draft vocabulary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.base import MethodEnv

_KIND_NAMES = {"medusa": "Medusa heads", "eagle": "EAGLE heads", "eagle3": "EAGLE-3 heads"}


def locate_heads(env: MethodEnv, kind: str, explicit: str) -> Path:
    """The heads directory: `explicit` (the `heads` knob / --heads) or the model's installed heads of `kind`."""
    if explicit:
        folder = Path(explicit).expanduser()
        if not folder.is_dir():
            raise PardecUsageError(f"--heads {explicit}: no such directory")
        return folder
    found = env.find_heads(kind) if env.find_heads is not None else None
    if found is None:
        train = "eagle3" if kind == "eagle3" else kind
        raise PardecUsageError(
            f"no {_KIND_NAMES[kind]} are installed for {env.model_name}",
            hint=f"train them (pardec train-heads --kind {train}), pull a catalog model that lists them, "
            "or pass a directory with --heads DIR",
        )
    return found


def heads_notes(env: MethodEnv, folder: Path) -> Mapping[str, Any]:
    """pardec's notes on the heads in `folder` (`MethodEnv.heads_notes`; empty when none)."""
    return env.heads_notes(folder) if env.heads_notes is not None else {}


def draft_vocabulary(marker: Mapping[str, Any], size: int) -> list[int] | None:
    """The target ids to draft from: `size` -1 takes the heads' own draft vocabulary (pardec-trained
    heads ship the tokens of their corpus, most frequent first), 0 the whole vocabulary, N > 0
    the N most frequent of the heads' own. Each generation adds its prompt's tokens
    (`with_prompt_tokens`)."""
    own = marker.get("draft_vocab")
    own = [int(t) for t in own] if isinstance(own, list) else None
    if size == 0 or (size < 0 and not own):
        return None
    if size < 0:
        return own
    if not own:
        raise PardecUsageError(
            "these heads ship no draft vocabulary (only heads trained by pardec do)",
            hint="use -O draft_vocab=0 (the whole vocabulary)",
        )
    return own[:size]


def with_prompt_tokens(base: list[int] | None, prompt: Sequence[int], vocab_size: int) -> list[int] | None:
    """A draft vocabulary plus the prompt's own tokens (None stays None: the whole vocabulary).

    A corpus vocabulary misses the names, numbers and code identifiers of a new prompt,
    which replies often copy; adding them costs a few rows.
    """
    if base is None:
        return None
    have = set(base)
    return base + [t for t in dict.fromkeys(int(t) for t in prompt) if t not in have and 0 <= t < vocab_size]
