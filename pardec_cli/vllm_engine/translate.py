"""pardec's method and knobs -> vLLM's `speculative_config`, from one table.

Field names are vLLM's `SpeculativeConfig` (vllm/config/speculative.py, read from
vLLM 0.32): `method` in ngram / suffix / draft_model / medusa / eagle / eagle3 / mtp,
`num_speculative_tokens`, `model` (the drafter or the heads directory),
`prompt_lookup_max` / `prompt_lookup_min` (ngram), `suffix_decoding_max_tree_depth`,
`suffix_decoding_max_spec_factor`, `suffix_decoding_min_token_prob`,
`suffix_decoding_max_cached_requests` (suffix).

Every pardec method has a row: either a `VllmMethod` (which vLLM method runs it and
where each knob goes) or `NotOnVllm` (why not, and the closest method vLLM has). Every
knob of a runnable method is either carried over (`Carry`) or has no counterpart in
vLLM (`NoCounterpart`): then the values at which vLLM behaves the same are listed; any
other value is an error when the user set it (`-O`), and a note when it came from a
default or from `auto`, so the user always learns what vLLM will not do.

Pure: imports neither vLLM nor torch (unit-tested without vLLM installed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from pardec_cli.errors import PardecUsageError

OMIT = object()  # a converter's answer: leave vLLM's own default in place


@dataclass(frozen=True)
class Carry:
    """Knob `knob` becomes vLLM field `field` (through `convert`, which may answer OMIT)."""

    knob: str
    field: str
    convert: Callable[[Any], Any] | None = None
    note: str = ""  # how the meaning shifts on the way, when it does


@dataclass(frozen=True)
class NoCounterpart:
    """Knob `knob` has no vLLM field; vLLM behaves as pardec does when it is one of `same_as`."""

    knob: str
    vllm_does: str  # what vLLM does instead, for the error or the note
    same_as: tuple[Any, ...] = ()
    # False: not worth a note unless the user set it (another knob's note says it all).
    noted: bool = True


Knob = Carry | NoCounterpart


@dataclass(frozen=True)
class VllmMethod:
    """A pardec method that vLLM runs: as vLLM's `method` (None: no speculation at all)."""

    method: str | None
    knobs: tuple[Knob, ...] = ()
    # The pardec knob naming the accelerator whose local directory becomes `model`
    # ("model" for draft, "heads" for Medusa/EAGLE); None for draft-free methods.
    accelerator_knob: str | None = None
    summary: str = ""
    # A package vLLM needs for this method beyond itself: (import name, pip requirement).
    requires: tuple[str, str] | None = None


@dataclass(frozen=True)
class NotOnVllm:
    """A pardec method vLLM lacks: why, and the closest one it has (a pardec method name
    that runs on vLLM, and vLLM's name for it)."""

    why: str
    closest: str
    closest_vllm: str


Row = VllmMethod | NotOnVllm


def _history_to_cached_requests(history_tokens: int) -> Any:
    # vLLM caches earlier responses by request count, not by tokens: 0 (no history)
    # maps exactly; any other budget leaves vLLM's default cache (10000 requests).
    return 0 if int(history_tokens) == 0 else OMIT


def _depth_or_heads(depth: int) -> Any:
    # pardec's medusa depth 0 means "one level per head": vLLM's default too (it reads
    # the head count from the heads' config).
    return int(depth) if int(depth) > 0 else OMIT


_CHAIN = "vLLM drafts one chain per step (top-1 of each position), not a tree"

# The table. Keep one row per registered pardec method (tests/test_vllm_translate.py
# checks that every registry entry and every knob has a row).
TABLE: dict[str, Row] = {
    "vanilla": VllmMethod(None, summary="plain decoding (no speculative_config)"),
    "pld": VllmMethod(
        "ngram",
        (
            Carry("num_draft", "num_speculative_tokens"),
            Carry("max_ngram", "prompt_lookup_max"),
            Carry("min_ngram", "prompt_lookup_min"),
            NoCounterpart("prefer", "copies after the earliest occurrence of the longest match", ("first",)),
            NoCounterpart("branches", "drafts one chain from one match", (1,)),
            NoCounterpart("fit", "drafts num_speculative_tokens after every match, whatever it costs", (False,)),
        ),
        summary="ngram (prompt lookup)",
    ),
    "suffix": VllmMethod(
        "suffix",
        (
            Carry("depth", "suffix_decoding_max_tree_depth"),
            Carry("factor", "suffix_decoding_max_spec_factor"),
            Carry("min_prob", "suffix_decoding_min_token_prob"),
            Carry("max_nodes", "num_speculative_tokens",
                  note="vLLM verifies one path of at most this many tokens, pardec a tree of this many nodes"),
            Carry("history_tokens", "suffix_decoding_max_cached_requests", _history_to_cached_requests,
                  note="vLLM keeps earlier outputs by request (10000 by default), not by tokens"),
            NoCounterpart("max_match", "matches the longest suffix of the last `depth` tokens"),
            NoCounterpart("min_match", "drafts after a match of any length", (1,)),
            NoCounterpart("min_gain", "drafts after every match, whatever earlier drafts kept", (0.0,)),
        ),
        summary="suffix (Arctic Inference's suffix decoding)",
        requires=("arctic_inference", "arctic-inference"),
    ),
    "draft": VllmMethod(
        "draft_model",
        (
            Carry("k", "num_speculative_tokens"),
            NoCounterpart("adaptive", "drafts a fixed k tokens every step", (False,)),
            NoCounterpart("min_k", "drafts a fixed k tokens every step", noted=False),
            NoCounterpart("max_k", "drafts a fixed k tokens every step", noted=False),
        ),
        accelerator_knob="model",
        summary="draft_model (the drafter's local directory as `model`)",
    ),
    "medusa": VllmMethod(
        "medusa",
        (
            Carry("depth", "num_speculative_tokens", _depth_or_heads),
            NoCounterpart("tree", _CHAIN),
            NoCounterpart("nodes", _CHAIN),
            NoCounterpart("width", _CHAIN),
            NoCounterpart("draft_vocab", "uses the vocabulary the heads ship", (-1,)),
        ),
        accelerator_knob="heads",
        summary="medusa (the heads directory as `model`)",
    ),
    "eagle": VllmMethod(
        "eagle",
        (
            Carry("depth", "num_speculative_tokens"),
            NoCounterpart("topk", _CHAIN),
            NoCounterpart("nodes", _CHAIN),
            NoCounterpart("draft_vocab", "uses the vocabulary the head ships", (-1,)),
        ),
        accelerator_knob="heads",
        summary="eagle (the EAGLE-1/2 head directory as `model`)",
    ),
    "eagle3": VllmMethod(
        "eagle3",
        (
            Carry("depth", "num_speculative_tokens"),
            NoCounterpart("topk", _CHAIN),
            NoCounterpart("nodes", _CHAIN),
        ),
        accelerator_knob="heads",
        summary="eagle3 (the EAGLE-3 head directory as `model`)",
    ),
    "layerskip": NotOnVllm(
        "vLLM cannot draft with a subset of the target's own layers; its self-drafting (mtp) needs layers "
        "trained for it",
        "draft", "draft_model",
    ),
    "jacobi": NotOnVllm("vLLM has no Jacobi iteration", "pld", "ngram"),
    "lookahead": NotOnVllm(
        "vLLM has no lookahead decoding (a Jacobi window harvesting n-grams)", "pld", "ngram",
    ),
    "recycling": NotOnVllm(
        "vLLM has no token recycling (a tree from the target's earlier top-k tokens)", "suffix", "suffix",
    ),
    "adaptive": NotOnVllm("vLLM keeps one speculative_config per engine; it cannot switch while decoding", "pld", "ngram"),
}


@dataclass(frozen=True)
class Translation:
    """What vLLM gets for one pardec choice, and what it will do differently."""

    method: str  # pardec's
    speculative_config: dict[str, Any] | None  # None: plain decoding
    notes: tuple[str, ...] = field(default=())


def row(method: str) -> Row:
    """The table row of pardec method `method` (a `+` combination is never on vLLM)."""
    if "+" in method:
        parts = method.split("+")
        runnable = [p for p in parts if isinstance(TABLE.get(p), VllmMethod)]
        closest = runnable[0] if runnable else "pld"
        return NotOnVllm("vLLM runs one drafting method at a time, not a '+' combination",
                         closest, _vllm_name(closest))
    found = TABLE.get(method)
    if found is None:
        from pardec_cli.methods.registry import get_spec

        get_spec(method)  # an unknown name: the registry's error, with its close-match hint
        raise PardecUsageError(f"method {method!r} has no row in pardec's vLLM table")  # a registry/table mismatch
    return found


def _vllm_name(method: str) -> str:
    found = TABLE[method]
    assert isinstance(found, VllmMethod)
    return found.method or "none"


def runs_on_vllm(method: str) -> bool:
    """Whether vLLM can run pardec's `method`."""
    return "+" not in method and isinstance(TABLE.get(method), VllmMethod)


def vllm_methods() -> dict[str, str]:
    """pardec method -> vLLM's name for it, for every method vLLM runs ("none": plain decoding)."""
    return {name: r.method or "none" for name, r in TABLE.items() if isinstance(r, VllmMethod)}


def missing_requirement(method: str) -> str | None:
    """The pip requirement vLLM needs for `method` and that is not installed, or None."""
    import importlib.util

    r = TABLE.get(method)
    if not isinstance(r, VllmMethod) or r.requires is None:
        return None
    module, requirement = r.requires
    return requirement if importlib.util.find_spec(module) is None else None


def unsupported_error(method: str) -> PardecUsageError:
    """The one-line error for a method vLLM lacks, naming the closest one it has."""
    r = row(method)
    assert isinstance(r, NotOnVllm)
    return PardecUsageError(
        f"vLLM cannot run --method {method}: {r.why}; the closest it runs is {r.closest_vllm} "
        f"(--method {r.closest})",
        hint=f"use --method {r.closest} with --engine vllm (gen or serve), or drop --engine vllm to run {method} on "
        "pardec's engine",
    )


def translate(
    method: str,
    knobs: Mapping[str, Any],
    *,
    accelerator_path: str | None = None,
    user_set: Collection[str] = (),
) -> Translation:
    """vLLM's `speculative_config` for pardec's `method` with its full `knobs` (defaults
    filled in, as `resolve_options` gives them).

    `accelerator_path` is the local directory of the drafter or heads (required by the
    methods that need one); `user_set` the knobs the user gave with `-O`: a knob vLLM
    cannot honour is an error for those, a note for the rest.
    """
    r = row(method)
    if isinstance(r, NotOnVllm):
        raise unsupported_error(method)
    if r.method is None:
        return Translation(method, None)
    config: dict[str, Any] = {"method": r.method}
    notes: list[str] = []
    if r.accelerator_knob is not None:
        if not accelerator_path:
            raise PardecUsageError(f"--method {method} on vLLM needs its {r.accelerator_knob} as a local directory")
        config["model"] = str(accelerator_path)
    for knob in r.knobs:
        if knob.knob not in knobs:
            continue
        value = knobs[knob.knob]
        if isinstance(knob, Carry):
            converted = knob.convert(value) if knob.convert else value
            if converted is not OMIT:
                config[knob.field] = converted
            if knob.note and knob.knob in user_set:
                notes.append(f"{knob.knob}={value}: {knob.note}")
            continue
        if value in knob.same_as:
            continue
        if knob.knob in user_set:
            raise PardecUsageError(
                f"vLLM cannot honour -O {knob.knob}={value} for --method {method}: it {knob.vllm_does}",
                hint="drop the option, or drop --engine vllm to run it on pardec's engine",
            )
        if knob.noted:
            notes.append(f"{knob.knob}={value} is not carried over: vLLM {knob.vllm_does}")
    return Translation(method, config, tuple(notes))
