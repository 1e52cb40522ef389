"""Modal screens: keyboard help, the saved-conversation list, and the model picker."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from pardec_cli.tui.commands import COMMANDS
from pardec_cli.tui.conversation import ConversationSummary

KEYS = (
    ("Enter", "send the message"),
    ("Shift+Enter, Alt+Enter, Ctrl+J", "new line in the message"),
    ("Esc, Ctrl+C", "stop the reply being generated (the text so far stays)"),
    ("F1, ?", "this help"),
    ("F2", "show or hide the settings panel (method, knobs, profile, sampling)"),
    ("F3", "load another model"),
    ("F4", "copy the last reply to the clipboard (/copy N: an earlier one)"),
    ("Ctrl+O", "open a saved conversation"),
    ("Ctrl+N", "new conversation"),
    ("Ctrl+S", "save the transcript as Markdown, next to the saved chats (the path is shown)"),
    ("Ctrl+P", "command palette: switch method or profile, and every action above"),
    ("Ctrl+Q", "quit"),
)


HELP_FOOTER = """Under each reply, one line: the method (hover for its knobs), tokens per second (end to end), \
mean tokens per decoding step (1.00 is plain decoding; more means drafts were accepted), time to the first token, \
tokens generated, why the reply ended (eos, length, stop, cancelled, repetition: a loop was cut) and the sampling \
(greedy, or T temperature, p top-p, k top-k); the bars show tokens per step."""


def help_table(title: str, rows: Sequence[tuple[str, str]]) -> Table:
    """Two columns (key or command, what it does); the second wraps."""
    table = Table.grid(padding=(0, 2))
    table.title = title
    table.title_justify = "left"
    table.title_style = "bold"
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, what in rows:
        table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    """Keys and slash commands."""

    BINDINGS = [
        Binding("escape,f1,q,question_mark", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog", classes="dialog"):
            yield Static(help_table("Keys", KEYS), id="help-keys")
            yield Static(help_table("Commands (start a message with // to send a leading slash)",
                                    list(COMMANDS.values())), id="help-commands")
            yield Static(HELP_FOOTER, markup=False)
            yield Static("Esc closes", classes="hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class ConversationsScreen(ModalScreen[str | None]):
    """Pick a saved conversation to continue; returns its id (None: cancelled)."""

    BINDINGS = [
        Binding("escape", "cancel", "Close"),
        Binding("delete", "delete", "Delete"),
    ]

    def __init__(self, summaries: Sequence[ConversationSummary]) -> None:
        super().__init__()
        self.summaries = list(summaries)

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-dialog", classes="dialog"):
            yield Label("Saved conversations", classes="heading")
            if self.summaries:
                yield OptionList(*(self._option(s) for s in self.summaries), id="conversations")
                yield Static("Enter opens · Delete removes · Esc closes", classes="hint")
            else:
                yield Static("No saved conversations yet.", classes="hint")

    @staticmethod
    def _option(summary: ConversationSummary) -> Option:
        when = summary.updated.replace("T", " ")[:16]
        return Option(f"{when}  {summary.turns:3d} msgs  {summary.title or '(empty)'}", id=summary.id)

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_delete(self) -> None:
        options = self.query(OptionList)
        if not options:
            return
        option_list = options.first()
        index = option_list.highlighted
        if index is None:
            return
        option = option_list.get_option_at_index(index)
        self.app.delete_conversation(option.id)  # type: ignore[attr-defined]
        option_list.remove_option_at_index(index)


class ModelScreen(ModalScreen[str | None]):
    """Load a model by name: after a failed load (the error is shown) or from F3 / `/model`."""

    BINDINGS = [Binding("escape", "cancel", "Close")]

    def __init__(self, *, current: str | None, error: str | None, installed: Sequence[str]) -> None:
        super().__init__()
        self.current = current
        self.error = error
        self.installed = list(installed)

    def compose(self) -> ComposeResult:
        with Vertical(id="model-dialog", classes="dialog"):
            yield Label("Load a model", classes="heading")
            if self.error:
                yield Static(self.error, id="model-error", markup=False)
            yield Input(value=self.current or "", placeholder="alias, Hub id (org/name) or directory; empty: embedded",
                        id="model-name")
            if self.installed:
                yield Label("On this machine:")
                yield OptionList(*self.installed, id="installed")
            yield Static("Enter loads · Esc closes", classes="hint")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    @on(OptionList.OptionSelected)
    def _picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(str(event.option.prompt))

    def action_cancel(self) -> None:
        self.dismiss(None)
