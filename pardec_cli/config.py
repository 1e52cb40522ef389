"""User configuration: option defaults from a TOML file, resolved by Click.

Precedence for every option of every command, highest first:

    command-line flag  >  PARDEC_<COMMAND>_<OPTION> environment variable
    >  config file ([<command>] table, then top-level keys)  >  built-in default

(the task profile of `gen`, `-P`, sits between the config file and the built-in
defaults for the sampling options: `pardec_cli.selection.profiles`). Click implements the first three levels itself: the file becomes its
``default_map`` and the environment its ``auto_envvar_prefix``; this module only reads
and checks the file.

    # ~/.config/pardec/config.toml
    dtype = "bfloat16"          # top level: every command that has the option
    [gen]
    max_tokens = 512
    method = "pld"
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from pardec_cli.errors import PardecUsageError
from pardec_cli.home import config_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_PREFIX = "PARDEC"
_SCALARS = (str, int, float, bool)
# The options that take a list (Click's multiple=True): --stop, -O, --drafter.
REPEATABLE = frozenset({"stop", "method_opts", "drafters", "vllm_args"})


def config_path() -> Path:
    """The config file: ``config.toml`` in the config directory (it may not exist)."""
    return config_dir() / "config.toml"


def _check_value(path: Path, key: str, value: Any) -> Any:
    name = key.rpartition(".")[2].replace("-", "_")
    if isinstance(value, float) and not math.isfinite(value):
        raise PardecUsageError(f"{path}: key {key!r} must be a finite number, not {value}", hint=f"fix or remove it in {path}")
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list) and name in REPEATABLE and all(isinstance(v, _SCALARS) for v in value):
        return value  # repeatable options (--stop, -O)
    what = "a string, number, boolean or a list of those" if name in REPEATABLE else "one string, number or boolean"
    raise PardecUsageError(
        f"{path}: key {key!r} must be {what}, not {type(value).__name__}",
        hint=f"fix or remove it in {path}",
    )


def load_default_map(commands: list[str], path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Read the config file into Click's default_map (see `read_config`)."""
    shared, sections = read_config(commands, path)
    return {command: {**shared, **sections.get(command, {})} for command in commands if shared or command in sections}


def read_config(commands: list[str], path: Path | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Read the config file: (top-level keys, command -> its table's keys).

    Top-level keys go to every command (an option a command lacks is ignored there);
    a ``[command]`` table overrides them for that command. Dashes in keys become
    underscores, so ``max-tokens`` and ``max_tokens`` both name ``--max-tokens``.
    A missing file is an empty configuration; a broken one is one clear error naming
    the file and the line.
    """
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, {}
    except OSError as exc:
        raise PardecUsageError(f"cannot read the config file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PardecUsageError(f"{path}: {exc}", hint=f"fix the TOML syntax in {path}") from None
    shared: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if isinstance(value, dict):
            if key not in commands:
                raise PardecUsageError(
                    f"{path}: [{key}] is not a pardec command (tables: {', '.join(commands)})",
                    hint=f"rename or remove the [{key}] table in {path}",
                )
            sections[key] = {k.replace("-", "_"): _check_value(path, f"{key}.{k}", v) for k, v in value.items()}
        else:
            shared[name] = _check_value(path, key, value)
    return shared, sections
