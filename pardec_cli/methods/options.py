"""Method knobs: declared once per method, parsed from `-O key=value` and profiles.

Torch-free, so `pardec methods`, `--help` and shell completion can list them cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


def parse_assignments(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """['k=4', 'max_ngram=3'] -> {'k': '4', 'max_ngram': '3'}."""
    result: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise PardecUsageError(f"method option {pair!r} is not of the form NAME=VALUE")
        result[name.strip().replace("-", "_")] = value.strip()
    return result
