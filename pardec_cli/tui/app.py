"""`pardec chat`: a Textual app over a `Session`, showing what parallel decoding does.

Threads: the UI runs on the main thread and never decodes. Two kinds of thread worker
touch the model, one at a time (`_session_lock`):

- `_load_model` loads a `Session` (this is where torch is first imported);
- `_generate` runs one reply: it iterates the session's `TextStream` and posts
  `ReplyProgress` messages as often as the `UpdatePacer` allows (pacing.py: the UI
  keeps a small share of the time, so drawing does not slow decoding), batching the
  text and the per-step counts of the steps in between, then one `ReplyDone`.
  Cancelling sets `_cancel`; the worker sees it after the current step and calls
  `stream.finish()`.

The app holds the conversation (`Conversation`, saved after every reply unless saving is
off) and the `ChatSettings`. Replies come from a backend (backend.py): a model loaded
here, planned per reply by `pardec_cli.planning` as `pardec gen` plans a prompt, or a
running `pardec serve` (`pardec chat --server URL`).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message as TextualMessage
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer, Header

from pardec_cli.errors import CacheRollbackError, ContextOverflowError, PardecError, PardecUsageError
from pardec_cli.tui.commands import SlashCommand, parse_input
from pardec_cli.tui.conversation import (
    Conversation,
    ConversationStore,
    Message,
    describe_method,
    markdown_path,
    write_markdown,
)
from pardec_cli.tui.pacing import UpdatePacer
from pardec_cli.tui.screens import ConversationsScreen, HelpScreen, ModelScreen
from pardec_cli.tui.backend import as_backend
from pardec_cli.tui.settings import AUTO, ChatSettings, parse_method_words, profile_choices
from pardec_cli.tui.widgets import (
    AssistantMessage,
    ChatInput,
    LiveStats,
    Notice,
    SettingsPanel,
    StatusBar,
    Transcript,
    UserMessage,
)

SessionLoader = Callable[[str | None], Any]  # model spec (None: the default model) -> Session or backend


# -- messages from the worker threads ---------------------------------------------------


@dataclass
class ModelLoaded(TextualMessage):
    spec: str | None
    session: Any
    backend: Any


@dataclass
class ModelFailed(TextualMessage):
    spec: str | None
    error: str


@dataclass
class MethodApplied(TextualMessage):
    settings: ChatSettings


@dataclass
class MethodFailed(TextualMessage):
    settings: ChatSettings  # the settings that failed
    error: str


@dataclass
class ReplyStarted(TextualMessage):
    reply: AssistantMessage
    method: str
    knobs: dict[str, Any]


@dataclass
class ReplyProgress(TextualMessage):
    reply: AssistantMessage
    text: str  # new text since the last update
    steps: list[int]  # tokens emitted by each decoding step since the last update
    stats: LiveStats


@dataclass
class ReplyDone(TextualMessage):
    reply: AssistantMessage
    text: str
    steps: list[int]
    message: Message


@dataclass
class ReplyFailed(TextualMessage):
    reply: AssistantMessage
    error: str
    overflow: bool = False


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, CacheRollbackError) and exc.hint is None:
        # The engine names no remedy in a front end's terms: the chat's is a command.
        return exc.message + "\nhint: decode without drafting: /method vanilla"
    if isinstance(exc, PardecError):
        return exc.message + (f"\nhint: {exc.hint}" if exc.hint else "")
    return f"unexpected error: {type(exc).__name__}: {exc}"


def settle_heap() -> None:
    """Collect garbage now, then keep every object alive at this point out of later collections.

    Once a model is loaded the heap holds millions of long-lived objects (torch,
    transformers, the model's modules, the tokenizer, the widgets). The UI allocates as it
    draws, and every so often that triggers a full collection, which walks all of them:
    348 ms on the UI thread a second into a reply, measured, while the decoding thread
    waited for the interpreter (gen, which draws nothing, never collects while decoding).
    Frozen objects (`gc.freeze`) are skipped by collections. Unfreezing first lets the
    collection free a model that was just replaced.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def installed_model_names() -> list[str]:
    """Models on this machine by name (store and pulled), for the model picker."""
    try:
        from pardec_cli.store.layout import installed_models
        from pardec_cli.store.records import all_records

        names = list(installed_models())
        names += [r.name for r in all_records() if r.name not in names]
        return names
    except Exception:  # an unreadable store must not break the picker
        return []


@dataclass
class ChatOptions:
    """What `pardec chat` starts the app with."""

    settings: ChatSettings
    model: str | None = None  # as given to -m (None: the embedded model)
    system: str | None = None
    conversation: Conversation | None = None  # --continue
    save: bool = True  # keep conversations under the pardec home
    show_history: bool = False  # open on the conversation list
    store: ConversationStore = field(default_factory=ConversationStore)
    first_message: str | None = None  # `pardec chat "first message"`: sent once the model is loaded


class ChatApp(App[None]):
    """Chat with a local model and watch its decoding method at work."""

    CSS_PATH = "chat.tcss"
    TITLE = "pardec chat"
    BINDINGS = [
        # Not in the footer: the status bar says "Esc stops" while a reply generates. A
        # footer that changed with the generation would be rebuilt (its widgets mounted
        # again) just as decoding starts, competing with it for the CPU.
        Binding("escape", "cancel", "Stop", show=False, priority=True),
        Binding("ctrl+c", "cancel", "Stop", show=False, priority=True),
        Binding("f1", "help", "Help"),
        Binding("question_mark", "help", "Help", show=False),
        Binding("f2", "toggle_settings", "Settings"),
        Binding("f3", "pick_model", "Model"),
        Binding("ctrl+o", "open_conversation", "Open"),
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("ctrl+s", "save_transcript", "Save .md"),
        Binding("f4", "copy_reply", "Copy reply"),  # not Ctrl+Y: the message box redoes with it
    ]

    def __init__(self, options: ChatOptions, load_session: SessionLoader) -> None:
        super().__init__()
        self.settings = options.settings
        self.model_spec = options.model
        self.store = options.store if options.save else None
        self.conversation = options.conversation or Conversation(model=options.model, system=options.system)
        if options.system is not None:
            self.conversation.system = options.system
        self.show_history_first = options.show_history
        self._load_session = load_session
        self.session: Any = None  # what the loader returned (a Session, or a server's backend)
        self.backend: Any = None  # where replies come from (tui/backend.py)
        self.pending_message = options.first_message
        self.loading = False
        self.generating = False
        self._cancel = threading.Event()
        self._session_lock = threading.Lock()
        self._pacer = UpdatePacer()

    # -- layout ---------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        from pardec_cli.methods.registry import method_names

        yield Header()
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield Transcript(id="transcript")
                yield ChatInput(id="prompt", placeholder="Message · Enter sends · Shift+Enter or Ctrl+J: new line · F1: help")
            yield SettingsPanel([AUTO, *method_names()], self.settings, id="settings")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one(SettingsPanel).show_settings(self.settings)
        self.query_one(SettingsPanel).display = False
        await self._show_conversation()
        self.query_one(ChatInput).focus()
        self.load_model(self.model_spec or self.conversation.model)
        if self.show_history_first:
            self.action_open_conversation()

    def _set_generating(self, generating: bool) -> None:
        self.generating = generating
        # A blinking cursor redraws the input box twice a second; while a reply streams
        # that drawing competes with the decoding thread for the CPU and the interpreter
        # (0.8% of a core, measured), so the cursor holds still.
        self.query_one(ChatInput).cursor_blink = not generating
        self._refresh_status()

    def _refresh_status(self) -> None:
        s = self.settings
        method = describe_method(s.method, dict(s.options))
        if self.backend is not None:
            model = f"{self.backend.model_name} ({self.backend.where})"
        else:
            model = self.model_spec or "embedded model"
        parts = [model, method, f"profile {s.profile}", s.describe_sampling()]
        if self.store is None:
            parts.append("not saved")
        if self.loading:
            text, busy = f"loading {self.model_spec or 'the embedded model'}… · " + " · ".join(parts[1:]), True
        elif self.generating:
            # No animation while generating: a UI thread that keeps drawing holds the GIL
            # and slows the decoding thread (measured: a busy UI thread cut tokens/s 3x).
            text, busy = "● generating (Esc stops) · " + " · ".join(parts), False
        elif self.session is None:
            text, busy = "no model loaded: F3 picks one · " + " · ".join(parts[1:]), False
        else:
            text, busy = " · ".join(parts), False
        bars = self.query(StatusBar)
        if bars:  # none while the app closes (a load that fails as it quits reports late)
            bars.first().show(text, busy=busy)
        self.sub_title = self.session.model_name if self.session is not None else ""

    # -- the model --------------------------------------------------------------------

    def load_model(self, spec: str | None) -> None:
        """Load `spec` in a worker; the window stays responsive (messages can be typed meanwhile)."""
        self.model_spec = spec
        self.loading = True
        self._refresh_status()
        self._load_model(spec)

    @work(thread=True, exclusive=True, group="model")
    def _load_model(self, spec: str | None) -> None:
        with self._session_lock:
            try:
                session = self._load_session(spec)
                backend = as_backend(session)
                backend.apply(self.settings)  # builds a named method now: a bad knob shows at once
            except BaseException as exc:  # noqa: BLE001 - shown in the UI, never a traceback
                self.post_message(ModelFailed(spec, _error_text(exc)))
                return
        self.post_message(ModelLoaded(spec, session, backend))

    async def on_model_loaded(self, message: ModelLoaded) -> None:
        self.session, self.backend = message.session, message.backend  # a model loaded before is dropped here...
        settle_heap()  # ...and collected here
        self.loading = False
        self.conversation.model = message.backend.model_name
        self._refresh_status()
        if self.pending_message and not self.generating:
            text, self.pending_message = self.pending_message, None
            await self.send(text)

    def on_model_failed(self, message: ModelFailed) -> None:
        self.loading = False
        if self.session is not None:  # a switch failed: the model already loaded stays in use
            self.model_spec = self.session.model_name
        if not self.query(StatusBar):  # the app is closing: nobody to tell
            return
        self._refresh_status()
        name = message.spec or "the embedded model"
        self.push_screen(
            ModelScreen(current=message.spec, error=f"Could not load {name}:\n{message.error}",
                        installed=installed_model_names()),
            self._model_picked,
        )

    def _model_picked(self, spec: str | None) -> None:
        if spec is not None:
            self.load_model(spec or None)

    def action_pick_model(self) -> None:
        if self._busy("load another model"):
            return
        self.push_screen(ModelScreen(current=self.model_spec, error=None, installed=installed_model_names()),
                         self._model_picked)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information", timeout: float | None = None,
               markup: bool = False) -> None:  # fmt: skip
        """A notification, as plain text by default: they quote what was typed or named (a
        system prompt, a method label such as pld[num_draft=8], a path), which Textual's markup
        would drop or fail on."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    # -- sending and generating -------------------------------------------------------

    @on(ChatInput.Submitted)
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        try:
            parsed = parse_input(event.text)
        except PardecError as exc:
            self.notify(exc.message, severity="error")
            return
        if parsed is None:  # blank: nothing to do
            return
        if isinstance(parsed, SlashCommand):
            if await self.run_command(parsed):
                self.query_one(ChatInput).clear()
            return
        if self.generating:
            self.notify("A reply is still being generated: Esc stops it.", severity="warning")
            return
        if self.backend is None:
            self.notify("The model is still loading." if self.loading else "No model is loaded: F3 picks one.",
                        severity="warning")
            return
        self.query_one(ChatInput).clear()
        await self.send(parsed)

    async def send(self, text: str) -> None:
        """Add the user's message and start generating the reply."""
        self.conversation.messages.append(Message("user", text))
        transcript = self.query_one(Transcript)
        reply = AssistantMessage(title=self.backend.model_name)
        await transcript.mount_all([UserMessage(text), reply])
        transcript.anchor()
        self._cancel.clear()
        self._pacer.reset()
        self._set_generating(True)
        # Start decoding once the new messages are drawn, so that layout work does not
        # compete with the prefill for the interpreter.
        self.call_after_refresh(self._generate, reply, self.conversation.chat_messages(), self.conversation.system,
                                self.settings)

    @work(thread=True, exclusive=True, group="reply")
    def _generate(self, reply: AssistantMessage, messages: list[dict[str, str]], system: str | None,
                  settings: ChatSettings) -> None:
        backend, cancel, pacer = self.backend, self._cancel, self._pacer
        with self._session_lock:
            try:
                run = backend.start(messages, system, settings)  # planned by pardec_cli.planning
                self.post_message(ReplyStarted(reply, run.method, run.knobs))
                text: list[str] = []
                steps: list[int] = []
                for piece in run:
                    text.append(piece.text)
                    steps.extend(piece.steps)
                    if cancel.is_set():
                        break
                    if piece.stats is not None and pacer.may_send(monotonic()):
                        pacer.sent()
                        self.post_message(ReplyProgress(reply, "".join(text), steps, piece.stats))
                        text, steps = [], []
                done = run.finish()  # cancelled if the loop was left early
                text.append(run.tail)
            except BaseException as exc:  # noqa: BLE001 - shown in the UI, never a traceback
                self.post_message(ReplyFailed(reply, _error_text(exc), overflow=isinstance(exc, ContextOverflowError)))
                return
        self.post_message(ReplyDone(reply, "".join(text), steps, done))

    def on_reply_started(self, message: ReplyStarted) -> None:
        message.reply.start(message.method, message.knobs)

    async def on_reply_progress(self, message: ReplyProgress) -> None:
        with self.batch_update():  # one layout and one frame for the text and the numbers
            await message.reply.append(message.text)
            message.reply.show_live(message.stats, message.steps)
        self._pacer.taken()

    async def on_reply_done(self, message: ReplyDone) -> None:
        message.reply.per_step.extend(message.steps)
        message.message.per_step = list(message.reply.per_step)
        await message.reply.finish(message.message, message.text)
        self.conversation.messages.append(message.message)
        self._set_generating(False)
        self._save_conversation()

    async def on_reply_failed(self, message: ReplyFailed) -> None:
        await message.reply.fail()
        # The message that got no reply leaves the history and goes back to the input box.
        transcript = self.query_one(Transcript)
        user = self.conversation.messages.pop() if self.conversation.messages else None
        user_widgets = transcript.query(UserMessage)
        if user_widgets:
            await user_widgets.last().remove()
        prompt = self.query_one(ChatInput)
        if user is not None and not prompt.text:
            prompt.load_text(user.content)
        text = message.error
        if message.overflow:
            text += "\nThe conversation no longer fits the model's context: /clear starts a new one (this one stays saved)."
        await transcript.mount(Notice(text, kind="error"))
        self._set_generating(False)

    def action_cancel(self) -> None:
        """Stop the reply after the current decoding step (Esc, Ctrl+C)."""
        self._cancel.set()
        self.notify("Stopping after this step…", timeout=2)

    def exit(self, *args: Any, **kwargs: Any) -> None:
        # A reply being generated stops after its current step; otherwise the process
        # would wait for its worker thread after the screen has closed.
        self._cancel.set()
        super().exit(*args, **kwargs)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            # Only while a reply is generating and no dialog is open; otherwise Esc and
            # Ctrl+C keep their usual meaning (close, copy).
            return self.generating and not self._cancel.is_set() and len(self.screen_stack) == 1
        return True

    def _busy(self, what: str) -> bool:
        if self.generating:
            self.notify(f"Cannot {what} while a reply is generating: Esc stops it.", severity="warning")
        return self.generating

    # -- slash commands ---------------------------------------------------------------

    async def run_command(self, command: SlashCommand) -> bool:
        """Carry out a slash command; False (and a notification) when it cannot be done."""
        try:
            return await self._run_command(command)
        except PardecError as exc:
            self.notify(exc.message + (f"\n{exc.hint}" if exc.hint else ""), severity="error")
            return False

    async def _run_command(self, command: SlashCommand) -> bool:
        name, argument = command.name, command.argument
        if name == "clear":
            return await self.new_conversation()
        if name == "system":
            if self._busy("change the system prompt"):
                return False
            self.conversation.system = argument or None
            self.notify(f"System prompt: {argument}" if argument else "System prompt: the model's default")
            return True
        if name == "method" and not argument:
            from pardec_cli.methods.registry import method_names

            self.notify("Methods: " + ", ".join([AUTO, *method_names()]) + "\n/method NAME [KNOB=VALUE ...]")
            return True
        if name in ("method", "set", "profile"):
            self.change_settings(self.settings.apply_command(name, argument))
            return True
        if name == "copy":
            return self.copy_reply(argument)
        if name == "rename":
            return self.rename(argument)
        if name == "model":
            if self._busy("load another model"):
                return False
            self.load_model(argument or None)
            return True
        if name == "save":
            return self.save_transcript(argument)
        if name == "history":
            self.action_open_conversation()
            return True
        if name == "help":
            self.action_help()
            return True
        if name == "quit":
            self.exit()
            return True
        raise AssertionError(f"unhandled command {name}")  # parse_input knows only COMMANDS

    # -- settings ---------------------------------------------------------------------

    def change_settings(self, settings: ChatSettings) -> None:
        """Use `settings` from the next reply on; a new method is built now to check it."""
        previous, self.settings = self.settings, settings
        self.query_one(SettingsPanel).show_settings(settings)
        self._refresh_status()
        method_changed = (settings.method, dict(settings.options)) != (previous.method, dict(previous.options))
        if method_changed and self.backend is not None and not self.generating:
            self._apply_method(settings, previous, self.conversation.chat_messages())
        elif method_changed:
            self.notify(f"Method {describe_method(settings.method, dict(settings.options))} from the next reply")

    @work(thread=True, group="method")
    def _apply_method(self, settings: ChatSettings, previous: ChatSettings, messages: list[dict[str, str]]) -> None:
        # Building the proposer now reports a bad knob value or a missing draft model at
        # once, not on the next message.
        with self._session_lock:
            try:
                self.backend.apply(settings)
            except BaseException as exc:  # noqa: BLE001 - shown in the UI
                self.post_message(MethodFailed(previous, _error_text(exc)))
                return
        self.post_message(MethodApplied(settings))

    def on_method_applied(self, message: MethodApplied) -> None:
        self.notify(f"Method: {describe_method(message.settings.method, dict(message.settings.options))}", timeout=3)

    def on_method_failed(self, message: MethodFailed) -> None:
        self.notify(message.error, severity="error")
        self.query_one(SettingsPanel).show_error(message.error)
        self.settings = message.settings
        self.query_one(SettingsPanel).show_settings(message.settings)
        self.query_one(SettingsPanel).show_error(message.error)
        self._refresh_status()

    @on(SettingsPanel.Changed)
    def _panel_changed(self, event: SettingsPanel.Changed) -> None:
        panel = self.query_one(SettingsPanel)
        try:
            if event.field == "method" and event.value == self.settings.method:
                return
            if event.field == "method":
                settings = self.settings.with_method(str(event.value), {})
            elif event.field == "knobs":
                settings = self.settings.with_method(*parse_method_words([self.settings.method, *str(event.value).split()]))
            else:
                settings = self.settings.with_values({event.field: event.value})
        except PardecError as exc:
            panel.show_error(exc.message)
            return
        self.change_settings(settings)

    def action_toggle_settings(self) -> None:
        panel = self.query_one(SettingsPanel)
        panel.display = not panel.display
        if panel.display:
            panel.query_one("#method").focus()
        else:
            self.query_one(ChatInput).focus()

    # -- conversations ----------------------------------------------------------------

    async def _show_conversation(self) -> None:
        """Replace the transcript with the current conversation's messages."""
        transcript = self.query_one(Transcript)
        await transcript.remove_children()
        widgets = []
        if self.conversation.system:
            widgets.append(Notice(f"System prompt: {self.conversation.system}"))
        for message in self.conversation.messages:
            if message.role == "user":
                widgets.append(UserMessage(message.content))
            else:
                widgets.append(AssistantMessage(title=self.conversation.model or "model", message=message))
        if widgets:
            await transcript.mount_all(widgets)
        transcript.anchor()

    def _save_conversation(self) -> None:
        if self.store is None:
            return
        try:
            self.store.save(self.conversation)
        except (OSError, PardecError) as exc:
            self.notify(f"Could not save the conversation: {exc}", severity="error")

    async def new_conversation(self) -> bool:
        """Start afresh (the finished conversation stays saved); the system prompt carries over."""
        if self._busy("start a new conversation"):
            return False
        self.conversation = Conversation(model=self.conversation.model, system=self.conversation.system)
        await self._show_conversation()
        self.notify("New conversation")
        return True

    async def action_new_conversation(self) -> None:
        await self.new_conversation()

    def action_open_conversation(self) -> None:
        if self.store is None:
            self.notify("Saving is off (--no-save): there are no saved conversations to open.", severity="warning")
            return
        if self._busy("open another conversation"):
            return
        self.push_screen(ConversationsScreen(self.store.list()), self._conversation_picked)

    async def _conversation_picked(self, conversation_id: str | None) -> None:
        if conversation_id is None or self.store is None:
            return
        try:
            conversation = self.store.load(conversation_id)
        except PardecError as exc:
            self.notify(exc.message, severity="error")
            return
        self.conversation = conversation
        await self._show_conversation()
        if self.backend is not None and conversation.model and conversation.model != self.backend.model_name:
            self.notify(f"This conversation was held with {conversation.model}: /model {conversation.model} loads it.")

    def delete_conversation(self, conversation_id: str) -> None:
        if self.store is not None:
            self.store.delete(conversation_id)

    def save_transcript(self, filename: str = "") -> bool:
        """Write the conversation as Markdown (`/save FILE`, Ctrl+S: in pardec's chats folder)."""
        if not self.conversation.messages:
            self.notify("Nothing to save yet.", severity="warning")
            return False
        try:
            path = write_markdown(self.conversation, markdown_path(self.conversation, filename))
        except PardecError as exc:
            self.notify(exc.message, severity="error")
            return False
        self.notify(f"Saved the transcript to {path}")
        return True

    def action_save_transcript(self) -> None:
        self.save_transcript()

    def copy_reply(self, which: str = "") -> bool:
        """Put a reply on the clipboard (`/copy [N]`: the last one, or the N-th from the end).

        Through the terminal (OSC 52, Textual's `copy_to_clipboard`): it works over SSH
        too, where the terminal allows it."""
        try:
            text = self.conversation.reply_to_copy(which)
        except PardecUsageError as exc:
            self.notify(f"{exc.message[0].upper()}{exc.message[1:]}.", severity="warning")
            return False
        self.copy_to_clipboard(text)
        self.notify(f"Copied the reply ({len(text)} characters)")
        return True

    def action_copy_reply(self) -> None:
        self.copy_reply()

    def rename(self, name: str) -> bool:
        """`/rename NAME`: the conversation's name in the list (empty: its first message)."""
        self.conversation.name = name.strip() or None
        self._save_conversation()
        self.notify(f"Renamed: {self.conversation.title or '(untitled)'}")
        return True

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    # -- command palette --------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        from pardec_cli.methods.registry import METHODS

        yield from super().get_system_commands(screen)
        yield SystemCommand("Method: auto", "chosen per reply for its task and this machine",
                            lambda: self._palette_method(AUTO))
        for name, spec in METHODS.items():
            yield SystemCommand(f"Method: {name}", spec.summary, lambda n=name: self._palette_method(n))
        for profile in profile_choices():
            yield SystemCommand(f"Profile: {profile}", "task profile for the next replies",
                                lambda p=profile: self._palette_settings({"profile": p}), discover=False)
        yield SystemCommand("Greedy decoding", "temperature 0", lambda: self._palette_settings({"temp": "0"}))
        yield SystemCommand("Sampling (temperature 0.7, top-p 0.9)", "sample instead of greedy decoding",
                            lambda: self._palette_settings({"temp": "0.7", "top_p": "0.9"}))
        yield SystemCommand("Sampling as the profile says", "the profile's (and the model's recommended) values",
                            lambda: self._palette_settings({"temp": "default", "top_p": "default", "top_k": "default"}))
        yield SystemCommand("Settings panel", "method, knobs, profile and sampling (F2)", self.action_toggle_settings)
        yield SystemCommand("Load another model", "F3", self.action_pick_model)
        yield SystemCommand("New conversation", "/clear (Ctrl+N)", self.action_new_conversation)
        yield SystemCommand("Open a saved conversation", "Ctrl+O", self.action_open_conversation)
        yield SystemCommand("Save transcript", "as Markdown in pardec's chats folder (Ctrl+S)", self.action_save_transcript)
        yield SystemCommand("Copy the last reply", "to the clipboard (F4)", self.action_copy_reply)
        yield SystemCommand("Keys and commands", "F1", self.action_help)

    def _palette_method(self, name: str) -> None:
        try:
            self.change_settings(self.settings.with_method(name, {}))
        except PardecError as exc:
            self.notify(exc.message, severity="error")

    def _palette_settings(self, values: dict[str, str]) -> None:
        try:
            self.change_settings(self.settings.with_values(values))
        except PardecError as exc:
            self.notify(exc.message, severity="error")
