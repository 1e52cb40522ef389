"""Config-file keys and environment variables named after the flags.

Click names an option's config key and environment variable after its Python parameter
(``--temp`` is the parameter ``temperature``, so Click alone would want ``temperature =
0.5`` and ``PARDEC_GEN_TEMPERATURE``). Users write what they type: ``temp = 0.5`` and
``PARDEC_GEN_TEMP``. This module makes the flag's name the documented one, keeps the
parameter's name working (with a one-line hint), and suggests the closest name for a
key that names no option. `LazyGroup.get_command` applies it to each command it loads.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import click


def _key(text: str) -> str:
    return text.lstrip("-").replace("-", "_")


def flag_keys(command: click.Command) -> dict[str, str]:
    """config key -> parameter name, for every option of `command`: the long flag's name
    ("temp" for --temp, "max_tokens" for --max-tokens) and the parameter's own name."""
    keys: dict[str, str] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or not param.name:
            continue
        for opt in param.opts + param.secondary_opts:
            if opt.startswith("--"):
                keys.setdefault(_key(opt), param.name)
        keys.setdefault(param.name, param.name)
    return keys


def preferred_key(param: click.Option) -> str:
    """The name a config key or variable should use: the first long flag's (temp)."""
    long = [opt for opt in param.opts if opt.startswith("--")]
    return _key(long[0]) if long else str(param.name)


def renamed_params(command: click.Command) -> dict[str, str]:
    """parameter name -> flag key, for the options whose flag is named differently
    (temperature -> temp): the old names that keep working with a hint."""
    return {
        str(param.name): preferred_key(param)
        for param in command.params
        if isinstance(param, click.Option) and param.name and preferred_key(param) != param.name
    }


def translate_defaults(command_name: str, command: click.Command, defaults: Mapping[str, Any],
                       own_keys: set[str] | frozenset[str] = frozenset()) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """The command's default_map with flag-named keys turned into parameter names, and
    the notes to print: an old name used, or a key of the command's own table (`own_keys`)
    that names no option (with the closest names). Top-level keys a command lacks are
    left alone: they are meant for other commands."""
    keys, renamed = flag_keys(command), renamed_params(command)
    translated: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in defaults.items():
        name = keys.get(key)
        if name is None:
            if key in own_keys:
                close = difflib.get_close_matches(key, sorted({preferred_key_of(command, k) for k in keys}), n=2)
                guess = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
                notes.append(f"config: [{command_name}] {key!r} is not an option of `pardec {command_name}`{guess}")
            continue
        if key in renamed:
            notes.append(f"config: {key!r} is the old name of {renamed[key]!r} (it still works; "
                         f"`{renamed[key]} = ...` matches the --{renamed[key].replace('_', '-')} flag)")
        translated[name] = value
    return translated, notes


def preferred_key_of(command: click.Command, key: str) -> str:
    """The flag-named key for any key `flag_keys` knows (temperature -> temp)."""
    name = flag_keys(command)[key]
    for param in command.params:
        if isinstance(param, click.Option) and param.name == name:
            return preferred_key(param)
    return key


def env_names(command_name: str, command: click.Command, prefix: str = "PARDEC") -> None:
    """Let each renamed option read PARDEC_<COMMAND>_<FLAG> (PARDEC_GEN_TEMP); Click's
    own fallback still reads PARDEC_<COMMAND>_<PARAMETER> (PARDEC_GEN_TEMPERATURE)."""
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar is None and param.name:
            flag = preferred_key(param)
            if flag != param.name:
                param.envvar = f"{prefix}_{command_name.upper().replace('-', '_')}_{flag.upper()}"


def old_env_notes(command_name: str, command: click.Command, environ: Mapping[str, str],
                  prefix: str = "PARDEC") -> list[str]:  # fmt: skip
    """One hint per old-style variable set (PARDEC_GEN_TEMPERATURE): its new name."""
    base = f"{prefix}_{command_name.upper().replace('-', '_')}_"
    return [
        f"{base}{old.upper()} is the old name of {base}{new.upper()} (it still works)"
        for old, new in renamed_params(command).items()
        if f"{base}{old.upper()}" in environ and f"{base}{new.upper()}" not in environ
    ]
