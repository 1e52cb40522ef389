"""`pardec chat --plain`: the chat line by line, as `ollama run` and `llm chat` do it.

Also what `pardec chat` runs when stdin or stdout is not a terminal (a pipe, a file, a
script). Each line of input is a message, or a /command parsed by the full-screen chat's
own code (`tui.commands.parse_input`, `ChatSettings.apply_command`); each reply is
written to stdout as it streams, then one line of stats to stderr (the same line the
full-screen chat shows under a reply). On a terminal, input has line editing and
history (readline); Ctrl-C stops a reply after the current step, Ctrl-D leaves.

Replies come from the same backends as the full-screen chat (tui/backend.py), so they
are planned the same way, and the conversation is saved the same way.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

from pardec_cli.cli.output import InterruptGuard, is_terminal, loading_status
from pardec_cli.errors import PardecError, PardecUsageError

PROMPT = ">>> "


class PlainChat:
    """One line-mode chat: its backend, settings and conversation."""

    def __init__(self, load: Callable[[str | None], Any], settings: Any, *, model: str | None, system: str | None,
                 conversation: Any, store: Any, out: IO[str], interactive: bool) -> None:
        from pardec_cli.tui.conversation import Conversation

        self.load, self.settings, self.store, self.out = load, settings, store, out
        self.interactive = interactive
        self.conversation = conversation or Conversation(model=model, system=system)
        if system is not None:
            self.conversation.system = system
        self.model_spec = model or self.conversation.model
        self.backend: Any = None
        self.failures = 0
        self.done = False

    # -- the model ------------------------------------------------------------------------

    def load_model(self, spec: str | None) -> None:
        from pardec_cli.tui.backend import as_backend

        with loading_status(f"loading {spec or 'the embedded model'}"):
            backend = as_backend(self.load(spec))
            backend.apply(self.settings)
        self.backend, self.model_spec = backend, spec
        self.conversation.model = backend.model_name
        self.note(f"{backend.model_name} ({backend.where}) · {self.describe()}")

    def describe(self) -> str:
        from pardec_cli.tui.conversation import describe_method

        s = self.settings
        return f"{describe_method(s.method, dict(s.options))} · profile {s.profile} · {s.describe_sampling()}"

    # -- input ----------------------------------------------------------------------------

    def handle(self, line: str) -> None:
        """One line of input: a message (the reply is generated) or a command."""
        from pardec_cli.tui.commands import SlashCommand, parse_input

        try:
            parsed = parse_input(line)
            if parsed is None:
                return
            if isinstance(parsed, SlashCommand):
                self.command(parsed)
            else:
                self.send(parsed)
        except PardecError as exc:
            self.failures += 1
            self.error(exc)

    def command(self, command: Any) -> None:
        from pardec_cli.tui.commands import COMMANDS
        from pardec_cli.tui.conversation import (
            Conversation,
            markdown_path,
            write_markdown,
        )

        name, argument = command.name, command.argument
        if name in ("method", "set", "profile"):
            if name == "method" and not argument:
                from pardec_cli.methods.registry import method_names

                self.note("methods: auto, " + ", ".join(method_names()))
                return
            settings = self.settings.apply_command(name, argument)
            if self.backend is not None:
                self.backend.apply(settings)  # a bad knob or a missing drafter: refused, the old settings stay
            self.settings = settings
            self.note(self.describe())
        elif name == "clear":
            self.conversation = Conversation(model=self.conversation.model, system=self.conversation.system)
            self.note("new conversation")
        elif name == "system":
            self.conversation.system = argument or None
            self.note(f"system prompt: {argument}" if argument else "system prompt: the model's default")
        elif name == "model":
            self.load_model(argument or None)
        elif name == "save":
            if not self.conversation.messages:
                raise PardecUsageError("nothing to save yet")
            self.note(f"saved the transcript to {write_markdown(self.conversation, markdown_path(self.conversation, argument))}")
        elif name == "copy":
            self.copy(argument)
        elif name == "rename":
            self.conversation.name = argument.strip() or None
            self.save()
            self.note(f"renamed: {self.conversation.title or '(untitled)'}")
        elif name == "history":
            self.history(argument)
        elif name == "help":
            width = max(len(usage) for usage, _ in COMMANDS.values())
            for usage, what in COMMANDS.values():
                self.note(f"{usage:<{width}}  {what}")
            self.note("Ctrl-C stops a reply; Ctrl-D (or /quit) leaves; start a message with // to send a slash")
        elif name == "quit":
            self.done = True

    def history(self, argument: str) -> None:
        """`/history`: the saved conversations; `/history ID`: continue that one."""
        if self.store is None:
            raise PardecUsageError("saving is off (--no-save): there are no saved conversations")
        if argument:
            self.conversation = self.store.load(argument)
            self.note(f"continuing {self.conversation.id}: {self.conversation.title} "
                      f"({len(self.conversation.messages)} messages)")
            return
        rows = self.store.list()[:20]
        for row in rows:
            self.note(f"{row.id}  {row.updated.replace('T', ' ')[:16]}  {row.title}")
        self.note("/history ID continues one" if rows else "no saved conversations")

    def copy(self, which: str) -> None:
        text = self.conversation.reply_to_copy(which)
        if not self.interactive:
            raise PardecUsageError("/copy needs a terminal (it asks the terminal to set the clipboard)")
        # OSC 52: the terminal puts the text on the clipboard (what Textual's copy_to_clipboard sends).
        self.out.write(f"\033]52;c;{base64.b64encode(text.encode()).decode()}\a")
        self.out.flush()
        self.note(f"copied the reply ({len(text)} characters)")

    # -- replies --------------------------------------------------------------------------

    def send(self, text: str) -> None:
        """Generate the reply to `text`, streaming it to stdout; stats to stderr."""
        from pardec_cli.tui.conversation import Message, format_reply_line

        if self.backend is None:
            raise PardecError("no model is loaded", hint="/model NAME loads one")
        self.conversation.messages.append(Message("user", text))
        try:
            message = self.generate()
        except BaseException:
            self.conversation.messages.pop()  # the message that got no reply leaves the history
            raise
        self.conversation.messages.append(message)
        self.save()
        click.echo(format_reply_line(message), err=True)

    def generate(self) -> Any:
        out = self.out
        steps: list[int] = []
        with InterruptGuard() as guard:
            run = self.backend.start(self.conversation.chat_messages(), self.conversation.system, self.settings)
            interrupted = False
            try:
                with guard.generating():
                    for piece in run:
                        steps.extend(piece.steps)
                        if piece.text:
                            out.write(piece.text)
                            out.flush()
                        if guard.requested:
                            break
            except KeyboardInterrupt:  # a second Ctrl-C
                interrupted = True
            message = run.finish()  # cancelled when left early
        out.write(run.tail)
        if not message.content.endswith("\n"):
            out.write("\n")
        out.flush()
        message.per_step = steps
        if interrupted:
            raise KeyboardInterrupt
        return message

    def save(self) -> None:
        if self.store is not None:
            try:
                self.store.save(self.conversation)
            except OSError as exc:
                self.error(PardecError(f"could not save the conversation: {exc}"))

    # -- messages to the user -------------------------------------------------------------

    def note(self, text: str) -> None:
        click.echo(text, err=True)

    def error(self, exc: PardecError) -> None:
        click.echo(f"pardec: error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)


def input_lines(stdin: IO[str], interactive: bool) -> Iterator[str]:
    """The lines the user types (with readline's editing and history on a terminal)."""
    if not interactive:
        from pardec_cli.prompt_files import clean_text, tolerant_stdin

        for line in tolerant_stdin(stdin):
            yield clean_text(line.rstrip("\r\n"))
        return
    try:
        import readline  # noqa: F401 - importing it gives input() line editing and history
    except ImportError:  # pragma: no cover - Windows without pyreadline
        pass
    while True:
        try:
            yield input(PROMPT)
        except KeyboardInterrupt:  # at the prompt: a new line, as a shell does
            click.echo("", err=True)
            continue
        except EOFError:
            click.echo("", err=True)
            return


def run_plain(load: Callable[[str | None], Any], settings: Any, *, model: str | None, system: str | None,
              conversation: Any, store: Any, first_message: str | None) -> None:
    """The line-mode chat until the input ends (or /quit). Exits with 1 when a message or a
    command failed (a script sees it), 130 when Ctrl-C stopped a reply in a pipe."""
    interactive = is_terminal(sys.stdin) and is_terminal(sys.stdout)
    chat = PlainChat(load, settings, model=model, system=system, conversation=conversation, store=store,
                     out=sys.stdout, interactive=interactive)
    chat.load_model(chat.model_spec)
    if conversation is not None:
        chat.note(f"continuing {conversation.id}: {conversation.title} ({len(conversation.messages)} messages)")
    if interactive:
        chat.note("/help lists the commands · Ctrl-C stops a reply · Ctrl-D leaves")
    if first_message:
        chat.handle(first_message)
    for line in input_lines(sys.stdin, interactive):
        if chat.done:
            break
        try:
            chat.handle(line)
        except KeyboardInterrupt:
            if not interactive:
                raise
        if chat.done:
            break
    if chat.failures and not interactive:
        raise click.exceptions.Exit(1)
