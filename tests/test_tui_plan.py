"""The full-screen chat plans each reply as `pardec gen` plans a prompt, starts from a first
message given on the command line, saves into pardec's data folder, copies and renames;
under each reply, one compact line. Pilot over the scripted session (tests/tui_fakes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from pardec_cli.selection.profiles import get_profile
from pardec_cli.tui.conversation import (
    ConversationStore,
    Message,
    chats_dir,
    close_fences,
    to_markdown,
)
from pardec_cli.tui.settings import ChatSettings
from pardec_cli.tui.widgets import StatsLine
from tests.test_tui import SIZE, make_app, ready, replies, say, say_and_wait, wait_until
from tests.tui_fakes import ScriptedSession

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecommendingSession(ScriptedSession):
    """A model whose generation_config.json recommends sampling settings."""

    recommended_sampling: ClassVar[dict] = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}


@pytest.mark.parametrize(("profile", "message"), [("code", "Write a function"), ("chat", "Tell me a story")])
async def test_a_profiles_sampling_table_applies_as_in_gen(profile: str, message: str) -> None:
    from pardec_cli.engine.sampling_params import SamplingParams
    from pardec_cli.planning import Settings, planned_settings

    session = ScriptedSession()
    app = make_app(session, settings=ChatSettings(method="pld", profile=profile))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, message)
    [stream] = session.streams
    built_in = Settings(max_tokens=256, sampling=SamplingParams(), stop=(), system=None, raw=False)
    _, gen_settings = planned_settings(message, profile, built_in, set())  # what `pardec gen -P PROFILE` uses
    assert stream["max_new_tokens"] == gen_settings.max_tokens == get_profile(profile).sampling["max_tokens"]
    assert stream["sampling"] == gen_settings.sampling
    assert stream["repetition_guard"] is True


async def test_the_chat_profile_samples_as_the_model_recommends_and_greedy_is_one_setting_away() -> None:
    session = RecommendingSession()
    app = make_app(session, settings=ChatSettings(method="pld", profile="chat"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "Tell me a story")
        await say(pilot, "/set temp=0")
        await say_and_wait(pilot, "Another one")
        lines = [str(reply.query_one(StatsLine).text) for reply in replies(app)]
    sampled, greedy = (s["sampling"] for s in session.streams)
    assert (sampled.temperature, sampled.top_p, sampled.top_k) == (0.6, 0.9, 20)
    assert greedy.greedy
    assert lines[0].endswith("T 0.6 p 0.9 k 20") and lines[1].endswith("greedy")


async def test_the_first_message_is_sent_once_the_model_is_loaded() -> None:
    session = ScriptedSession(["Hi!"])
    app = make_app(session, first_message="Hello from the command line")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: len(app.conversation.messages) == 2 and not app.generating)
    assert session.encoded[0][0] == [{"role": "user", "content": "Hello from the command line"}]
    assert app.conversation.messages[1].content == "Hi!"


async def test_one_compact_line_under_a_reply_with_the_knobs_in_its_tooltip() -> None:
    session = ScriptedSession(["Hello! How can I help?"])
    app = make_app(session, settings=ChatSettings(method="pld", options={"num_draft": "3"}, temperature=0))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "hi")
        [reply] = replies(app)
        line = reply.query_one(StatsLine)
        assert str(line.text).startswith("pld · ") and "tok/step" in str(line.text)
        assert str(line.tooltip).startswith("pld ") and "num_draft=3" in str(line.tooltip)
        assert not reply.query(".method"), "no second line of knobs"


async def test_ctrl_s_saves_the_transcript_in_the_data_folder_and_says_where(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = make_app(ScriptedSession())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "hi")
        await pilot.press("ctrl+s")
        await pilot.pause()
        path = chats_dir() / f"{app.conversation.id}.md"
        assert path.is_file()
        assert any(str(path) in str(n.message) for n in app._notifications)
    assert not list(tmp_path.glob("*.md")), "nothing is written into the working directory"


async def test_copy_puts_a_reply_on_the_clipboard_and_rename_names_the_conversation(tmp_path: Path) -> None:
    session = ScriptedSession(["first reply", "second reply"])
    store = ConversationStore(tmp_path)
    app = make_app(session, store=store)
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # what Textual would send to the terminal (OSC 52)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say_and_wait(pilot, "one")
        await say_and_wait(pilot, "two")
        await pilot.press("f4")
        await say(pilot, "/copy 2")
        await say(pilot, "/rename Two questions")
        await pilot.pause()
    assert copied == ["second reply", "first reply"]
    [row] = store.list()
    assert row.title == "Two questions"
    assert store.load(row.id).name == "Two questions"


def test_a_reply_cut_off_inside_a_code_block_gets_its_fence_closed_in_the_markdown():
    from pardec_cli.tui.conversation import Conversation

    cut = "Here:\n\n```python\ndef f():\n    return 1"
    conversation = Conversation(messages=[Message("user", "code"), Message("assistant", cut, finish_reason="length"),
                                          Message("user", "thanks"), Message("assistant", "You're welcome.")])
    markdown = to_markdown(conversation)
    assert "    return 1\n```\n" in markdown
    assert markdown.count("```") == 2, "the later turns are text again"


@pytest.mark.parametrize(("text", "closed"), [
    ("no code", "no code"),
    ("```\na\n```", "```\na\n```"),
    ("````md\n```\ninner\n```\n", "````md\n```\ninner\n```\n\n````"),  # a longer fence holds shorter ones
    ("~~~\ncode", "~~~\ncode\n~~~"),
    ("```python\nx = 1\n``` not a close", "```python\nx = 1\n``` not a close\n```"),
])
def test_close_fences_follows_commonmark(text: str, closed: str):
    assert close_fences(text) == closed
