"""`pardec config`: where pardec's files live and which option defaults are in effect."""

from __future__ import annotations

import json
from typing import Any

import click

from pardec_cli.errors import PardecError


@click.group()
def config() -> None:
    """Configuration: option defaults come from, highest first, the command line,
    PARDEC_<COMMAND>_<OPTION> environment variables (PARDEC_GEN_MAX_TOKENS=64), the
    config file (`pardec config path`), then the built-in defaults.

    \b
    Config file example (TOML):
      dtype = "bfloat16"      # every command that has --dtype
      [gen]
      max_tokens = 512
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


@config.command()
@click.argument("command_name", metavar="COMMAND", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
@click.pass_context
def show(ctx: click.Context, command_name: str | None, as_json: bool) -> None:
    """Print each option's value in effect for COMMAND (default: gen) and where it comes from.

    Sources: commandline, environment, default_map (the config file) or default.
    """
    root = ctx.find_root()
    group = root.command
    name = command_name or "gen"
    command = group.get_command(root, name) if isinstance(group, click.Group) else None
    if command is None:
        from pardec_cli.errors import PardecUsageError

        raise PardecUsageError(f"no command {name!r}; choose from: {', '.join(group.list_commands(root))}")
    # Let Click resolve the values exactly as it would for `pardec COMMAND` with no arguments.
    sub = command.make_context(name, [], parent=root, resilient_parsing=True)
    rows: list[dict[str, Any]] = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.name is None or param.hidden:
            continue
        source = sub.get_parameter_source(param.name)
        value = sub.params.get(param.name)
        rows.append({"option": param.opts[-1], "value": list(value) if isinstance(value, tuple) else value,
                     "source": source.name.lower() if source else "default"})
    from pardec_cli.config import read_config

    # Top-level keys apply to every command that has them; only a [command] table's own
    # keys can be wrong for it.
    try:
        sections = read_config(group.list_commands(root))[1]
    except PardecError:
        sections = {}
    known = {param.name for param in command.params}
    unknown = sorted(set(sections.get(name, {})) - known)
    for key in unknown:
        click.echo(f"pardec: note: {key!r} in the config file is not an option of {name!r}", err=True)
    if name == "gen":
        from pardec_cli.planning import PROFILE_SAMPLING_KEYS

        profiled = [r["option"] for r in rows if r["source"] == "default" and r["option"].lstrip("-").replace("-", "_")
                    in {*PROFILE_SAMPLING_KEYS, "temp"}]
        if profiled:
            click.echo(f"pardec: note: {', '.join(profiled)} at their default take the task profile's value "
                       "when it has one (-P; see the README's task profiles)", err=True)
    if as_json:
        click.echo(json.dumps({"command": name, "options": rows, "unknown_keys": unknown}, indent=2))
        return
    width = max((len(r["option"]) for r in rows), default=0)
    for r in rows:
        click.echo(f"{r['option']:<{width}}  {r['value']!r:<24} {r['source']}")
