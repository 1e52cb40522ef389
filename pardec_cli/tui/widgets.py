"""The chat's widgets: messages in the transcript, the input box, the status bar and
the settings panel. They draw what the app tells them; none of them generates text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message as TextualMessage
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Input, Label, LoadingIndicator, Select, Sparkline, Static, TextArea

from pardec_cli.tui.backend import LiveStats
from pardec_cli.tui.conversation import Message, describe_method, format_numbers, format_reply_line
from pardec_cli.tui.markdown import ReplyMarkdown
from pardec_cli.tui.settings import ChatSettings, profile_choices

SPARKLINE_STEPS = 120  # the sparkline shows the most recent steps...
SPARKLINE_WIDTH = 16  # ...in at most this many columns (the line beside it stays one line wide)


class StatsLine(Widget):
    """The numbers under a reply. Changing them repaints the line without a new layout
    (a layout pass over the transcript is the costliest part of a live update)."""

    text: reactive[str] = reactive("", layout=False)

    def __init__(self, text: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.set_reactive(StatsLine.text, text)

    def render(self) -> Content:
        return Content(self.text)  # plain: a method label such as pld[num_draft=8] is not markup


class UserMessage(Static):
    """What the user sent (shown as typed, no Markdown)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False, classes="message user")
        self.border_title = "you"


class Notice(Static):
    """A line from pardec itself in the transcript: an error, a hint, a confirmation."""

    def __init__(self, text: str, *, kind: str = "info") -> None:
        super().__init__(text, markup=False, classes=f"notice -{kind}")


class AssistantMessage(Vertical):
    """One reply: the Markdown body, then one compact line: the method, the numbers
    (tokens/s, tokens per step, TTFT, tokens, why it ended, the sampling) and a sparkline
    of tokens per decoding step. The method's knobs are in the line's tooltip (and in the
    F2 panel), not on the screen under every reply.

    While generating, text arrives through `append` and `show_live` updates the numbers;
    `finish` freezes them and highlights the reply's code (plain while streaming: see
    markdown.py). The app calls them in one batch per paced update, so that the screen is
    laid out and drawn once for the text and the numbers together.
    """

    def __init__(self, *, title: str, message: Message | None = None) -> None:
        # A reply without a message is being generated: it is drawn as one from the start
        # (while the prompt is prefilled), so that starting costs no extra layout.
        super().__init__(classes="message assistant" + (" -generating" if message is None else ""))
        self.border_title = title
        self._initial = message
        self._method: str | None = None  # shown with the first live update
        self._knobs: dict[str, Any] = {}
        self.per_step: list[int] = []
        self.text = message.content if message else ""

    def compose(self) -> ComposeResult:
        # A reply being generated streams (its code is highlighted when it ends).
        yield ReplyMarkdown(self._initial.content if self._initial else "", streaming=self._initial is None,
                            classes="body")
        with Horizontal(classes="reply-status"):
            yield StatsLine("" if self._initial else "prefill…", classes="stats")
            yield Sparkline([], classes="steps")

    def on_mount(self) -> None:
        if self._initial is not None:
            self._show_final(self._initial, self._initial.per_step)

    @property
    def body(self) -> ReplyMarkdown:
        return self.query_one(ReplyMarkdown)

    @property
    def stats_text(self) -> str:
        """The line under the reply as shown, then its tooltip (the method with its knobs)."""
        line = self.query_one(StatsLine)
        return f"{line.text} · {line.tooltip or ''}"

    def start(self, method: str, knobs: dict[str, Any]) -> None:
        """The generation began with this method: its name appears with the first text, in
        the same layout pass (a layout of the transcript is the costliest part of an update)."""
        self._method, self._knobs = method, dict(knobs)

    async def append(self, text: str) -> None:
        """Add text to the reply; returns once its Markdown blocks are updated."""
        if text:
            self.text += text
            await self.body.append(text)

    def show_live(self, stats: LiveStats, new_steps: Sequence[int]) -> None:
        """Update the numbers and the sparkline while generating."""
        line = self.query_one(StatsLine)
        if self._method is not None and not line.tooltip:
            line.tooltip = describe_method(self._method, self._knobs)
        self.per_step.extend(new_steps)
        numbers = format_numbers(stats.to_dict(), compact=True)
        line.text = f"{self._method} · {numbers}" if self._method else numbers
        self._show_steps(self.per_step)

    async def finish(self, message: Message, tail: str = "") -> None:
        """The reply ended (done, cut by -n, stopped, or cancelled): show its final stats."""
        await self.append(tail)
        await self.body.end_stream()
        self.remove_class("-generating")
        self._show_final(message, self.per_step)

    async def fail(self) -> None:
        """The generation failed before producing a reply: remove this message."""
        await self.remove()

    def _show_steps(self, per_step: list[int]) -> None:
        # One column per step until the bars fill their space (a few steps are not stretched).
        sparkline = self.query_one(Sparkline)
        sparkline.data = per_step[-SPARKLINE_STEPS:]
        width = min(len(per_step), SPARKLINE_WIDTH)
        if sparkline.styles.width is None or sparkline.styles.width.value != width:
            sparkline.styles.width = width  # a new layout only while the bars still grow
        if sparkline.display != bool(per_step):
            sparkline.display = bool(per_step)

    def _show_final(self, message: Message, per_step: list[int]) -> None:
        stats_line = self.query_one(StatsLine)
        stats_line.text = format_reply_line(message)
        stats_line.tooltip = describe_method(message.method or "?", message.knobs)
        stats_line.refresh(layout=True)  # the final line may wrap differently
        self._show_steps(per_step)
        if message.finish_reason == "cancelled":
            self.add_class("-cancelled")
            self.border_subtitle = "cancelled"


class Transcript(VerticalScroll):
    """The conversation, newest at the bottom; follows new text unless the user scrolls up."""

    def on_mount(self) -> None:
        self.anchor()


class ChatInput(TextArea):
    """The message box: Enter sends; Shift+Enter, Alt+Enter or Ctrl+J insert a newline."""

    NEWLINE_KEYS = ("shift+enter", "alt+enter", "ctrl+j")

    class Submitted(TextualMessage):
        """The user pressed Enter."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", compact=True, **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class StatusBar(Horizontal):
    """Model, method and sampling in effect, and what the app is doing (loading, generating)."""

    def compose(self) -> ComposeResult:
        yield LoadingIndicator(id="busy")
        yield Label("", id="status-text", markup=False)

    def show(self, text: str, *, busy: bool) -> None:
        # A worker's message can arrive while the app is closing and the bar's children
        # are already removed: then there is nothing left to show it on.
        for label in self.query("#status-text").results(Label):
            label.update(text)
        for indicator in self.query("#busy").results(LoadingIndicator):
            indicator.display = busy


class SettingsPanel(VerticalScroll):
    """Method, knobs, profile and sampling, editable while chatting (F2 shows and hides it).

    A change is sent to the app as `SettingsPanel.Changed` with the raw values; the app
    validates them and calls `show_error` when they are wrong.
    """

    class Changed(TextualMessage):
        """The user changed a setting: `field` is "method", "knobs", "profile" or a sampling key."""

        def __init__(self, field: str, value: Any) -> None:
            super().__init__()
            self.field = field
            self.value = value

    def __init__(self, methods: Sequence[str], settings: ChatSettings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._methods = list(methods)
        if settings.method not in self._methods:  # a `+` combination from the command line
            self._methods.append(settings.method)
        self._initial = settings

    def compose(self) -> ComposeResult:
        yield Label("Method", classes="heading")
        yield Select([(m, m) for m in self._methods], value=self._initial.method, allow_blank=False, compact=True, id="method")
        yield Label("Knobs (KEY=VALUE ...)")
        yield Input(compact=True, id="knobs", placeholder="defaults")
        yield Label("Profile", classes="heading")
        yield Select([(p, p) for p in profile_choices()], value=self._initial.profile, allow_blank=False, compact=True, id="profile")
        yield Label("Sampling", classes="heading")
        yield Label("temperature (0: greedy)")
        yield Input(compact=True, id="temperature", type="number", placeholder="profile's")
        yield Label("top-p")
        yield Input(compact=True, id="top_p", type="number", placeholder="profile's")
        yield Label("top-k (0: all)")
        yield Input(compact=True, id="top_k", type="integer", placeholder="profile's")
        yield Label("seed (empty: random)")
        yield Input(compact=True, id="seed", type="integer")
        yield Label("max new tokens")
        yield Input(compact=True, id="max_tokens", type="integer", placeholder="profile's")
        yield Static("", id="settings-error", markup=False)
        yield Static("Enter applies a field; changes apply to the next reply.", classes="hint")

    def show_settings(self, settings: ChatSettings) -> None:
        """Fill the fields from `settings` (without sending Changed messages)."""
        with self.prevent(Select.Changed, Input.Changed):
            method = self.query_one("#method", Select)
            if settings.method not in self._methods:  # a `+` combination from the command line
                self._methods.append(settings.method)
                method.set_options([(m, m) for m in self._methods])
            method.value = settings.method
            self.query_one("#knobs", Input).value = " ".join(f"{k}={v}" for k, v in settings.options.items())
            self.query_one("#profile", Select).value = settings.profile
            # Empty: the profile decides (its placeholder says so).
            for key in ("temperature", "top_p", "top_k", "seed", "max_tokens"):
                value = getattr(settings, key)
                self.query_one(f"#{key}", Input).value = "" if value is None else f"{value:g}"
        self.show_error(None)

    def show_error(self, text: str | None) -> None:
        error = self.query_one("#settings-error", Static)
        error.update(text or "")
        error.display = bool(text)

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id == "method":
            # A new method starts from its default knobs.
            self.query_one("#knobs", Input).value = ""
        self.post_message(self.Changed(event.select.id or "", event.value))

    @on(Input.Submitted)
    def _input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Changed(event.input.id or "", event.value))
