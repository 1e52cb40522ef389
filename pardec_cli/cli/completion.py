"""`pardec completion SHELL`, and the completers that know pardec's models.

The scripts are Click's own (``click.shell_completion``): the shell calls `pardec` back
with ``_PARDEC_COMPLETE=<shell>_complete`` and the words typed so far, and Click answers
from the command tree. Commands, options, --method values (from the method registry)
and -m/--model values (installed models + catalog aliases) all come from code that
imports neither torch nor transformers, so a Tab press answers in a fraction of a second.

Copies of the scripts are committed in ``completions/`` (pardec.bash, _pardec,
pardec.fish); ``tests/test_completions.py`` fails when they are stale.
"""

from __future__ import annotations

from typing import Any

import click

PROG_NAME = "pardec"
COMPLETE_VAR = "_PARDEC_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
# Where the committed copies live, relative to the repository root.
SCRIPT_FILES = {"bash": "completions/pardec.bash", "zsh": "completions/_pardec", "fish": "completions/pardec.fish"}


def completion_script(shell: str) -> str:
    """The completion script for `shell`, as Click's completion class for it writes it."""
    from click.shell_completion import ShellComplete, get_completion_class

    from pardec_cli.cli.main import cli

    cls = get_completion_class(shell)
    if cls is None:
        raise click.BadParameter(f"unsupported shell {shell!r}; choose from {', '.join(SHELLS)}")
    completer = cls(cli, {}, PROG_NAME, COMPLETE_VAR)
    # ShellComplete.source, not BashComplete.source: the latter also runs `bash` to check
    # its version, which is the user's business and would make the output depend on it.
    return ShellComplete.source(completer)


def model_names() -> dict[str, str]:
    """What -m accepts by name, with a one-line description: models in pardec's store
    (GGUF imports, the embedded model), models pulled from the Hub, then catalog aliases."""
    from pardec_cli.store.layout import installed_models

    names = {name: "installed" for name in installed_models()}
    try:
        from pardec_cli.store.records import all_records

        for record in all_records():
            names.setdefault(record.name, "pulled")
    except Exception:  # unreadable pull records must not break Tab
        pass
    try:
        from pardec_cli.store.catalog import load_catalog

        catalog = load_catalog()
    except Exception:  # a broken user catalog must not break Tab
        catalog = {}
    for alias, entry in catalog.items():
        names.setdefault(alias, entry.description or entry.repo)
    return names


def complete_model(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Complete -m/--model and --draft-model: store models and aliases, or directories for a path."""
    from click.shell_completion import CompletionItem

    if incomplete.startswith((".", "/", "~")):
        return [CompletionItem(incomplete, type="dir")]
    try:
        names = model_names()
    except Exception:
        return []
    return [CompletionItem(name, help=about) for name, about in names.items() if name.startswith(incomplete)]


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the Tab-completion script for SHELL (bash, zsh or fish).

    It completes commands, options, method names and the names of installed models
    and catalog aliases. Install it once:

    \b
      bash  pardec completion bash > ~/.local/share/bash-completion/completions/pardec
            (or add  eval "$(pardec completion bash)"  to ~/.bashrc)
      zsh   pardec completion zsh > ~/.zfunc/_pardec
            (with  fpath=(~/.zfunc $fpath); autoload -Uz compinit; compinit  in ~/.zshrc)
      fish  pardec completion fish > ~/.config/fish/completions/pardec.fish
    """
    click.echo(completion_script(shell), nl=False)
