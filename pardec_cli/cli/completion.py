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

from pathlib import Path
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


def install_path(shell: str, environ: Any = None) -> Path:
    """Where `shell` looks for a user's completion scripts (the shell's own convention).

    bash: bash-completion's user folder, ``$XDG_DATA_HOME/bash-completion/completions``
    (loaded on demand); zsh: ``~/.zfunc/_pardec`` (a folder on ``fpath``); fish:
    ``$XDG_CONFIG_HOME/fish/completions`` (read by fish itself).
    """
    import os

    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    data = Path(env.get("XDG_DATA_HOME") or home / ".local" / "share")
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    return {
        "bash": data / "bash-completion" / "completions" / "pardec",
        "zsh": home / ".zfunc" / "_pardec",
        "fish": config / "fish" / "completions" / "pardec.fish",
    }[shell]


def install(shell: str) -> tuple[Path, str]:
    """Write the script where `shell` finds it; (path, "installed" | "updated" |
    "already up to date"). Running it again changes nothing."""
    path = install_path(shell)
    script = completion_script(shell)
    try:
        before = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        before = None
    if before == script:
        return path, "already up to date"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script, encoding="utf-8")
    return path, "installed" if before is None else "updated"


def _zsh_needs_fpath() -> bool:
    """Whether ~/.zshrc does not put ~/.zfunc on fpath yet (then the user must add it)."""
    rc = install_path("zsh").parent.parent / ".zshrc"
    try:
        text = rc.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    return ".zfunc" not in text


def _detect_shell() -> str:
    import os

    from pardec_cli.errors import PardecUsageError

    name = Path(os.environ.get("SHELL", "")).name
    if name not in SHELLS:
        raise PardecUsageError(f"cannot tell the shell from SHELL={os.environ.get('SHELL', '')!r}",
                               hint="name it: pardec completion --install bash (or zsh, fish)")  # fmt: skip
    return name


@click.command()
@click.argument("shell", type=click.Choice(SHELLS), required=False)
@click.option("--install", "do_install", is_flag=True,
              help="Write the script where SHELL loads completions from (default: the shell in $SHELL), "
              "instead of printing it. Safe to run again.")
def completion(shell: str | None, do_install: bool) -> None:
    """Print the Tab-completion script for SHELL (bash, zsh or fish), or install it.

    It completes commands, options, method names and the names of installed models
    and catalog aliases. Install it once with `pardec completion --install`, which
    writes it to the shell's usual place for a user's completions:

    \b
      bash  ~/.local/share/bash-completion/completions/pardec   (needs bash-completion)
      zsh   ~/.zfunc/_pardec   (with  fpath=(~/.zfunc $fpath); autoload -Uz compinit; compinit  in ~/.zshrc)
      fish  ~/.config/fish/completions/pardec.fish

    Or print it and put it anywhere: eval "$(pardec completion bash)" in ~/.bashrc.
    """
    if not do_install:
        if shell is None:
            from pardec_cli.errors import PardecUsageError

            raise PardecUsageError("which shell? pardec completion bash|zsh|fish prints its script",
                                   hint="or `pardec completion --install` installs it for the shell in $SHELL")  # fmt: skip
        click.echo(completion_script(shell), nl=False)
        return
    shell = shell or _detect_shell()
    path, what = install(shell)
    click.echo(f"{shell} completion {what}: {path}")
    if shell == "zsh" and _zsh_needs_fpath():
        click.echo("add to ~/.zshrc (before compinit):  fpath=(~/.zfunc $fpath); autoload -Uz compinit; compinit")
    if what != "already up to date":
        click.echo("open a new shell (or `exec " + shell + "`) for Tab completion to start")
