"""`pardec methods`: what can be passed to --method, and each method's knobs."""

from __future__ import annotations

import json

import click

from pardec_cli.methods.registry import METHODS


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def methods(as_json: bool) -> None:
    """List decoding methods and the knobs -O KEY=VALUE accepts for each."""
    if as_json:
        data = [
            {
                "name": spec.name,
                "summary": spec.summary,
                "options": [
                    {"name": o.name, "type": o.kind.__name__, "default": o.default, "help": o.help} for o in spec.options
                ],
            }
            for spec in METHODS.values()
        ]
        click.echo(json.dumps(data, indent=2))
        return
    knob_width = max((len(o.name) + len(o.kind.__name__) + 1 for s in METHODS.values() for o in s.options), default=0)
    for spec in METHODS.values():
        click.echo(f"{spec.name:<10} {spec.summary}")
        for option in spec.options:
            default = "" if option.default in (None, "") else f" (default {option.default})"
            knob = f"{option.name}={option.kind.__name__.upper()}"
            click.echo(f"    -O {knob:<{knob_width}}  {option.help}{default}")
    click.echo(
        "\nDraft-free methods combine into one tree verified in one pass: --method suffix+recycling,\n"
        "with knobs per part as -O recycling.nodes=16 (a plain -O nodes=16 goes to every part that has it).\n"
        "--method auto (the default) chooses a method and knobs per prompt; `pardec doctor` shows what it would pick."
    )
