"""`pardec chat` from the command line, the chat's start-up without torch, and one chat
through the real engine on a tiny random Llama (no download, well under a second)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pardec_cli.tui.conversation import Conversation, ConversationStore, Message
from tests.cli_helpers import invoke


def assert_one_clear_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.stderr
    assert result.stderr.startswith("pardec: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def test_help_teaches_the_keys_and_options():
    result = invoke(["chat", "--help"])
    assert result.exit_code == 0
    for fragment in ("--method", "--temp", "-P, --profile", "--continue", "--no-save", "Esc stops a reply", "F2"):
        assert fragment in result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--method", "nope"], "unknown method 'nope'"),
        (["--method", "pld", "-O", "nope=1"], "has no option 'nope'"),
        (["--method", "pld[nope=1]"], "has no option 'nope'"),  # a label as bench prints it: its knobs are -O's
        (["--continue"], "there is no saved conversation to continue"),
        (["--continue", "1999"], "'1999' is not a saved conversation"),
    ],
)
def test_bad_options_fail_before_the_app_starts(args, fragment):
    result = invoke(["chat", *args])
    assert result.exit_code in (1, 2)
    assert fragment in result.stderr and "Traceback" not in result.stderr


def test_list_prints_saved_conversations_newest_first(isolated_home: Path):
    store = ConversationStore()
    older = Conversation(id="20250101-090000-aaaa", model="m1", messages=[Message("user", "first chat")])
    newer = Conversation(id="20250102-090000-bbbb", model="m2", messages=[Message("user", "second chat")])
    store.save(older)
    store.save(newer)
    result = invoke(["chat", "--list"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("20250102-090000-bbbb") and lines[0].endswith("second chat")
    assert lines[1].startswith("20250101-090000-aaaa")
    assert (isolated_home / "chats" / "20250101-090000-aaaa.json").is_file()


STARTUP_IMPORTS = r"""
import asyncio, json, sys, threading
from pardec_cli.tui.app import ChatApp, ChatOptions
from pardec_cli.tui.settings import ChatSettings
from pardec_cli.cli.main import run

release = threading.Event()

def load(spec):  # the real loader imports torch here, in the worker thread
    release.wait(10)
    raise RuntimeError("not loading anything")

async def main():
    app = ChatApp(ChatOptions(settings=ChatSettings(method="pld"), save=False), load)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        report = {"loading": app.loading, "modules": sorted(m for m in ("torch", "transformers") if m in sys.modules)}
        release.set()
    return report

report = asyncio.run(main())
run(["chat", "--help"])
report["after_help"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(json.dumps(report))
"""


def test_the_app_starts_and_chat_help_runs_without_importing_torch():
    done = subprocess.run([sys.executable, "-c", STARTUP_IMPORTS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"loading": True, "modules": [], "after_help": []}


# -- the real engine ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_session():
    """A Session over a tiny random Llama with a word-level tokenizer and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from pardec_cli.session import Session
    from tests.tiny_models import peaked, tiny_llama

    vocab = {f"w{i}": i for i in range(96)}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="w0", eos_token="w2")
    tokenizer.chat_template = (
        "{% for m in messages %}w{{ 10 if m.role == 'system' else 11 if m.role == 'user' else 12 }} "
        "{{ m.content }} {% endfor %}w12"
    )
    return Session(peaked(tiny_llama(seed=3)), tokenizer, model_name="tiny")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_chat_on_the_real_engine_shows_exactly_what_it_generates(tiny_session, anyio_backend):
    from pardec_cli.tui.app import ChatApp, ChatOptions
    from pardec_cli.tui.settings import ChatSettings
    from pardec_cli.tui.widgets import AssistantMessage, ChatInput
    from tests.test_tui import wait_until

    settings = ChatSettings(method="pld", max_tokens=24, temperature=0)
    app = ChatApp(ChatOptions(settings=settings, save=False), lambda spec: tiny_session)
    turns = ["w5 w6 w7 w5 w6", "w8 w9"]
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        for turn in turns:
            app.query_one(ChatInput).load_text(turn)
            await pilot.press("enter")
            await wait_until(pilot, lambda: not app.generating, timeout=30)
        shown = [reply.text for reply in app.query(AssistantMessage)]
        saved = [m for m in app.conversation.messages if m.role == "assistant"]
    # The same conversation generated directly with plain decoding: pld is exact.
    tiny_session.set_method("vanilla")
    history: list[dict[str, str]] = []
    expected = []
    for turn in turns:
        history.append({"role": "user", "content": turn})
        result = tiny_session.generate(tiny_session.encode(history), max_new_tokens=24)
        expected.append(result.text)
        history.append({"role": "assistant", "content": result.text})
    assert shown == expected
    assert all(text.strip() for text in shown)
    assert saved[0].method == "pld" and saved[0].stats["generated_tokens"] > 0
    assert saved[0].stats["mean_tokens_per_step"] > 1, "the peaked model repeats itself, so pld drafts get accepted"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_with_method_auto_each_reply_uses_the_selectors_choice_for_its_message(tiny_session, anyio_backend):
    from pardec_cli.tui.app import ChatApp, ChatOptions
    from pardec_cli.tui.settings import ChatSettings
    from pardec_cli.tui.widgets import AssistantMessage, ChatInput
    from tests.test_tui import wait_until

    turn = "w5 w6 w7 w5 w6"
    app = ChatApp(ChatOptions(settings=ChatSettings(method="auto", profile="code", max_tokens=16), save=False),
                  lambda spec: tiny_session)
    async with app.run_test(size=(100, 36)) as pilot:
        await wait_until(pilot, lambda: app.session is not None)
        app.query_one(ChatInput).load_text(turn)
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.generating, timeout=30)
        [shown] = [reply.text for reply in app.query(AssistantMessage)]
        [saved] = [m for m in app.conversation.messages if m.role == "assistant"]
    from pardec_cli.planning import auto_method

    choice = tiny_session.auto_selector().choose(turn, "code", greedy=True)
    method, _, _ = auto_method(choice, {})  # auto runs its choice adaptively by default
    assert choice.method != "auto" and saved.method == method
    tiny_session.set_method("vanilla")
    expected = tiny_session.generate(tiny_session.encode([{"role": "user", "content": turn}]), max_new_tokens=16)
    assert shown == expected.text
