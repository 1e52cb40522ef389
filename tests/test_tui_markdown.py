"""Replies' Markdown (pardec_cli/tui/markdown.py): code fences cost the UI thread little
while a reply streams, and are highlighted once it is complete."""

from __future__ import annotations

from typing import Any

import pygments.lexers
import pytest
from textual.app import App, ComposeResult

from pardec_cli.tui.markdown import PLAIN, ReplyFence, ReplyMarkdown, fence_language

pytestmark = pytest.mark.anyio

CODE_REPLY = "Here it is:\n\n```python\ndef is_prime(n):\n    return n > 1\n```\n\nDone."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(("info", "language"), [
    ("python", "python"),
    ("Python", "python"),
    ("py", "py"),
    ("python {linenos=true}", "python"),  # only the first word names the language
    ("sh", "sh"),
    ("pyt", PLAIN),  # half-typed while streaming
    ("", PLAIN),  # not typed yet, or none given
    (None, PLAIN),
    ("no-such-language", PLAIN),
])
def test_a_fence_uses_a_builtin_lexer_or_plain_text(info: str | None, language: str) -> None:
    assert fence_language(info) == language


def test_highlighting_never_guesses_nor_searches_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    # Both walk every lexer or every installed package (0.35-0.45 s the first time).
    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("a plugin search or a language guess on the UI thread")

    # pygments.lexers swaps its module object for a lazy one: patch the namespace that
    # get_lexer_by_name really reads.
    monkeypatch.setitem(pygments.lexers.get_lexer_by_name.__globals__, "find_plugin_lexers", forbidden)
    monkeypatch.setattr(pygments.lexers, "guess_lexer", forbidden)
    for info in ("pyt", "", "no-such-language", "python"):
        assert ReplyFence.highlight("x = 1\n", info).plain.startswith("x = 1")


class OneReply(App[None]):
    def __init__(self, markdown: ReplyMarkdown) -> None:
        super().__init__()
        self.markdown = markdown

    def compose(self) -> ComposeResult:
        yield self.markdown


async def test_a_streaming_reply_shows_code_plain_then_highlighted_at_its_end() -> None:
    markdown = ReplyMarkdown("", streaming=True)
    async with OneReply(markdown).run_test() as pilot:
        await markdown.append(CODE_REPLY)
        await pilot.pause()
        [fence] = markdown.query(ReplyFence)
        assert fence.lexer == PLAIN, "no lexer is loaded while the reply streams"
        assert "def is_prime" in fence.code
        await markdown.end_stream()
        await pilot.pause()
        [fence] = markdown.query(ReplyFence)
        assert fence.lexer == "python"
        assert not markdown.streaming
        assert markdown.source == CODE_REPLY, "ending the stream keeps every character"


async def test_a_finished_reply_is_highlighted_at_once() -> None:
    markdown = ReplyMarkdown(CODE_REPLY)
    async with OneReply(markdown).run_test() as pilot:
        await pilot.pause()
        [fence] = markdown.query(ReplyFence)
        assert fence.lexer == "python"


async def test_a_reply_without_code_is_not_drawn_again_at_its_end() -> None:
    markdown = ReplyMarkdown("", streaming=True)
    async with OneReply(markdown).run_test() as pilot:
        await markdown.append("Just words, **bold** ones.")
        await pilot.pause()
        [paragraph] = markdown.children
        await markdown.end_stream()
        await pilot.pause()
        assert list(markdown.children) == [paragraph], "the blocks shown while streaming stay"
