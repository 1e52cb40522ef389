"""`pardec chat` through Textual's Pilot, on a scripted session (tests/tui_fakes.py):
what a user types, what they see, what is saved. Each test takes well under a second.
"""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path
from time import monotonic
from typing import Any

import pytest
from textual.content import Content

from pardec_cli.errors import ModelNotFoundError
from pardec_cli.tui.app import ChatApp, ChatOptions
from pardec_cli.tui.conversation import Conversation, ConversationStore, Message
from pardec_cli.tui.markdown import ReplyFence
from pardec_cli.tui.screens import ConversationsScreen, HelpScreen, ModelScreen
from pardec_cli.tui.settings import ChatSettings
from pardec_cli.tui.widgets import AssistantMessage, ChatInput, Notice, SettingsPanel, UserMessage
from tests.tui_fakes import ScriptedSession

SIZE = (100, 36)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Textual runs on asyncio


def make_app(session: ScriptedSession | None = None, *, store: ConversationStore | None = None,
             loader: Any = None, **options: Any) -> ChatApp:
    session = session or ScriptedSession()
    settings = options.pop("settings", ChatSettings(method="pld"))
    chat_options = ChatOptions(settings=settings, store=store or ConversationStore(), **options)
    return ChatApp(chat_options, loader or (lambda spec: session))


async def wait_until(pilot: Any, condition: Any, timeout: float = 5.0) -> None:
    deadline = monotonic() + timeout
    while not condition():
        assert monotonic() < deadline, "condition not reached"
        await pilot.pause(0.01)


async def ready(pilot: Any) -> None:
    await wait_until(pilot, lambda: pilot.app.session is not None)


async def say(pilot: Any, text: str) -> None:
    """Type `text` into the message box and press Enter."""
    prompt = pilot.app.query_one(ChatInput)
    prompt.load_text(text)
    await pilot.press("enter")


async def say_until_held(pilot: Any, session: ScriptedSession, text: str) -> None:
    """Send `text` and wait until the reply's stream holds (`ScriptedSession(hold_after=N)`)."""
    await say(pilot, text)
    await wait_until(pilot, session.held.is_set)


async def release_and_finish(pilot: Any, session: ScriptedSession) -> None:
    """Let the held stream go on and wait until the reply ends."""
    session.release.set()
    await wait_until(pilot, lambda: not pilot.app.generating)


async def say_and_wait(pilot: Any, text: str) -> None:
    await say(pilot, text)
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await wait_until(pilot, lambda: not pilot.app.generating)


def replies(app: ChatApp) -> list[AssistantMessage]:
    return list(app.query(AssistantMessage))


def stats_line(reply: AssistantMessage) -> str:
    return reply.stats_text


# -- sending and streaming ----------------------------------------------------------------


async def test_a_message_streams_a_reply_with_its_stats_and_is_saved(tmp_path: Path) -> None:
    session = ScriptedSession(["Sure: **prime** numbers."])
    store = ConversationStore(tmp_path / "chats")
    app = make_app(session, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "Tell me about primes")
        assert [str(w.render()) for w in app.query(UserMessage)] == ["Tell me about primes"]
        [reply] = replies(app)
        assert reply.text == "Sure: **prime** numbers."
        assert reply.body.source == "Sure: **prime** numbers."
        line = stats_line(reply)
        # method and knobs, tokens/s, mean tokens per step, TTFT, tokens, finish reason
        for fragment in ("pld max_ngram=3", "tok/s", "tok/step", "TTFT 100 ms", "25 tok", "eos"):
            assert fragment in line
        assert reply.per_step, "the sparkline has one bar per decoding step"
        assert app.query_one(ChatInput).text == ""
    assert session.encoded == [([{"role": "user", "content": "Tell me about primes"}], None)]
    [saved] = store.list()
    conversation = store.load(saved.id)
    assert [m.role for m in conversation.messages] == ["user", "assistant"]
    assert conversation.messages[1].stats["generated_tokens"] == 25
    assert conversation.messages[1].method == "pld"


async def test_turns_go_back_to_the_model_as_history_with_the_system_prompt() -> None:
    session = ScriptedSession(["First answer.", "Second answer."])
    app = make_app(session, system="Be brief.")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "one")
        await say_and_wait(pilot, "two")
    messages, system = session.encoded[-1]
    assert system == "Be brief."
    assert messages == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "two"},
    ]


async def test_a_blank_message_is_ignored() -> None:
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "  \n  ")
        await pilot.pause()
        assert not app.query(UserMessage) and not app.generating
    assert session.encoded == []


async def test_sampling_and_limits_reach_the_stream() -> None:
    session = ScriptedSession()
    settings = ChatSettings(method="pld", max_tokens=7, temperature=0.7, top_p=0.9, seed=3, stop=("END",))
    app = make_app(session, settings=settings)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "hi")
        [reply] = replies(app)
        assert reply.text == "Hello! "
        assert "length" in stats_line(reply)
    [stream] = session.streams
    assert stream["max_new_tokens"] == 7 and stream["stop"] == ("END",)
    assert (stream["sampling"].temperature, stream["sampling"].top_p, stream["sampling"].seed) == (0.7, 0.9, 3)


async def test_a_reply_shows_prefill_until_its_first_text_arrives_with_the_method() -> None:
    # The method line waits for the first text, so that both take one layout of the screen.
    session = ScriptedSession(["one two three"], hold_after=0)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_until_held(pilot, session, "count")
        await pilot.pause()
        [reply] = replies(app)
        assert reply.has_class("-generating")
        assert stats_line(reply) == "prefill… · "
        await release_and_finish(pilot, session)
        assert "pld max_ngram=3" in stats_line(reply)


async def test_while_a_reply_streams_its_text_numbers_and_method_show_together() -> None:
    session = ScriptedSession(["one two three four five"], hold_after=3)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_until_held(pilot, session, "count")
        [reply] = replies(app)
        await wait_until(pilot, lambda: reply.text != "")  # the first update: the prefill's token
        assert reply.body.source == reply.text
        line = stats_line(reply)
        assert "tok/s" in line and "pld max_ngram=3" in line
        await release_and_finish(pilot, session)
        assert reply.text == "one two three four five"


async def test_the_cursor_holds_still_while_a_reply_streams() -> None:
    # A blinking cursor redraws the screen twice a second, competing with the decoder.
    session = ScriptedSession(["a reply"], hold_after=2)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        prompt = app.query_one(ChatInput)
        assert prompt.cursor_blink
        await say_until_held(pilot, session, "go")
        assert not prompt.cursor_blink
        await release_and_finish(pilot, session)
        assert prompt.cursor_blink


async def test_code_in_a_reply_is_highlighted_once_the_reply_ends() -> None:
    session = ScriptedSession(["Like this:\n\n```python\nx = 1\n```\n"])
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "code please")
        [fence] = replies(app)[0].query(ReplyFence)
        assert fence.lexer == "python"
        assert fence.code == "x = 1"


# -- cancelling ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["escape", "ctrl+c"])
async def test_cancel_stops_after_the_current_step_and_keeps_the_partial_reply(key: str) -> None:
    session = ScriptedSession(["one two three four five six seven"], hold_after=3)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_until_held(pilot, session, "count")
        await pilot.press(key)
        await release_and_finish(pilot, session)
        [reply] = replies(app)
        # Steps 0-2 were out ("one t": 1 + 1 + 3 tokens); the step running at the press finished ("wo").
        assert reply.text == "one two"
        assert reply.has_class("-cancelled")
        assert "cancelled" in stats_line(reply)
        assert app.is_running, "cancelling stops the reply, not the app"
        assert app.conversation.messages[-1].finish_reason == "cancelled"
        assert app.conversation.messages[-1].content == "one two"
        # The chat goes on: the partial reply is part of the history.
        session.hold_after = None
        await say_and_wait(pilot, "again")
    assert session.encoded[-1][0][1] == {"role": "assistant", "content": "one two"}


async def test_quitting_while_generating_stops_the_reply() -> None:
    session = ScriptedSession(["a long reply"], hold_after=2)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_until_held(pilot, session, "go")
        await pilot.press("ctrl+q")
        assert app._cancel.is_set(), "the worker stops after this step instead of keeping the process alive"
        session.release.set()


async def test_escape_when_idle_does_not_cancel_anything() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("escape")
        assert not app._cancel.is_set()


# -- switching method, profile and sampling -------------------------------------------------


async def test_method_command_switches_the_method_for_the_next_reply() -> None:
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/method lookahead window=4")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert session.method_calls[-1] == ("lookahead", {"window": "4"})
        assert app.settings.method == "lookahead"
        assert "lookahead window=4" in str(app.query_one("#status-text").render())
        await say_and_wait(pilot, "hi")
        assert "· lookahead window=4 ngram=4" in stats_line(replies(app)[0])
    assert session.streams[-1]["method"] == "lookahead"


async def test_a_bad_method_or_knob_is_refused_and_the_old_method_stays() -> None:
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for bad in ("/method nope", "/method pld nope=1", "/method pld num_draft=many"):
            await say(pilot, bad)
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.settings.method == "pld" and dict(app.settings.options) == {}, bad
            assert app.query_one(ChatInput).text == bad, "the command stays in the box to be fixed"
        messages = [n.message for n in app._notifications]
        assert any("unknown method 'nope'" in m for m in messages)
        assert any("has no option 'nope'" in m for m in messages)
        assert any("expects int" in m for m in messages)


async def test_settings_panel_switches_method_knobs_and_sampling() -> None:
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        panel = app.query_one(SettingsPanel)
        assert panel.display
        panel.query_one("#method").value = "jacobi"
        await pilot.pause()
        await app.workers.wait_for_complete()
        assert app.settings.method == "jacobi"
        knobs = panel.query_one("#knobs")
        knobs.value = "window=5"
        knobs.focus()
        await pilot.press("enter")
        temperature = panel.query_one("#temperature")
        temperature.value = "0.5"
        temperature.focus()
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert (app.settings.method, dict(app.settings.options), app.settings.temperature) == ("jacobi", {"window": "5"}, 0.5)
        assert session.method_calls[-1] == ("jacobi", {"window": "5"})
        temperature.value = "-1"
        await pilot.press("enter")
        assert app.settings.temperature == 0.5
        assert "temperature must be >= 0" in str(panel.query_one("#settings-error").render())  # no CLI flag in the chat


async def test_set_and_profile_commands_change_sampling() -> None:
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/set temp=0.8 top_k=40 seed=5 max_tokens=9")
        await say(pilot, "/profile code")
        await pilot.pause()
        s = app.settings
        assert (s.temperature, s.top_k, s.seed, s.max_tokens, s.profile) == (0.8, 40, 5, 9, "code")
        await say(pilot, "/set top_p=2")
        await pilot.pause()
        assert app.settings.top_p is None  # refused: still the profile's
        await say_and_wait(pilot, "go")
    assert session.streams[-1]["sampling"].temperature == 0.8
    assert session.streams[-1]["max_new_tokens"] == 9


async def test_command_palette_offers_methods() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Method: lookahead" in titles and "Profile: code" in titles
        [command] = [c for c in app.get_system_commands(app.screen) if c.title == "Method: suffix"]
        command.callback()
        await app.workers.wait_for_complete()
        assert app.settings.method == "suffix"


# -- conversation commands -----------------------------------------------------------------


async def test_clear_starts_a_new_conversation_and_the_old_one_stays_saved(tmp_path: Path) -> None:
    session = ScriptedSession()
    store = ConversationStore(tmp_path)
    app = make_app(session, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "first")
        first_id = app.conversation.id
        await say(pilot, "/clear")
        await pilot.pause()
        assert not app.query(UserMessage) and not app.query(AssistantMessage)
        assert app.conversation.id != first_id
        await say_and_wait(pilot, "second")
    assert session.encoded[-1][0] == [{"role": "user", "content": "second"}]
    assert len(store.list()) == 2


async def test_system_command_sets_and_resets_the_system_prompt() -> None:
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/system You are a pirate.")
        await say_and_wait(pilot, "hi")
        await say(pilot, "/system")
        await say_and_wait(pilot, "hi again")
    assert [system for _, system in session.encoded] == ["You are a pirate.", None]


async def test_text_with_brackets_is_shown_as_typed_not_read_as_markup() -> None:
    """A system prompt (or an error, or a method label such as pld[min_ngram=2,num_draft=8])
    with square brackets is plain text to the chat, not Textual markup to parse."""
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/system Answer as [role=pirate, tone=grim] would.")
        await say(pilot, "/method pld[num_draft=4] num_draft=8")  # an error quoting what was typed
        await say_and_wait(pilot, "hi")
        # as a notification is drawn: Textual markup unless it says otherwise
        shown = [(Content.from_markup(n.message) if n.markup else Content(n.message)).plain for n in app._notifications]
        assert shown[0] == "System prompt: Answer as [role=pirate, tone=grim] would."
        assert shown[1].startswith("num_draft given twice: in 'pld[num_draft=4]' and after it")
    assert [system for _, system in session.encoded] == ["Answer as [role=pirate, tone=grim] would."]


async def test_save_writes_a_markdown_transcript(tmp_path: Path) -> None:
    app = make_app(ScriptedSession(["Use `sorted()`."]))
    target = tmp_path / "chat.md"
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, f"/save {target}")
        assert not target.exists(), "nothing to save yet"
        await say_and_wait(pilot, "How do I sort?")
        await say(pilot, f"/save {target}")
    text = target.read_text()
    assert "# Chat with scripted-model" in text
    assert "## You\n\nHow do I sort?" in text
    assert "Use `sorted()`." in text
    assert "tok/s" in text and "tok/step" in text and "pld max_ngram=3" in text


async def test_unknown_command_is_refused_and_double_slash_sends_a_slash() -> None:
    session = ScriptedSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/frobnicate")
        await pilot.pause()
        assert any("unknown command /frobnicate" in n.message for n in app._notifications)
        await say_and_wait(pilot, "//etc/hosts is a file?")
    assert session.encoded[-1][0] == [{"role": "user", "content": "/etc/hosts is a file?"}]


# -- saved conversations ---------------------------------------------------------------------


def saved_conversation(store: ConversationStore) -> Conversation:
    conversation = Conversation(model="scripted-model", system="Be kind.", messages=[
        Message("user", "What is 2+2?"),
        Message("assistant", "4", finish_reason="eos", method="pld", knobs={"num_draft": 10},
                stats={"tokens_per_s": 12.5, "mean_tokens_per_step": 1.5, "ttft_s": 0.2, "generated_tokens": 2}),
    ])
    store.save(conversation)
    return conversation


async def test_continue_shows_the_saved_conversation_and_extends_it(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    saved = saved_conversation(store)
    session = ScriptedSession(["8"])
    app = make_app(session, store=store, conversation=store.latest())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert [str(w.render()) for w in app.query(UserMessage)] == ["What is 2+2?"]
        [old] = replies(app)
        assert old.body.source == "4" and "12.5 tok/s" in stats_line(old)
        await say_and_wait(pilot, "And 4+4?")
    assert session.encoded[-1] == ([
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 4+4?"},
    ], "Be kind.")
    assert [m.content for m in store.load(saved.id).messages] == ["What is 2+2?", "4", "And 4+4?", "8"]


async def test_history_screen_opens_a_saved_conversation(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    saved_conversation(store)
    app = make_app(store=store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, ConversationsScreen)
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ConversationsScreen)
        assert [str(w.render()) for w in app.query(UserMessage)] == ["What is 2+2?"]


async def test_no_save_writes_nothing(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "chats")
    app = make_app(store=store, save=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "hi")
        assert "not saved" in str(app.query_one("#status-text").render())
    assert not (tmp_path / "chats").exists()


# -- bad input --------------------------------------------------------------------------------


async def test_a_model_that_fails_to_load_shows_the_error_and_another_can_be_picked() -> None:
    session = ScriptedSession()

    def load(spec: str | None) -> ScriptedSession:
        if spec == "missing-model":
            raise ModelNotFoundError("model 'missing-model' is not on this machine", hint="pardec pull missing-model")
        return session

    app = make_app(loader=load, model="missing-model")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ModelScreen) and bool(app.screen.query("#model-error")))
        error = str(app.screen.query_one("#model-error").render())
        assert "model 'missing-model' is not on this machine" in error and "pardec pull missing-model" in error
        await say(pilot, "hi")  # typing goes to the picker, not the chat
        name = app.screen.query_one("#model-name")
        name.value = "good-model"
        await pilot.press("enter")
        await ready(pilot)
        assert app.model_spec == "good-model"
        await say_and_wait(pilot, "hello")
        assert len(replies(app)) == 1


async def test_a_load_that_fails_while_the_app_closes_is_not_an_error() -> None:
    # The loader runs in a worker thread: its failure can arrive after the chat screen is gone.
    from pardec_cli.tui.app import ModelFailed

    release = threading.Event()

    def load(spec: str | None) -> ScriptedSession:
        release.wait(10)
        raise ModelNotFoundError("gone")

    app = make_app(loader=load)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
    release.set()
    app.on_model_failed(ModelFailed(None, "gone"))  # what the worker posts, after the app closed
    assert not app.loading


async def test_a_failed_model_switch_keeps_the_model_in_use() -> None:
    session = ScriptedSession()

    def load(spec: str | None) -> ScriptedSession:
        if spec == "missing-model":
            raise ModelNotFoundError("model 'missing-model' is not on this machine")
        return session

    app = make_app(loader=load)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/model missing-model")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelScreen))
        await pilot.press("escape")
        assert app.session is session and app.model_spec == "scripted-model"
        await say_and_wait(pilot, "still there?")
        assert len(replies(app)) == 1


async def test_a_loaded_model_is_kept_out_of_later_collections_and_a_replaced_one_is_freed() -> None:
    # A full collection while a reply streams walked every object of the loaded model
    # (348 ms on the UI thread, measured); frozen objects are skipped.
    loaded: dict[str | None, weakref.ref[ScriptedSession]] = {}

    def load(spec: str | None) -> ScriptedSession:
        session = ScriptedSession()
        session.itself = session  # only the cycle collector frees it, like a model's modules
        loaded[spec] = weakref.ref(session)
        return session

    app = make_app(loader=load)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert gc.get_freeze_count() > 0
        await say(pilot, "/model other-model")
        await wait_until(pilot, lambda: "other-model" in loaded and app.session is loaded["other-model"]())
        assert loaded[None]() is None, "the model replaced was collected, not frozen for good"
        await say_and_wait(pilot, "hello")
        assert len(replies(app)) == 1


async def test_a_message_before_the_model_is_loaded_is_kept_in_the_box() -> None:
    session = ScriptedSession()
    loaded = threading.Event()

    def slow_load(spec: str | None) -> ScriptedSession:
        assert loaded.wait(10)
        return session

    app = make_app(loader=slow_load)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "loading" in str(app.query_one("#status-text").render())
        await say(pilot, "early")
        await pilot.pause()
        assert app.query_one(ChatInput).text == "early" and not app.query(UserMessage)
        loaded.set()
        await ready(pilot)


async def test_context_overflow_is_explained_and_the_message_goes_back_to_the_box() -> None:
    session = ScriptedSession(context=20)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "a message far too long for this tiny context")
        [notice] = app.query(Notice)
        text = str(notice.render())
        assert "context holds 20" in text and "/clear" in text
        assert not app.query(UserMessage) and not replies(app)
        assert app.query_one(ChatInput).text == "a message far too long for this tiny context"
        assert app.conversation.messages == []


async def test_help_lists_keys_and_commands() -> None:
    from pardec_cli.tui.commands import COMMANDS
    from pardec_cli.tui.screens import KEYS

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        keys, commands = (app.screen.query_one(f"#help-{part}").content for part in ("keys", "commands"))
        assert keys.row_count == len(KEYS) and commands.row_count == len(COMMANDS)
        assert ("Esc, Ctrl+C", "stop the reply being generated (the text so far stays)") in KEYS
        assert {"/clear", "/system [TEXT]", "/method NAME [KNOB=VALUE ...]", "/save [FILE]"} <= {
            usage for usage, _ in COMMANDS.values()}
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
