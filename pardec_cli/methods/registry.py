"""All decoding methods by name, with their knobs.

The table is torch-free (front ends list it for `--help`, `pardec methods` and shell
completion); a method's implementation module is imported only when it is created.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pardec_cli.errors import PardecUsageError
from pardec_cli.methods.options import MethodOption, resolve_options

if TYPE_CHECKING:
    from pardec_cli.engine.proposal import Proposer
    from pardec_cli.methods.base import MethodEnv


@dataclass(frozen=True)
class MethodSpec:
    """A method's name, one-line summary, knobs, and where its proposer class lives."""

    name: str
    summary: str
    implementation: str  # "module:Class"
    options: tuple[MethodOption, ...] = ()
    needs_drafter: bool = False


_ADAPTIVE_DRAFT = (
    MethodOption("k", int, 4, "initial draft length"),
    MethodOption("min_k", int, 1, "shortest draft when acceptance is low"),
    MethodOption("max_k", int, 12, "longest draft when acceptance is high"),
    MethodOption("adaptive", bool, True, "grow the draft by 2 after a full accept, shrink by 1 after a rejection"),
)

METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec(
            "vanilla",
            "plain autoregressive decoding: one token per forward (the reference)",
            "pardec_cli.methods.vanilla:Vanilla",
        ),
        MethodSpec(
            "pld",
            "prompt lookup: copy the continuation of the last n-gram's earlier occurrence",
            "pardec_cli.methods.pld:PromptLookup",
            (
                MethodOption("max_ngram", int, 3, "longest n-gram to match"),
                MethodOption("min_ngram", int, 1, "shortest n-gram to match"),
                MethodOption("num_draft", int, 10, "tokens to copy after a match"),
                MethodOption("prefer", str, "first", "which earlier occurrence to copy from: first or recent"),
            ),
        ),
        MethodSpec(
            "draft",
            "speculative decoding with a small draft model sharing the tokenizer (--draft-model)",
            "pardec_cli.methods.draft_model:DraftModel",
            (MethodOption("model", str, None, "the draft model (alias, Hub id or directory)"), *_ADAPTIVE_DRAFT),
            needs_drafter=True,
        ),
        MethodSpec(
            "layerskip",
            "self-speculation: draft with the target's first layers, verify with all of them",
            "pardec_cli.methods.layerskip:LayerSkip",
            (
                MethodOption("layers", int, 0, "draft with the first N layers (0: a quarter of the model)"),
                MethodOption("layer_list", str, "", "explicit draft layers, e.g. '0-5,8,11' (must include 0)"),
                *_ADAPTIVE_DRAFT,
            ),
        ),
    )
}


def method_names() -> list[str]:
    """Registered method names, in a stable order."""
    return list(METHODS)


def get_spec(name: str) -> MethodSpec:
    """The spec for `name`, or a usage error that suggests a close name."""
    spec = METHODS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, METHODS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PardecUsageError(f"unknown method {name!r}{hint}; choose from: {', '.join(METHODS)}")
    return spec


def create(name: str, options: Mapping[str, Any], env: MethodEnv) -> Proposer:
    """Instantiate method `name` with `options` (validated against its declared knobs)."""
    spec = get_spec(name)
    values = resolve_options(name, spec.options, options)
    module_name, class_name = spec.implementation.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(env, **values)
