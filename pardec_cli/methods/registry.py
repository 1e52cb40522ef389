"""All decoding methods by name, with their knobs.

The table is torch-free (front ends list it for `--help`, `pardec methods` and shell
completion); a method's implementation module is imported only when it is created.

Draft-free methods combine with `+` (`suffix+recycling`): one tree holds every part's
candidates. Knobs of a combination are `PART.KNOB=VALUE`, or a plain `KNOB=VALUE` for
every part that has it.
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
    # The catalog accelerator kind this method cannot run without ("drafter", "medusa",
    # "eagle", "eagle3"), or None for methods that need no extra weights. `auto`
    # selection reads this to know which methods the installed accelerators enable.
    accelerator: str | None = None
    # The knob that names which installed accelerator to use (draft: "model"), so that
    # `auto` can choose among several; None when the method finds its own.
    accelerator_option: str | None = None
    combinable: bool = False  # drafts deterministically without a second model: may join a `+` combination
    # The knob that sets how many tokens a step verifies (nodes, draft length): adaptive
    # decoding runs auto's choice at a few values of it (`methods.adaptive.sized_knobs`).
    size_option: str | None = None
    # Drafts only what it rates likely (suffix: branches of at least min_prob) and nothing
    # otherwise, so its steps without a likely continuation are plain decoding's already:
    # auto's adaptive runs it at its sizes without a plain-decoding arm, which on
    # retrieval text missed the short copy bursts (docs/adaptive.md).
    sure_or_plain: bool = False
    # A bool knob that, when on, makes the method size each draft itself from the reply's
    # measured step times, down to none where drafting does not pay (pld's fit): auto runs
    # such a choice alone, since adaptive's arms and probes only cost it (docs/auto.md).
    self_sizing: str | None = None


_ADAPTIVE_DRAFT = (
    MethodOption("k", int, 4, "initial draft length", search=(2, 3, 4, 6, 8)),
    MethodOption("min_k", int, 1, "shortest draft when acceptance is low"),
    MethodOption("max_k", int, 12, "longest draft when acceptance is high", search=(4, 6, 8, 12, 16)),
    MethodOption("adaptive", bool, True, "grow the draft by 2 after a full accept, shrink by 1 after a rejection"),
)

_HEADS = MethodOption("heads", str, "", "heads directory (default: the heads installed for the model; also --heads DIR)")
_DRAFT_VOCAB = MethodOption(
    "draft_vocab", int, -1,
    "draft from the N most frequent tokens of the heads' corpus, plus the prompt's (-1: all the heads ship, 0: the whole vocabulary)",
)
_EAGLE_OPTIONS = (
    _HEADS,
    MethodOption("topk", int, 6, "children per expanded node, and nodes expanded per level"),
    MethodOption("depth", int, 5, "deepest level of the draft tree"),
    MethodOption("nodes", int, 24, "tree size after reranking by draft confidence (candidates verified per step)"),
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
                MethodOption("num_draft", int, 10, "tokens to copy after a match", search=(3, 4, 6, 8, 10, 12, 16, 24)),
                MethodOption("prefer", str, "first", "which earlier occurrence to copy from: first or recent"),
                MethodOption("branches", int, 1, "earlier matches to draft from, as a tree (1: a chain)", search=(1, 2, 4)),
                MethodOption("fit", bool, False, "per step, copy only as many tokens (up to num_draft) as pay for their "
                             "verification here, judged by the match's length and how this reply's copies held"),
            ),
            combinable=True,
            size_option="num_draft",
            self_sizing="fit",
        ),
        MethodSpec(
            "draft",
            "speculative decoding with a small draft model sharing the tokenizer (--draft-model)",
            "pardec_cli.methods.draft_model:DraftModel",
            (MethodOption("model", str, None, "the draft model (alias, Hub id or directory)"), *_ADAPTIVE_DRAFT),
            accelerator="drafter",
            accelerator_option="model",
            size_option="max_k",
        ),
        MethodSpec(
            "layerskip",
            "self-speculation: draft with some of the target's layers, verify with all of them",
            "pardec_cli.methods.layerskip:LayerSkip",
            (
                MethodOption("layers", int, 0, "draft with the first N layers (0: the first and last third, skipping the middle)"),
                MethodOption("layer_list", str, "", "explicit draft layers, e.g. '0-5,8,11' (must include 0)"),
                *_ADAPTIVE_DRAFT,
            ),
            size_option="max_k",
        ),
        MethodSpec(
            "jacobi",
            "Jacobi iteration: a window of guesses refined by every forward; its fixed-point prefix is kept",
            "pardec_cli.methods.jacobi:Jacobi",
            (MethodOption("window", int, 8, "guessed tokens verified per step", search=(2, 3, 4, 6, 8, 12)),),
            combinable=True,
            size_option="window",
        ),
        MethodSpec(
            "lookahead",
            "lookahead decoding: a 2-D Jacobi window harvests n-grams; matching ones are verified in the same pass",
            "pardec_cli.methods.lookahead:Lookahead",
            (
                MethodOption("window", int, 6, "W: Jacobi window width (columns)", search=(2, 3, 4, 6, 8, 10, 15)),
                MethodOption("ngram", int, 4, "N: n-gram size (the window keeps N-1 levels)", search=(2, 3, 4, 5, 6)),
                MethodOption("guesses", int, 6, "G: most n-grams verified per step", search=(1, 2, 3, 4, 6, 8, 10, 15)),
                MethodOption("prompt_pool", bool, True, "also pool the n-grams of the prompt and the output"),
            ),
            combinable=True,
            size_option="guesses",
        ),
        MethodSpec(
            "recycling",
            "token recycling: a tree read from a table of the target's recent top-k next tokens per token",
            "pardec_cli.methods.recycling:TokenRecycling",
            (
                MethodOption("topk", int, 8, "next-token candidates kept per token (widest branching)"),
                MethodOption("nodes", int, 32, "tree size (candidates verified per step)", search=(4, 6, 8, 12, 16, 24, 32, 48, 64, 96)),
                MethodOption("depth", int, 6, "longest path in the tree", search=(3, 4, 5, 6, 8, 10)),
            ),
            combinable=True,
            size_option="nodes",
        ),
        MethodSpec(
            "suffix",
            "suffix drafting: most frequent continuations of the longest match in prompt, output and earlier outputs",
            "pardec_cli.methods.suffix:SuffixDrafting",
            (
                MethodOption("depth", int, 24, "longest substring the suffix tries index"),
                MethodOption("max_match", int, 12, "longest context suffix to match (at most depth - 1)"),
                MethodOption("min_match", int, 1, "shortest context suffix a draft may follow (1: any match)"),
                MethodOption("factor", float, 4.0, "tree nodes per matched token"),
                MethodOption("max_nodes", int, 32, "largest tree", search=(4, 6, 8, 12, 16, 24, 32, 48, 64, 96)),
                MethodOption("min_prob", float, 0.1, "least estimated probability of a drafted branch"),
                MethodOption("history_tokens", int, 16384, "tokens of this method's earlier outputs to match too (0: none)"),
                MethodOption("min_gain", float, 0.5, "stop drafting after matches of a length whose recent drafts kept fewer tokens than this (0: off)"),
            ),
            combinable=True,
            size_option="max_nodes",
            sure_or_plain=True,
        ),
        MethodSpec(
            "medusa",
            "Medusa heads: extra heads on the target's last hidden state guess the next tokens; their top-k form a tree",
            "pardec_cli.methods.medusa:Medusa",
            (
                _HEADS,
                MethodOption("tree", str, "sparse", "sparse: Medusa's published 63-node tree, cut to `nodes`; prior: best-first from a rank prior"),
                MethodOption("nodes", int, 24, "tree size (candidates verified per step)"),
                MethodOption("width", int, 10, "most candidates per head (the highest rank in the tree + 1)"),
                MethodOption("depth", int, 0, "deepest level (0: one per head)"),
                _DRAFT_VOCAB,
            ),
            accelerator="medusa",
            size_option="nodes",
        ),
        MethodSpec(
            "eagle",
            "EAGLE-2 dynamic trees from an EAGLE-1/2 head: a one-layer drafter over the target's hidden states",
            "pardec_cli.methods.eagle:Eagle",
            (*_EAGLE_OPTIONS, _DRAFT_VOCAB),
            accelerator="eagle",
            size_option="nodes",
        ),
        MethodSpec(
            "eagle3",
            "EAGLE-2 dynamic trees from an EAGLE-3 head (features of three target layers, its own draft vocabulary)",
            "pardec_cli.methods.eagle:Eagle3",
            _EAGLE_OPTIONS,
            accelerator="eagle3",
            size_option="nodes",
        ),
        MethodSpec(
            "adaptive",
            "switch while decoding among a few configurations (arms) by their measured tokens per second",
            "pardec_cli.methods.adaptive:Adaptive",
            (
                MethodOption("arms", str, "", "the configurations, 'METHOD[KNOB=VALUE,...] | ...' (auto: its choice "
                             "at two or three sizes | vanilla)"),
                MethodOption("dwell", int, 8, "steps the fastest arm runs between decisions"),
                MethodOption("probe", int, 3, "steps another arm runs to be measured"),
                MethodOption("reprobe", int, 40, "steps after which an idle arm is measured again (4x for arms scored by dry runs)"),
                MethodOption("margin", float, 0.05, "how much faster (a share) an arm must measure to take over"),
            ),
        ),
    )
}

# `--method auto`'s own knobs (-O adapt=off): what it does with its choice.
AUTO_OPTIONS = (
    MethodOption("adapt", bool, True, "check the choice while decoding: switch between it at a few sizes and plain "
                 "decoding by measured tokens/s (method adaptive); off: keep the choice for the whole reply"),
)


def method_names() -> list[str]:
    """Registered method names, in a stable order."""
    return list(METHODS)


def sizes_itself(name: str, knobs: Mapping[str, Any]) -> bool:
    """Whether `name` with `knobs` sizes each draft itself (its `MethodSpec.self_sizing`
    knob on: pld's fit); never a `+` combination or a name this pardec does not know."""
    spec = METHODS.get(name)
    return bool(spec and spec.self_sizing and resolve_options(name, spec.options, dict(knobs))[spec.self_sizing])


def get_spec(name: str) -> MethodSpec:
    """The spec for `name` (a `+` combination gets one with PART.KNOB options), or a usage error."""
    if "+" in name:
        parts = [_get_single(part) for part in name.split("+")]
        for part in parts:
            if not part.combinable:
                combinable = ", ".join(s.name for s in METHODS.values() if s.combinable)
                raise PardecUsageError(f"method {part.name!r} cannot be combined with '+' (combinable: {combinable})")
        if len({part.name for part in parts}) != len(parts):
            raise PardecUsageError(f"method {name!r} names a part twice")
        options = tuple(
            MethodOption(f"{part.name}.{o.name}", o.kind, o.default, o.help, o.search) for part in parts for o in part.options
        )
        return MethodSpec(name, "combination: " + " + ".join(p.name for p in parts), "pardec_cli.methods.combine:Combined", options)
    return _get_single(name)


def _get_single(name: str) -> MethodSpec:
    spec = METHODS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, METHODS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PardecUsageError(f"unknown method {name!r}{hint}; choose from: {', '.join(METHODS)}")
    return spec


def create(name: str, options: Mapping[str, Any], env: MethodEnv) -> Proposer:
    """Instantiate method `name` with `options` (validated against its declared knobs)."""
    spec = get_spec(name)
    if "+" in name:
        return _create_combined(spec, options, env)
    values = resolve_options(name, spec.options, options)
    return _implementation(spec)(env, **values)


def _implementation(spec: MethodSpec) -> Any:
    module_name, class_name = spec.implementation.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def check_knobs(name: str, options: Mapping[str, Any]) -> None:
    """Raise PardecUsageError where `options` are no setting of method `name` (each knob's
    type, and what the method's class checks without building itself: its `check_knobs`,
    where it has one, for knobs that exclude each other), so a tuner can skip such a setting."""
    spec = get_spec(name)
    values = resolve_options(name, spec.options, options)
    check = getattr(_implementation(spec), "check_knobs", None)
    if check is not None:
        check(**values)


def dry_runs(name: str) -> bool:
    """Whether method `name` (a `+` combination: every part) can be dry-run while idle
    in adaptive decoding (`Proposer.dry_runs`), so that an extra arm of it costs little."""
    return all(_implementation(get_spec(part)).dry_runs for part in name.split("+"))


def _create_combined(spec: MethodSpec, options: Mapping[str, Any], env: MethodEnv) -> Proposer:
    """Each part gets its PART.KNOB options, and every plain KNOB that it declares."""
    from pardec_cli.methods.combine import Combined

    names = spec.name.split("+")
    per_part: dict[str, dict[str, Any]] = {part: {} for part in names}
    for key, value in options.items():
        part, dot, knob = key.partition(".")
        if dot:
            if part not in per_part:
                raise PardecUsageError(f"option {key!r} names no part of {spec.name!r}")
            per_part[part][knob] = value
            continue
        takers = [p for p in names if any(o.name == key for o in METHODS[p].options)]
        if not takers:
            valid = ", ".join(o.name for o in spec.options) or "none"
            raise PardecUsageError(f"method {spec.name!r} has no option {key!r} (its options: {valid})")
        for p in takers:
            per_part[p].setdefault(key, value)
    return Combined(spec.name, [create(part, per_part[part], env) for part in names])
