"""Task profiles: what kind of work a prompt is, and what tends to decode it fastest.

A profile (code, chat, extraction: ``profiles/*.toml`` at the top of the repository,
shipped inside the package) holds

- sampling defaults (temperature, top_p, top_k, max_tokens) for options the user did
  not set on the command line, in the environment or in config.toml;
- per hardware class, an ordered list of candidate methods with their knobs and the
  priors the cost model of `--method auto` needs (`Candidate`).

Users override or add profiles in ``config_dir()/profiles/NAME.toml``: a file named like
a built-in profile is laid over it (its keys win; a ``candidates.<class>`` list replaces
that class's list), any other name adds a profile. A file that is not valid is one error
naming the file, the line and the key.

Torch-free: `pardec --help`, completion and `pardec doctor` read profiles cheaply.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from pardec_cli.errors import PardecUsageError
from pardec_cli.hardware import HARDWARE_CLASSES, Hardware
from pardec_cli.home import config_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BUILTIN_PROFILES: tuple[str, ...] = ("code", "chat", "extraction")
AUTO = "auto"
# Keys of `candidates`: a hardware class, a family, or the fallback for any hardware.
CANDIDATE_GROUPS: tuple[str, ...] = (*HARDWARE_CLASSES, "gpu", "cpu", "default")
_NAME_RE = re.compile(r"[a-z][a-z0-9_-]*")


@dataclass(frozen=True)
class Candidate:
    """A method the cost model may pick, with its knobs and what to expect from it.

    The priors describe one decoding step, on average, for this task and model size:
    `tokens_per_step` tokens emitted (greedy; `sampled_tokens_per_step` under sampling,
    None for "scale the extra tokens by the default sampling discount"), `drafted` draft
    tokens verified, and the drafting cost: `draft_forwards` one-token target forwards
    of self-drafting compute (layer-skip), `draft_calls` forwards of an accelerator
    (drafter model, heads), `draft_ms` host time beyond plain decoding's (drafting,
    verifying a tree, keeping its path: what the forwards' cost curve leaves out).
    `pardec tune` replaces the priors with measurements.
    """

    method: str
    knobs: dict[str, Any] = field(default_factory=dict)
    tokens_per_step: float = 1.0
    drafted: float = 0.0
    draft_forwards: float = 0.0
    draft_calls: float = 0.0
    draft_ms: float = 0.0
    sampled_tokens_per_step: float | None = None
    note: str = ""

    @property
    def label(self) -> str:
        """'suffix[max_nodes=16]': method and knobs, as `pardec bench` labels them."""
        return method_label(self.method, self.knobs)


def method_label(method: str, knobs: dict[str, Any]) -> str:
    """'pld[num_draft=8]' (knobs sorted), or the bare name without knobs."""
    if not knobs:
        return method
    inner = ",".join(f"{k}={_knob_text(v)}" for k, v in sorted(knobs.items()))
    return f"{method}[{inner}]"


def canonical_knobs(method: str, knobs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """`knobs` in one spelling: typed values, defaults dropped, a combination's plain
    knobs spread to PART.KNOB for every part that has them (sorted pairs).

    So one setting has one label whoever writes it: a profile, tune, a proposer's
    `knobs()`, a record of use. Raises PardecUsageError for knobs the method lacks.
    """
    from pardec_cli.methods.options import resolve_options
    from pardec_cli.methods.registry import METHODS, get_spec

    spec = get_spec(method)
    given = dict(knobs)
    if "+" in method:
        parts = method.split("+")
        spread: dict[str, Any] = {}
        for key, value in given.items():
            if "." in key:
                spread[key] = value
            else:
                for part in parts:
                    if any(o.name == key for o in METHODS[part].options):
                        spread.setdefault(f"{part}.{key}", value)
        given = spread
    values = resolve_options(method, spec.options, given)
    defaults = {o.name: o.default for o in spec.options}
    return tuple(sorted((k, v) for k, v in values.items() if v != defaults[k]))


def canonical_label(method: str, knobs: Mapping[str, Any]) -> str:
    """`method_label` of the canonical knobs: 'pld[num_draft=8]' however the knobs were spelled."""
    return method_label(method, dict(canonical_knobs(method, knobs)))


def parse_label(label: str) -> tuple[str, dict[str, Any]]:
    """'pld[num_draft=8]' -> ("pld", {"num_draft": 8}): the method and its canonical knobs."""
    method, _, inner = label.partition("[")
    raw = dict(pair.split("=", 1) for pair in inner.rstrip("]").split(",") if "=" in pair) if inner else {}
    return method, dict(canonical_knobs(method, raw))


def _knob_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Profile:
    """One task profile, as loaded (built-in file, possibly with a user file over it)."""

    name: str
    description: str
    sampling: dict[str, Any]
    candidates: dict[str, tuple[Candidate, ...]]
    sources: tuple[str, ...]  # the files it was read from, built-in first

    def candidates_for(self, hardware: Hardware) -> tuple[Candidate, ...]:
        """The list for the hardware's class, else its family ("gpu"/"cpu"), else "default"."""
        for group in (hardware.hw_class, hardware.family, "default"):
            if group in self.candidates:
                return self.candidates[group]
        return ()

    def group_for(self, hardware: Hardware) -> str | None:
        """Which `candidates` key `candidates_for` reads for this hardware."""
        return next((g for g in (hardware.hw_class, hardware.family, "default") if g in self.candidates), None)


# ------------------------------------------------------------------ locations


def builtin_profiles_dir() -> Traversable:
    """Where the shipped profiles are.

    In a source checkout (running from the repository, or an editable install), the
    repository's top-level ``profiles/`` folder; in an installed wheel, the package data
    ``pardec_cli/profile_data/`` that pyproject.toml maps that folder to.
    """
    checkout = Path(__file__).resolve().parents[2] / "profiles"
    if (checkout / "code.toml").is_file():
        return checkout
    return resources.files("pardec_cli").joinpath("profile_data")


def user_profiles_dir() -> Path:
    """``config_dir()/profiles``: the user's profile overrides and additions."""
    return config_dir() / "profiles"


# -------------------------------------------------------------------- loading


def load_profiles() -> dict[str, Profile]:
    """Every profile: the built-in ones, with the user's files laid over or added."""
    raw: dict[str, tuple[dict[str, Any], list[str]]] = {}
    folder = builtin_profiles_dir()
    for name in BUILTIN_PROFILES:
        entry = folder.joinpath(f"{name}.toml")
        source = f"pardec's built-in profiles/{name}.toml"
        raw[name] = (_parse(entry.read_text(encoding="utf-8"), source), [source])
    user = user_profiles_dir()
    if user.is_dir():
        for path in sorted(user.glob("*.toml")):
            name = path.stem
            if not _NAME_RE.fullmatch(name) or name == AUTO:
                raise PardecUsageError(
                    f"{path}: a profile name must be lower-case letters, digits, '-' or '_', and not 'auto'",
                    hint=f"rename {path.name}",
                )
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PardecUsageError(f"cannot read the profile {path}: {exc}") from None
            data = _parse(text, str(path))
            if name in raw:
                base, sources = raw[name]
                raw[name] = (_overlay(base, data), [*sources, str(path)])
            else:
                raw[name] = (data, [str(path)])
    return {name: _build(name, data, sources) for name, (data, sources) in raw.items()}


def profile_names() -> list[str]:
    """Names `-P` accepts besides "auto": built-in first, then the user's own."""
    names = list(BUILTIN_PROFILES)
    user = user_profiles_dir()
    if user.is_dir():
        names += sorted(p.stem for p in user.glob("*.toml") if p.stem not in names)
    return names


def get_profile(name: str, profiles: Mapping[str, Profile] | None = None) -> Profile:
    """The profile called `name` among `profiles` (None: read them now), or a usage error
    listing the valid names."""
    profiles = load_profiles() if profiles is None else profiles
    if name not in profiles:
        raise PardecUsageError(f"unknown profile {name!r}; choose from: auto, {', '.join(profiles)}")
    return profiles[name]


def _overlay(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A user file over a built-in one: scalar keys and [sampling] keys win key by key;
    a candidates list replaces the built-in list of the same class."""
    merged = {**base, **{k: v for k, v in over.items() if k not in ("sampling", "candidates")}}
    merged["sampling"] = {**base.get("sampling", {}), **over.get("sampling", {})}
    merged["candidates"] = {**base.get("candidates", {}), **over.get("candidates", {})}
    return merged


# ----------------------------------------------------------------- validation

_SAMPLING_KEYS: dict[str, tuple[type, float | None, float | None]] = {
    # key: (type, lowest, highest)
    "temperature": (float, 0.0, None),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, 0, None),
    "max_tokens": (int, 1, None),
}
_CANDIDATE_NUMBERS: dict[str, float] = {  # key: lowest allowed value
    "tokens_per_step": 1.0,
    "sampled_tokens_per_step": 1.0,
    "drafted": 0.0,
    "draft_forwards": 0.0,
    "draft_calls": 0.0,
    "draft_ms": 0.0,
}
_CANDIDATE_KEYS = {"method", "knobs", "note", *_CANDIDATE_NUMBERS}


class _ProfileError(Exception):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key, self.problem = key, problem


def _parse(text: str, source: str) -> dict[str, Any]:
    """TOML text -> checked dict; every problem is one error naming source, line and key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PardecUsageError(f"{source}: {exc}", hint=f"fix the TOML syntax in {source}") from None
    try:
        _check(data)
    except _ProfileError as exc:
        line = _line_of(text, exc.key)
        where = f"{source}:{line}" if line else source
        raise PardecUsageError(f"{where}: {exc.key}: {exc.problem}", hint=f"fix {exc.key} in {source}") from None
    return data


def _check(data: dict[str, Any]) -> None:
    for key, value in data.items():
        if key == "description":
            if not isinstance(value, str):
                raise _ProfileError(key, "must be a string")
        elif key == "sampling":
            _check_sampling(value)
        elif key == "candidates":
            _check_candidates(value)
        else:
            raise _ProfileError(key, "is not a profile key (profile keys: description, sampling, candidates)")


def _check_sampling(table: Any) -> None:
    if not isinstance(table, dict):
        raise _ProfileError("sampling", "must be a table")
    for key, value in table.items():
        if key not in _SAMPLING_KEYS:
            raise _ProfileError(f"sampling.{key}", f"is not a sampling default (those are: {', '.join(_SAMPLING_KEYS)})")
        kind, low, high = _SAMPLING_KEYS[key]
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int and not isinstance(value, int):
            ok_type = False
        if ok_type and not math.isfinite(value):
            ok_type = False  # TOML has nan and inf; neither is a usable setting
        if not ok_type or (low is not None and value < low) or (high is not None and value > high):
            bounds = f">= {low}" + (f" and <= {high}" if high is not None else "")
            raise _ProfileError(f"sampling.{key}", f"must be {'an integer' if kind is int else 'a number'} {bounds}, not {value!r}")


def _check_candidates(table: Any) -> None:
    if not isinstance(table, dict):
        raise _ProfileError("candidates", "must be a table of lists, one per hardware class")
    for group, items in table.items():
        if group not in CANDIDATE_GROUPS:
            raise _ProfileError(f"candidates.{group}", f"is not a hardware class (use one of: {', '.join(CANDIDATE_GROUPS)})")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise _ProfileError(f"candidates.{group}", f"must be a list of tables ([[candidates.{group}]])")
        for index, item in enumerate(items):
            _check_candidate(f"candidates.{group}[{index}]", item)


def _check_candidate(where: str, item: dict[str, Any]) -> None:
    for key in item:
        if key not in _CANDIDATE_KEYS:
            raise _ProfileError(f"{where}.{key}", f"is not a candidate key (those are: {', '.join(sorted(_CANDIDATE_KEYS))})")
    method = item.get("method")
    if not isinstance(method, str) or not method:
        raise _ProfileError(f"{where}.method", "is required: the name of a method")
    knobs = item.get("knobs", {})
    if not isinstance(knobs, dict):
        raise _ProfileError(f"{where}.knobs", "must be a table of knob = value")
    for key, low in _CANDIDATE_NUMBERS.items():
        value = item.get(key)
        if value is None:
            if key == "tokens_per_step":
                raise _ProfileError(f"{where}.{key}", "is required: the expected tokens per decoding step")
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < low:
            raise _ProfileError(f"{where}.{key}", f"must be a number >= {low:g}, not {value!r}")
    problem = knob_problem(method, knobs)
    if problem:
        raise _ProfileError(f"{where}.knobs", problem)


def knob_problem(method: str, knobs: dict[str, Any]) -> str | None:
    """Why `knobs` do not fit the registered `method`, or None (also for unregistered ones,
    which may come with a later version or an optional package: selection skips them)."""
    from pardec_cli.methods.options import resolve_options
    from pardec_cli.methods.registry import METHODS, get_spec

    if any(part not in METHODS for part in method.split("+")):
        return None
    try:
        spec = get_spec(method)
        if "+" in method:
            parts = method.split("+")
            plain = {o.name for p in parts for o in METHODS[p].options}
            unknown = [k for k in knobs if k not in plain and k not in {o.name for o in spec.options}]
            if unknown:
                return f"method {method!r} has no option {unknown[0]!r}"
            resolve_options(method, spec.options, {k: v for k, v in knobs.items() if "." in k})
        else:
            resolve_options(method, spec.options, knobs)
    except PardecUsageError as exc:
        return exc.message
    return None


def _build(name: str, data: dict[str, Any], sources: list[str]) -> Profile:
    candidates = {
        group: tuple(
            Candidate(
                method=item["method"],
                knobs=dict(item.get("knobs", {})),
                note=str(item.get("note", "")),
                **{k: float(item[k]) for k in _CANDIDATE_NUMBERS if item.get(k) is not None},
            )
            for item in items
        )
        for group, items in data.get("candidates", {}).items()
    }
    return Profile(
        name=name,
        description=str(data.get("description", "")),
        sampling=dict(data.get("sampling", {})),
        candidates=candidates,
        sources=tuple(sources),
    )


def _line_of(text: str, key: str) -> int | None:
    """The line (1-based) where dotted `key` is set: 'description', 'sampling.top_p',
    'candidates.cpu[2].knobs'. Good enough for the profile layout; None when not found."""
    lines = text.splitlines()
    match = re.fullmatch(r"candidates\.([\w-]+)\[(\d+)\](?:\.(\w+))?", key)
    if match:
        group, index, leaf = match.group(1), int(match.group(2)), match.group(3)
        starts = _headers(lines, rf"\[\s*candidates\.\"?{re.escape(group)}\"?\s*\]")
        if index >= len(starts):
            return None
        return (_assignment(lines, starts[index] + 1, leaf) if leaf else None) or starts[index] + 1
    table, _, leaf = key.rpartition(".")
    if table:
        starts = _headers(lines, re.escape(table))
        if starts:
            return _assignment(lines, starts[0] + 1, leaf) or starts[0] + 1
        leaf = key
    line = _assignment(lines, 0, leaf)
    if line is None:  # a top-level key written as a table: [sampling], [candidates.cpu]...
        headers = _headers(lines, re.escape(leaf) + r"[\].]")
        line = headers[0] + 1 if headers else None
    return line


def _headers(lines: list[str], pattern: str) -> list[int]:
    """Indices of the table headers ([x] or [[x]]) whose name matches `pattern`."""
    header = re.compile(rf"^\s*\[\[?\s*{pattern}")
    return [i for i, line in enumerate(lines) if header.match(line)]


def _assignment(lines: list[str], start: int, key: str) -> int | None:
    """The first line from `start` on, before the next table header, that assigns `key`."""
    assign = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*=")
    for i in range(start, len(lines)):
        if lines[i].lstrip().startswith("["):
            return None
        if assign.match(lines[i]):
            return i + 1
    return None
