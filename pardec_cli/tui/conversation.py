"""Conversations: the messages of one chat, saved as JSON under the pardec home.

Torch-free and Textual-free: the app, `pardec chat --continue` and the tests use it
directly. One file per conversation, ``<home>/chats/<id>.json``, written atomically
(a temporary file renamed over the old one) so that a crash never leaves half a file.

    {"version": 1, "id": "20250101-120000-ab12", "title": "...", "created": "...",
     "updated": "...", "model": "smollm2-135m", "system": null,
     "messages": [{"role": "user", "content": "..."},
                  {"role": "assistant", "content": "...", "finish_reason": "eos",
                   "method": "pld", "knobs": {...}, "stats": {...}, "per_step": [1, 3, ...]}]}
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.home import pardec_home

FORMAT_VERSION = 1
TITLE_LENGTH = 60


def chats_dir() -> Path:
    """Where conversations are saved: ``<pardec home>/chats``."""
    return pardec_home() / "chats"


def _now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def new_conversation_id() -> str:
    """Sortable by creation time, unique enough for one user: ``20250101-120000-ab12``."""
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


@dataclass
class Message:
    """One turn. Assistant turns also record how they were generated."""

    role: str  # "user" or "assistant"
    content: str
    finish_reason: str | None = None  # eos, length, stop, cancelled (assistant only)
    method: str | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)  # GenerationStats.to_dict()
    per_step: list[int] = field(default_factory=list)  # tokens emitted by each decoding step
    profile: str | None = None  # the task profile the reply was planned with
    sampling: str | None = None  # planning.describe_sampling: "greedy", "T 0.8 p 0.95"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "assistant":
            data.update(finish_reason=self.finish_reason, method=self.method, knobs=self.knobs, stats=self.stats,
                        per_step=self.per_step, profile=self.profile, sampling=self.sampling)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        return cls(
            role=str(data["role"]),
            content=str(data["content"]),
            finish_reason=data.get("finish_reason"),
            method=data.get("method"),
            knobs=dict(data.get("knobs") or {}),
            stats=dict(data.get("stats") or {}),
            per_step=[int(n) for n in data.get("per_step") or []],
            profile=data.get("profile"),
            sampling=data.get("sampling"),
        )


@dataclass
class Conversation:
    """A chat: its messages, system prompt and the model it was held with."""

    id: str = field(default_factory=new_conversation_id)
    model: str | None = None
    name: str | None = None  # given with /rename; the title otherwise comes from the first message
    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)

    @property
    def title(self) -> str:
        """The name given with /rename, else the first user message, on one line and shortened."""
        first = self.name or next((m.content for m in self.messages if m.role == "user"), "")
        line = " ".join(first.split())
        return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"

    def chat_messages(self) -> list[dict[str, str]]:
        """The turns as chat-template messages ({"role", "content"}), system prompt excluded."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    def clear(self) -> None:
        """Forget the turns (the system prompt and the model stay)."""
        self.messages.clear()

    def reply_to_copy(self, which: str) -> str:
        """The reply `/copy [N]` means: the last one, or the N-th from the end."""
        replies = [m for m in self.messages if m.role == "assistant"]
        try:
            back = int(which) if which.strip() else 1
        except ValueError:
            raise PardecUsageError(f"/copy takes a number (1: the last reply), got {which!r}") from None
        if not 1 <= back <= len(replies):
            raise PardecUsageError("there is no such reply to copy" if replies else "there is no reply to copy yet")
        return replies[-back].content

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "id": self.id,
            "title": self.title,
            "name": self.name,
            "created": self.created,
            "updated": self.updated,
            "model": self.model,
            "system": self.system,
            "messages": [m.to_dict() for m in self.messages],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Conversation:
        return cls(
            id=str(data["id"]),
            model=data.get("model"),
            name=data.get("name"),
            system=data.get("system"),
            messages=[Message.from_dict(m) for m in data.get("messages", [])],
            created=str(data.get("created") or _now()),
            updated=str(data.get("updated") or _now()),
        )


@dataclass(frozen=True)
class ConversationSummary:
    """A row of the conversation list (read without keeping the messages)."""

    id: str
    title: str
    model: str | None
    updated: str
    turns: int
    path: Path


class ConversationStore:
    """Saved conversations in one directory (default: `chats_dir()`)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or chats_dir()

    def path_for(self, conversation_id: str) -> Path:
        return self.directory / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        """Write the conversation (atomically); an empty one is not written."""
        path = self.path_for(conversation.id)
        if not conversation.messages:
            return path
        conversation.updated = _now()
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{conversation.id}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(conversation.to_dict(), out, ensure_ascii=False, indent=1)
                out.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def load(self, conversation_id: str) -> Conversation:
        """The conversation with this id (or a unique id prefix)."""
        path = self.path_for(conversation_id)
        if not path.is_file():
            matches = [s for s in self.list() if s.id.startswith(conversation_id)]
            if len(matches) != 1:
                known = ", ".join(s.id for s in self.list()[:5]) or "none saved yet"
                what = "matches several conversations" if matches else "is not a saved conversation"
                raise PardecError(f"{conversation_id!r} {what} (latest: {known})",
                                  hint="`pardec chat --list` shows them")
            path = matches[0].path
        return Conversation.from_dict(self._read(path))

    def latest(self) -> Conversation | None:
        """The most recently updated conversation, or None when there is none."""
        summaries = self.list()
        return Conversation.from_dict(self._read(summaries[0].path)) if summaries else None

    def list(self) -> list[ConversationSummary]:
        """Saved conversations, most recently updated first (unreadable files are skipped)."""
        rows = []
        for path in self.directory.glob("*.json"):
            try:
                data = self._read(path)
                rows.append(ConversationSummary(
                    str(data["id"]), str(data.get("title") or ""), data.get("model"), str(data.get("updated") or ""),
                    len(data.get("messages") or []), path,
                ))
            except PardecError:
                continue
        return sorted(rows, key=lambda s: (s.updated, s.id), reverse=True)

    def delete(self, conversation_id: str) -> None:
        self.path_for(conversation_id).unlink(missing_ok=True)

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or "id" not in data:
                raise ValueError("not a conversation")
            return data
        except (OSError, ValueError, KeyError) as exc:
            raise PardecError(f"cannot read the conversation {path}: {exc}") from None


# -- Markdown transcript ----------------------------------------------------------------


def format_reply_line(message: Message) -> str:
    """The one line under a reply: ``pld · 41.2 tok/s · 2.31 tok/step · TTFT 120 ms · 128
    tokens · eos · T 0.8 p 0.95`` (the knobs are left to the tooltip and the saved record)."""
    parts = [message.method or "?", format_numbers(message.stats, message.finish_reason, compact=True)]
    if message.sampling:
        parts.append(message.sampling)
    return " · ".join(p for p in parts if p)


def format_reply_stats(message: Message) -> str:
    """One line about how a reply was generated: speed, tokens per step, TTFT, then the method."""
    numbers = format_numbers(message.stats, message.finish_reason)
    method = describe_method(message.method or "?", message.knobs)
    return f"{numbers} · {method}" if numbers else method


def format_numbers(stats: dict[str, Any], finish_reason: str | None = None, *, compact: bool = False) -> str:
    """``41.2 tok/s · 2.31 tok/step · TTFT 120 ms · 128 tokens · eos`` from GenerationStats.to_dict()
    (compact: ``128 tok``, so that the chat's line under a reply fits next to its sparkline)."""
    parts = []
    if stats:
        parts.append(f"{stats.get('tokens_per_s', 0):.1f} tok/s")
        if stats.get("steps", 1):
            parts.append(f"{stats.get('mean_tokens_per_step', 0):.2f} tok/step")
        if stats.get("arms"):  # adaptive: how often it switched, and what ran most
            most = max(stats["arms"].items(), key=lambda kv: kv[1]["steps"])[0]
            parts.append(f"{stats.get('switches', 0)} switches, mostly {most}")
        parts.append(f"TTFT {stats.get('ttft_s', 0) * 1000:.0f} ms")
        parts.append(f"{stats.get('generated_tokens', 0)} {'tok' if compact else 'tokens'}")
    if finish_reason:
        parts.append(finish_reason)
    return " · ".join(parts)


def describe_method(method: str, knobs: dict[str, Any]) -> str:
    """``pld max_ngram=3 num_draft=10``; just the name for a method without knobs."""
    return " ".join([method, *(f"{k}={v}" for k, v in knobs.items())])


def to_markdown(conversation: Conversation, *, model: str | None = None) -> str:
    """The conversation as a Markdown document (what `/save FILE` writes)."""
    name = model or conversation.model or "model"
    lines = [f"# Chat with {name}", "", f"*{conversation.created}*", ""]
    if conversation.system:
        lines += ["**System:** " + conversation.system, ""]
    for message in conversation.messages:
        if message.role == "user":
            lines += ["## You", "", message.content.rstrip(), ""]
        else:
            lines += [f"## {name}", "", close_fences(message.content.rstrip()) or "*(no text)*", ""]
            lines += [f"> {format_reply_stats(message)}", ""]
    return "\n".join(lines)


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def close_fences(text: str) -> str:
    """`text` with a code fence left open at its end closed (CommonMark's rules: a fence
    is closed by a line of at least as many of the same character, nothing after them).

    A reply cut off by the token limit or by Esc inside a code block would otherwise
    turn every later turn of the saved Markdown into code."""
    open_fence: str | None = None
    for line in text.splitlines():
        match = _FENCE.match(line)
        if not match:
            continue
        fence, rest = match.groups()
        if open_fence is None:
            if not (fence[0] == "`" and "`" in rest):  # a backtick fence's info string has no backtick
                open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not rest.strip():
            open_fence = None
    return text if open_fence is None else f"{text}\n{open_fence}"


def markdown_path(conversation: Conversation, filename: str = "") -> Path:
    """Where `/save [FILE]` writes: FILE (relative to the working directory), or by default
    ``<id>.md`` next to the saved conversations in pardec's data folder."""
    return Path(filename) if filename.strip() else chats_dir() / f"{conversation.id}.md"


def write_markdown(conversation: Conversation, target: Path, *, model: str | None = None) -> Path:
    """Write the Markdown transcript to `target` (a relative path is taken from the cwd;
    missing folders are made)."""
    path = target.expanduser()
    if path.is_dir():
        raise PardecError(f"{path} is a directory", hint="give a file name, e.g. /save chat.md")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_markdown(conversation, model=model), encoding="utf-8")
    except OSError as exc:
        raise PardecError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path

