"""Snapshots of the chat's main screens (pytest-textual-snapshot), on the scripted
session so that every run draws the same thing. After an intended change of looks:
`python -m pytest tests/test_tui_snapshots.py --snapshot-update`, then review the SVGs
in tests/__snapshots__/."""

from __future__ import annotations

from typing import Any

from pardec_cli.errors import ModelNotFoundError
from pardec_cli.tui.widgets import ChatInput
from tests.test_tui import make_app, say, wait_until
from tests.tui_fakes import ScriptedSession

SIZE = (100, 32)

REPLY = """A prime has exactly two divisors:

```python
def is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))
```

It checks divisors up to **√n**."""


async def steady(pilot: Any) -> None:
    """Stop the input's cursor blinking, so a snapshot does not depend on when it is taken."""
    for chat_input in pilot.app.query(ChatInput):
        chat_input.cursor_blink = False
    await pilot.pause()


async def chatted(pilot: Any) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.session is not None)
    await say(pilot, "Write a Python function that checks whether a number is prime.")
    await wait_until(pilot, lambda: not app.generating and bool(app.conversation.messages))
    app.clear_notifications()
    await steady(pilot)


def test_conversation_with_reply_stats(snap_compare):
    app = make_app(ScriptedSession([REPLY], tokens_per_step=(1, 4, 2, 7, 3, 1)), save=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=chatted)


def test_settings_panel(snap_compare):
    async def open_panel(pilot: Any) -> None:
        await chatted(pilot)
        await pilot.press("f2")
        await steady(pilot)

    app = make_app(ScriptedSession([REPLY]), save=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=open_panel)


def test_help_screen(snap_compare):
    async def open_help(pilot: Any) -> None:
        await wait_until(pilot, lambda: pilot.app.session is not None)
        await pilot.press("f1")
        await steady(pilot)

    assert snap_compare(make_app(save=False), terminal_size=SIZE, run_before=open_help)


def test_model_load_error(snap_compare):
    def fail(spec: str | None) -> None:
        raise ModelNotFoundError(f"model {spec!r} is not on this machine and not in the catalog",
                                 hint=f"pardec pull {spec}")

    async def wait_for_error(pilot: Any) -> None:
        await wait_until(pilot, lambda: bool(pilot.app.screen.query("#model-error")))
        await steady(pilot)

    app = make_app(loader=fail, model="qwen9-1t", save=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=wait_for_error)
