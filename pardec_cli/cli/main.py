"""The `pardec` command: a lazy Click group and the one place errors become exit codes.

Subcommands are imported only when invoked, so `pardec --help` and shell completion do
not pay for torch or transformers.

Exit codes: 0 success (also when the token limit ends a reply), 1 runtime error,
2 usage error, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from pardec_cli import __version__

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# name -> ("module:attribute", one-line help shown by `pardec --help` without importing it)
COMMANDS: dict[str, tuple[str, str]] = {
    "gen": ("pardec_cli.cli.gen:gen", "Generate text from a prompt, streamed as tokens are accepted."),
    "chat": ("pardec_cli.cli.chat:chat", "Chat in a terminal UI and watch parallel decoding at work."),
    "serve": ("pardec_cli.cli.serve:serve", "Serve a model over the OpenAI API (warm, parallel decoding per request)."),
    "bench": ("pardec_cli.cli.bench:bench", "Benchmark decoding methods side by side (built-in prompts, or a Spec-Bench file)."),
    "methods": ("pardec_cli.cli.methods:methods", "List decoding methods and their knobs."),
    "doctor": ("pardec_cli.cli.doctor:doctor", "Show hardware, versions, models, and what --method auto would pick."),
    "tune": ("pardec_cli.cli.tune:tune", "Measure this machine and find the fastest method knobs per task profile."),
    "config": ("pardec_cli.cli.config_cmd:config", "Show where pardec keeps its files and the option defaults in effect."),
    "pull": ("pardec_cli.cli.models:pull", "Download a model and its drafters/heads into the Hugging Face cache."),
    "list": ("pardec_cli.cli.models:list_models", "List the models on this machine; --available lists those that can be pulled."),
    "show": ("pardec_cli.cli.models:show", "Describe a model: a local one, or a catalog alias before you pull it."),
    "rm": ("pardec_cli.cli.models:rm", "Remove models pardec pulled or imported; report the space freed."),
    "import": ("pardec_cli.cli.models:import_gguf", "Convert a GGUF file into a model in pardec's store."),
    "train-heads": ("pardec_cli.cli.train_heads:train_heads", "Train Medusa or EAGLE heads for a local model (its weights frozen)."),
    "completion": ("pardec_cli.cli.completion:completion", "Print or --install the Tab-completion script for bash, zsh or fish."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        module_name, attr = entry[0].split(":")
        command = getattr(importlib.import_module(module_name), attr)
        _use_flag_names(ctx, name, command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static one-liners so that --help imports no subcommand module.
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _use_flag_names(ctx: click.Context, name: str, command: click.Command) -> None:
    """Config keys and variables named after the flags (temp, PARDEC_GEN_TEMP), the old
    parameter names still accepted with a hint, unknown keys with a did-you-mean
    (`pardec_cli.cli.config_names`)."""
    import os

    from pardec_cli.cli.config_names import env_names, old_env_notes, translate_defaults
    from pardec_cli.errors import PardecError

    env_names(name, command)
    notes: list[str] = []
    defaults = (ctx.default_map or {}).get(name)
    if defaults:
        from pardec_cli.config import read_config

        try:
            own = set(read_config(sorted(COMMANDS))[1].get(name, {}))
        except PardecError:
            own = set()
        ctx.default_map[name], notes = translate_defaults(name, command, defaults, own)  # type: ignore[index]
    notes += old_env_notes(name, command, os.environ)
    quiet = ctx.resilient_parsing or "_PARDEC_COMPLETE" in os.environ
    shown = ctx.meta.setdefault("pardec.config_notes", set())
    for note in notes:
        if not quiet and note not in shown:
            shown.add(note)
            _say(f"pardec: hint: {note}")


# Every option can also come from PARDEC_<COMMAND>_<OPTION> (e.g. PARDEC_GEN_MAX_TOKENS=64)
# and from the config file (pardec_cli.config); a flag on the command line wins.
@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "PARDEC"})
@click.version_option(__version__, prog_name="pardec")
def cli() -> None:
    """pardec: fast local LLM generation with parallel decoding.

    \b
    Examples:
      pardec gen "Write a haiku about GPUs"          embedded SmolLM2-135M, method chosen by auto
      pardec gen --explain -P code "Write a sort"    why auto chose what it chose
      pardec gen --method layerskip -O layers=16 "Explain KV caches"
      cat notes.md | pardec gen "Summarise:"         stdin is appended to the prompt
      pardec tune --budget 20                        measure this machine; auto uses the results
      pardec list --available                        models that can be pulled, and what speeds them up
      pardec doctor                                  hardware, models, and auto's picks
      pardec serve                                   OpenAI-compatible server on 127.0.0.1:8000
      pardec bench --methods auto,vanilla,pld --plot compare methods on pardec's own prompts
      pardec completion --install                    Tab completion for your shell

    Greedy output of every method equals plain decoding; sampling keeps the model's
    distribution. `pardec methods` lists the methods and their knobs.
    """


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the CLI and maps failures to exit codes."""
    leave(run(argv))


def leave(code: int) -> NoReturn:
    """Exit with `code`. Once torch is loaded, Python's own finalization (every module torn
    down, torch's and transformers' included) takes 0.5-1.2 s after the work is done, 17% of
    a short `pardec gen` (docs/cli.md): where nothing else is running, run the atexit
    handlers, flush the standard streams and leave without it. State files are written and
    closed before a command returns; a thread or child process still running (a compile
    pool) gets the usual exit, which waits for it."""
    import atexit
    import os

    if "torch" not in sys.modules or _others_running():
        sys.exit(code)
    atexit._run_exitfuncs()  # what sys.exit would run first: logging's shutdown, temporary files
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), a closed stream
            pass
    os._exit(code)


def _others_running() -> bool:
    """Whether another Python thread or a child process of this one is alive (where that
    cannot be read, as on systems without /proc: assumed so)."""
    import os
    import threading

    if threading.active_count() > 1:
        return True
    try:
        return any(
            Path(f"/proc/self/task/{task}/children").read_text().strip() for task in os.listdir("/proc/self/task")
        )
    except OSError:
        return True


# The command-line flag of each sampling setting (for errors raised below the CLI).
SAMPLING_FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p"}


def cli_words(exc: Any) -> tuple[str, str | None]:
    """The message and hint the command line prints for a `PardecError`.

    The engine raises typed errors that carry facts, never flag names; here they are
    worded in the command line's terms (its flags)."""
    from pardec_cli.errors import CacheRollbackError, InvalidSamplingError

    if isinstance(exc, InvalidSamplingError):
        return f"{SAMPLING_FLAGS.get(exc.setting, exc.setting)} must be {exc.rule}, got {exc.value}", exc.hint
    if isinstance(exc, CacheRollbackError) and exc.hint is None:
        return exc.message, "use --method vanilla with this model"
    return exc.message, exc.hint


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code instead of raising SystemExit."""
    from pardec_cli.errors import PardecError

    try:
        # Without standalone mode Click returns ctx.exit(N)'s code instead of exiting.
        from pardec_cli.config import load_default_map

        try:
            default_map = load_default_map(sorted(COMMANDS))
        except PardecError as exc:
            # A broken config file must not hide the way to find and fix it.
            args = sys.argv[1:] if argv is None else argv
            if args and args[0] not in ("config", "-h", "--help"):
                raise
            _say(f"pardec: warning: {exc.message} (ignored)")
            default_map = {}
        returned = cli.main(args=argv, prog_name="pardec", standalone_mode=False, default_map=default_map)
    except click.exceptions.Abort:
        _say("pardec: interrupted")
        return EXIT_INTERRUPTED
    except click.ClickException as exc:
        from_config = _config_value_error(exc)
        if from_config is not None:
            _say(f"pardec: error: {from_config.message}")
            _say(f"pardec: hint: {from_config.hint}")
            return from_config.exit_code
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except PardecError as exc:
        message, hint = cli_words(exc)
        _say(f"pardec: error: {message}")
        if hint:
            _say(f"pardec: hint: {hint}")
        return exc.exit_code
    except KeyboardInterrupt:
        _say("\npardec: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except OSError as exc:
        # A filesystem failure no command turned into its own message (read-only or full
        # disk, PARDEC_HOME that is a file): one line that names the file, not a traceback.
        from pardec_cli.statefile import fs_error

        error = fs_error(exc, "a file operation")
        _say(f"pardec: error: {error.message}")
        if error.hint:
            _say(f"pardec: hint: {error.hint}")
        return error.exit_code
    except SystemExit:
        # Click turns a closed pipe (EPIPE) into sys.exit(1) after wrapping the streams;
        # the reader leaving early (`pardec list | head -1`) is not a failure.
        if type(sys.stdout).__name__ == "_PacifyFlushWrapper":
            _silence_stdout()
            return EXIT_OK
        raise
    return returned if isinstance(returned, int) else EXIT_OK


def _config_value_error(exc: click.ClickException) -> Any:
    """A bad option value that came from config.toml, as an error naming the file (Click's
    own message names only the option, which the user did not type)."""
    from click.core import ParameterSource

    from pardec_cli.errors import PardecUsageError

    ctx, param = getattr(exc, "ctx", None), getattr(exc, "param", None)
    if not isinstance(exc, click.BadParameter) or ctx is None or param is None or not param.name:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT_MAP:
        return None
    from pardec_cli.config import config_path

    path = config_path()
    return PardecUsageError(f"{path}: [{ctx.info_name}] {param.name}: {exc.format_message()}",
                            hint=f"fix or remove it in {path}")


def _say(message: str) -> None:
    try:
        click.echo(message, err=True)
    except OSError:
        pass


def _silence_stdout() -> None:
    """After the reader of a pipe went away (`| head`), stop Python from complaining at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def echo_err(message: Any) -> None:
    """Diagnostics go to stderr, always."""
    click.echo(message, err=True)
