"""The Markdown widget of a reply, with code fences that stay cheap while text streams in.

Textual's fence highlights its code with the language named after the opening backticks.
A name that Pygments does not know makes Pygments scan every installed package's entry
points for lexer plugins (and import them: with IPython installed that alone took 0.35 s),
and a fence with no name yet makes Textual *guess* the language, which loads every lexer
Pygments has (0.45 s the first time) and often guesses wrong. While a reply streams, the
info string is routinely half-typed ("```pyt") or absent, and these costs land on the UI
thread, which shares the interpreter with the decoding thread: in a profile of a chat
writing Python they were half the UI's time. So a reply's fences use a built-in lexer
when the name is one, and plain text otherwise.

Highlighting itself waits for the reply to end: the first use of a lexer compiles its
regular expressions (about 0.3 s for Python, measured on the UI thread in the middle of
a reply), and a fence that is still growing would be highlighted again at every update.
While a reply streams its code shows as plain text; `ReplyMarkdown.end_stream` then
renders the finished reply once with colours.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from markdown_it.token import Token
from textual.content import Content
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownBlock, MarkdownFence

PLAIN = "text"


@lru_cache(maxsize=1)
def builtin_lexer_aliases() -> frozenset[str]:
    """Every alias of Pygments' built-in lexers (read from its table; imports no lexer)."""
    from pygments.lexers import get_all_lexers

    return frozenset(alias.lower() for _name, aliases, _files, _mimes in get_all_lexers(plugins=False)
                     for alias in aliases)


def fence_language(info: str | None) -> str:
    """The lexer alias to highlight a fence with: its first info word if Pygments has it built in, else plain text."""
    words = (info or "").split()
    language = words[0].lower() if words else ""
    return language if language in builtin_lexer_aliases() else PLAIN


class ReplyFence(MarkdownFence):
    """A code fence highlighted with a known lexer or as plain text, never by a guess or a plugin search;
    plain while its reply is streaming."""

    def __init__(self, markdown: Markdown, token: Token, code: str) -> None:
        if isinstance(markdown, ReplyMarkdown) and markdown.streaming:
            markdown.plain_fences = True
            token.info = PLAIN  # a fresh token from this parse; the reply's end re-parses the source
        super().__init__(markdown, token, code)

    @classmethod
    def highlight(cls, code: str, language: str, ansi: bool = False, dark: bool = False) -> Content:
        return super().highlight(code, fence_language(language), ansi=ansi, dark=dark)


class ReplyMarkdown(Markdown):
    """Markdown for replies: Textual's blocks, with `ReplyFence` for code.

    `streaming=True` for a reply being generated: its code is highlighted by `end_stream`.
    """

    BLOCKS: dict[str, type[MarkdownBlock]] = {**Markdown.BLOCKS, "fence": ReplyFence, "code_block": ReplyFence}

    def __init__(self, markdown: str | None = None, *, streaming: bool = False, **kwargs: Any) -> None:
        super().__init__(markdown, **kwargs)
        self.streaming = streaming
        self.plain_fences = False  # a fence was drawn without colours while streaming

    async def end_stream(self) -> None:
        """The reply is complete: draw it again with its code highlighted (if it has code)."""
        self.streaming = False
        if self.plain_fences:
            self.plain_fences = False
            await self.update(self.source)
