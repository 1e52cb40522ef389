"""Slash commands typed in the chat input (`/clear`, `/method pld k=8`, ...).

Parsing only: the app decides what each command does. A message that starts with `//`
is sent as text with one slash removed, so a reply can still start with a slash.
"""

from __future__ import annotations

from dataclasses import dataclass

from pardec_cli.errors import PardecUsageError

# name -> (usage, what it does); the help screen and the error for an unknown command use it.
COMMANDS: dict[str, tuple[str, str]] = {
    "clear": ("/clear", "start a new conversation (the current one stays saved)"),
    "system": ("/system [TEXT]", "set the system prompt; without TEXT, go back to the model's default"),
    "method": ("/method NAME [KNOB=VALUE ...]", "decode the next replies with another method"),
    "set": ("/set KEY=VALUE ...",
            "change sampling: temp, top_p, top_k, seed, max_tokens, profile, guard (VALUE default: the profile's)"),
    "profile": ("/profile NAME", "task profile: auto, chat, code, extraction"),
    "model": ("/model NAME", "load another model (alias, Hub id or directory)"),
    "save": ("/save [FILE]", "write the conversation as Markdown (default: ID.md in pardec's chats folder)"),
    "copy": ("/copy [N]", "copy the last reply (or the N-th from the end) to the clipboard"),
    "rename": ("/rename NAME", "name this conversation (the list shows it instead of the first message)"),
    "history": ("/history", "open a saved conversation"),
    "help": ("/help", "keys and commands"),
    "quit": ("/quit", "leave the chat"),
}


@dataclass(frozen=True)
class SlashCommand:
    """A parsed command: its name and the rest of the line (stripped)."""

    name: str
    argument: str = ""

    @property
    def words(self) -> list[str]:
        return self.argument.split()


def parse_input(text: str) -> SlashCommand | str | None:
    """What the user typed: a command, a message to send, or None (blank: ignored)."""
    if not text.strip():
        return None
    stripped = text.strip()
    if stripped.startswith("//"):
        return text.replace("//", "/", 1).strip()
    if not stripped.startswith("/"):
        return text.strip()
    name, _, argument = stripped[1:].partition(" ")
    name = name.strip().lower()
    if name not in COMMANDS:
        known = " ".join(f"/{c}" for c in COMMANDS)
        raise PardecUsageError(f"unknown command /{name} (commands: {known}; start with // to send a slash)")
    return SlashCommand(name, argument.strip())
