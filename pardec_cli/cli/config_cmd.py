"""`pardec config`: where pardec's files live and which option defaults are in effect."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from pardec_cli.errors import PardecError


@click.group()
def config() -> None:
    """Configuration: option defaults come from, highest first, the command line,
    PARDEC_<COMMAND>_<FLAG> environment variables (PARDEC_GEN_TEMP=0.7), the config
    file (`pardec config path`), then the built-in defaults. Keys and variables are
    named after the flags: --max-tokens is max_tokens (or max-tokens), --temp is temp.

    \b
    Config file example (TOML):
      dtype = "bfloat16"      # every command that has --dtype
      [gen]
      max_tokens = 512
      temp = 0.7
      method = "pld"
    """


@config.command()
@click.option("--json", "as_json", is_flag=True, help="Print the paths as JSON.")
def path(as_json: bool) -> None:
    """Print where pardec's configuration and data live."""
    from pardec_cli.config import config_path
    from pardec_cli.home import config_dir, models_dir, pardec_home
    from pardec_cli.store.hub import cache_root

    paths = {
        "config_file": str(config_path()),
        "config_dir": str(config_dir()),
        "home": str(pardec_home()),
        "models": str(models_dir()),
        "hf_cache": str(cache_root()),  # the cache pardec reads and pulls into, computed one way
    }
    if as_json:
        click.echo(json.dumps(paths, indent=2))
        return
    exists = " (exists)" if config_path().is_file() else " (not created yet)"
    click.echo(f"config file  {paths['config_file']}{exists}")
    click.echo(f"config dir   {paths['config_dir']}   (PARDEC_CONFIG_DIR)")
    click.echo(f"data home    {paths['home']}   (PARDEC_HOME)")
    click.echo(f"models       {paths['models']}")
    click.echo(f"HF cache     {paths['hf_cache']}   (HF_HOME / HF_HUB_CACHE)")


_SOURCES = {"COMMANDLINE": "command_line", "ENVIRONMENT": "environment", "DEFAULT_MAP": "config_file",
            "DEFAULT": "default", "PROMPT": "prompt"}


def _text(value: Any) -> str:
    """A value as a user would type it: no quotes, no Python None."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value) if value else "-"
    return str(value)


@config.command()
@click.argument("command_name", metavar="COMMAND", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
@click.pass_context
def show(ctx: click.Context, command_name: str | None, as_json: bool) -> None:
    """Print each option's value in effect for COMMAND (default: gen) and where it comes from.

    Each row: the flag, its value, where the value comes from (command line,
    environment, config file, default), and the names to set it by: the config-file key
    and the environment variable.
    """
    from pardec_cli.cli.config_names import preferred_key
    from pardec_cli.config import config_path

    root = ctx.find_root()
    group = root.command
    name = command_name or "gen"
    command = group.get_command(root, name) if isinstance(group, click.Group) else None
    if command is None:
        from pardec_cli.errors import PardecUsageError

        raise PardecUsageError(f"no command {name!r}; choose from: {', '.join(group.list_commands(root))}")
    # Let Click resolve the values exactly as it would for `pardec COMMAND` with no arguments.
    sub = command.make_context(name, [], parent=root, resilient_parsing=True)
    prefix = f"PARDEC_{name.upper().replace('-', '_')}_"
    rows: list[dict[str, Any]] = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.name is None or param.hidden:
            continue
        source = sub.get_parameter_source(param.name)
        value = sub.params.get(param.name)
        key = preferred_key(param)
        env = param.envvar if isinstance(param.envvar, str) else prefix + key.upper()
        if source is not None and source.name == "ENVIRONMENT" and env not in os.environ:
            env = prefix + param.name.upper()  # set by its old name
        rows.append({"option": param.opts[-1] if param.opts[-1].startswith("--") else param.opts[0],
                     "value": list(value) if isinstance(value, tuple) else value,
                     "source": _SOURCES.get(source.name, source.name.lower()) if source else "default",
                     "key": key, "env": env})  # fmt: skip
    from pardec_cli.config import read_config

    # Top-level keys apply to every command that has them; only a [command] table's own
    # keys can be wrong for it.
    try:
        sections = read_config(group.list_commands(root))[1]
    except PardecError:
        sections = {}
    from pardec_cli.cli.config_names import flag_keys

    # (Loading the command already printed a did-you-mean hint for each of these.)
    unknown = sorted(set(sections.get(name, {})) - set(flag_keys(command)))
    if name == "gen":
        from pardec_cli.planning import PROFILE_SAMPLING_KEYS

        profiled = [r["option"] for r in rows if r["source"] == "default" and r["option"].lstrip("-").replace("-", "_")
                    in {*PROFILE_SAMPLING_KEYS, "temp"}]
        if profiled:
            click.echo(f"pardec: note: {', '.join(profiled)} at their default take the task profile's value "
                       "when it has one (-P; task profiles: docs/auto.md)", err=True)
    if as_json:
        click.echo(json.dumps({"command": name, "options": rows, "unknown_keys": unknown}, indent=2))
        return
    words = {"command_line": "command line", "config_file": f"config file ({config_path()})"}
    click.echo(f"pardec {name}: options in effect (a flag beats {prefix}<KEY>, which beats config.toml's [{name}] key)")
    table = [("OPTION", "VALUE", "FROM", "CONFIG KEY", "ENVIRONMENT")]
    for r in rows:
        table.append((r["option"], _text(r["value"]), words.get(r["source"], r["source"]), r["key"], r["env"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
