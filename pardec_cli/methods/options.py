"""Method knobs: declared once per method, parsed from `-O key=value` and profiles.

Torch-free, so `pardec methods`, `--help` and shell completion can list them cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pardec_cli.errors import PardecUsageError


@dataclass(frozen=True)
class MethodOption:
    """One knob of a method. `kind` is int, float, bool or str.

    `search` lists the values `pardec tune` may try, in increasing order (empty: tune
    leaves the knob at what the profile or the default says).
    """

    name: str
    kind: type
    default: Any
    help: str
    search: tuple[Any, ...] = ()


def parse_value(option: MethodOption, raw: Any) -> Any:
    """Convert a raw value (a string from the command line, or a TOML value) to the option's type.

    Numbers must be finite: 'nan' and 'inf' parse as floats but mean nothing as a knob."""
    value = _parse_value(option, raw)
    if isinstance(value, float) and not math.isfinite(value):
        raise PardecUsageError(f"option {option.name!r} expects a finite number, got {raw!r}")
    return value


def _parse_value(option: MethodOption, raw: Any) -> Any:
    if not isinstance(raw, str):
        if option.kind is float and isinstance(raw, int):
            return float(raw)
        if isinstance(raw, option.kind) or raw is None:
            return raw
        raise PardecUsageError(f"option {option.name!r} expects {option.kind.__name__}, got {raw!r}")
    try:
        if option.kind is bool:
            lowered = raw.strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        return option.kind(raw)
    except ValueError:
        raise PardecUsageError(f"option {option.name!r} expects {option.kind.__name__}, got {raw!r}") from None


def resolve_options(
    method: str, declared: tuple[MethodOption, ...], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Defaults overlaid with `given`; unknown names are a usage error listing the valid ones."""
    by_name = {option.name: option for option in declared}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        valid = ", ".join(by_name) or "none"
        raise PardecUsageError(f"method {method!r} has no option {unknown[0]!r} (its options: {valid})")
    values = {option.name: option.default for option in declared}
    for name, raw in given.items():
        values[name] = parse_value(by_name[name], raw)
    return values


def split_knobs(text: str) -> list[str]:
    """'layer_list=0-9,20-29,k=4' -> ['layer_list=0-9,20-29', 'k=4'].

    A comma starts a new knob only outside brackets and when the next piece is itself
    NAME=VALUE, so list values (layer lists) and arms ('arms=pld[num_draft=4] | vanilla')
    keep their commas.
    """
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    knobs: list[str] = []
    for piece in pieces:
        if "=" in piece or not knobs:
            knobs.append(piece)
        else:
            knobs[-1] += "," + piece
    return [k for k in knobs if k.strip()]


def parse_label(label: str, what: str = "method") -> tuple[str, tuple[str, ...]]:
    """'pld[num_draft=8]', a method as bench, tune and --explain label it, -> ('pld',
    ('num_draft=8',)): the name (a combination's parts joined by '+' without spaces) and
    its knobs as NAME=VALUE pairs; a bare name has none. `what` names it in the error."""
    name, bracket, rest = label.strip().partition("[")
    name = "+".join(part.strip() for part in name.split("+"))  # 'pld + recycling' as 'pld+recycling'
    if bracket and (not rest.endswith("]") or not name):
        raise PardecUsageError(f"cannot read the {what} {label.strip()!r}",
                               hint="the form is NAME[KNOB=VALUE,...], e.g. pld[num_draft=8]")
    return name, tuple(split_knobs(rest[:-1])) if bracket else ()


def merge_label_knobs(label: str, more: Sequence[str], where: str) -> tuple[str, tuple[str, ...]]:
    """`parse_label(label)` with the NAME=VALUE pairs `more` after its own knobs; a knob in
    both is a usage error (which value was meant?), `where` saying where `more` came from."""
    name, knobs = parse_label(label)
    twice = set(parse_assignments(knobs)) & set(parse_assignments(tuple(more)))
    if twice:
        raise PardecUsageError(f"{', '.join(sorted(twice))} given twice: in {label.strip()!r} and {where}",
                               hint="give each knob once")
    return name, knobs + tuple(more)


def parse_assignments(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """['k=4', 'max_ngram=3'] -> {'k': '4', 'max_ngram': '3'}."""
    result: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise PardecUsageError(f"method option {pair!r} is not of the form NAME=VALUE")
        result[name.strip().replace("-", "_")] = value.strip()
    return result
