"""The chat's data, without the UI: conversation files, Markdown transcripts, slash
commands and settings (torch-free and Textual-free modules)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.tui.commands import SlashCommand, parse_input
from pardec_cli.tui.conversation import Conversation, ConversationStore, Message, to_markdown
from pardec_cli.tui.settings import ChatSettings, method_for_reply


def reply(text: str, **stats: float) -> Message:
    return Message("assistant", text, finish_reason="eos", method="pld", knobs={"num_draft": 10},
                   stats={"tokens_per_s": 20.0, "mean_tokens_per_step": 2.5, "ttft_s": 0.25,
                          "generated_tokens": 40, "steps": 16, **stats}, per_step=[1, 3, 2])


def test_conversation_round_trips_through_its_file(tmp_path: Path):
    store = ConversationStore(tmp_path)
    conversation = Conversation(model="smollm2-135m", system="Be brief.",
                                messages=[Message("user", "Hi\nthere"), reply("Hello!")])
    path = store.save(conversation)
    assert path == tmp_path / f"{conversation.id}.json"
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file left behind"
    loaded = store.load(conversation.id)
    assert loaded.to_dict() == conversation.to_dict()
    assert loaded.messages[1].per_step == [1, 3, 2]
    assert json.loads(path.read_text())["title"] == "Hi there"


def test_an_empty_conversation_is_not_written(tmp_path: Path):
    ConversationStore(tmp_path / "chats").save(Conversation())
    assert not (tmp_path / "chats").exists()


def test_ids_resolve_by_unique_prefix_and_unreadable_files_are_skipped(tmp_path: Path):
    store = ConversationStore(tmp_path)
    for ident in ("20250101-100000-aaaa", "20250101-110000-bbbb"):
        store.save(Conversation(id=ident, messages=[Message("user", ident)]))
    (tmp_path / "broken.json").write_text("{not json")
    assert [s.id for s in store.list()][0] in {"20250101-100000-aaaa", "20250101-110000-bbbb"}
    assert len(store.list()) == 2
    assert store.load("20250101-11").id == "20250101-110000-bbbb"
    with pytest.raises(PardecError, match="matches several conversations"):
        store.load("20250101")
    with pytest.raises(PardecError, match="is not a saved conversation"):
        store.load("1999")


def test_markdown_transcript_has_turns_and_reply_stats():
    conversation = Conversation(model="m", system="Be brief.", messages=[Message("user", "Sort?"), reply("`sorted()`")])
    text = to_markdown(conversation)
    assert text.startswith("# Chat with m\n")
    assert "**System:** Be brief." in text
    assert "## You\n\nSort?\n\n## m\n\n`sorted()`\n\n> 20.0 tok/s · 2.50 tok/step · TTFT 250 ms · 40 tokens · eos · pld num_draft=10" in text


@pytest.mark.parametrize(
    ("typed", "parsed"),
    [
        ("   ", None),
        ("hello ", "hello"),
        ("/clear", SlashCommand("clear")),
        ("/METHOD  pld  k=3 ", SlashCommand("method", "pld  k=3")),
        ("/system Be brief.", SlashCommand("system", "Be brief.")),
        ("//usr/bin is where?", "/usr/bin is where?"),
    ],
)
def test_input_is_a_message_a_command_or_nothing(typed, parsed):
    assert parse_input(typed) == parsed


def test_an_unknown_command_lists_the_known_ones():
    with pytest.raises(PardecUsageError, match=r"unknown command /nope \(commands: /clear /system"):
        parse_input("/nope")


def test_settings_changes_are_checked():
    settings = ChatSettings(method="pld")
    assert settings.with_values({"temp": "0.7", "seed": "none", "n": "32"}).describe_sampling() == "temp 0.7 · -n 32"
    assert settings.with_method("lookahead", {"window": "4"}).options == {"window": "4"}
    for values, message in [({"temp": "hot"}, "temperature expects a number"), ({"top_p": "0"}, "--top-p"),
                            ({"profile": "poetry"}, "unknown profile"), ({"colour": "1"}, "unknown setting"),
                            ({"max_tokens": "0"}, "at least 1")]:
        with pytest.raises(PardecUsageError, match=message):
            settings.with_values(values)
    with pytest.raises(PardecUsageError, match="unknown method"):
        settings.with_method("turbo")


def test_the_next_reply_uses_the_chosen_method():
    settings = ChatSettings(method="suffix", options={"max_nodes": "16"})
    assert method_for_reply(None, settings, [{"role": "user", "content": "hi"}]) == ("suffix", {"max_nodes": "16"})


def test_auto_asks_the_selector_about_the_last_user_message_with_the_profile_and_sampling():
    asked = []

    class Selector:
        def choose(self, prompt, profile, *, greedy):
            asked.append((prompt, profile, greedy))
            return type("Choice", (), {"method": "pld", "knobs": {"num_draft": 4}})()

    session = type("FakeSession", (), {"auto_selector": lambda self: Selector()})()
    messages = [{"role": "user", "content": "fix this"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "def f(): pass"}]
    settings = ChatSettings(method="auto", profile="code", temperature=0.7)
    assert method_for_reply(session, settings, messages) == (
        "adaptive", {"arms": "pld[num_draft=4] | pld[num_draft=2] | vanilla"})  # checked while decoding
    assert asked == [("def f(): pass", "code", False)]
    assert method_for_reply(session, settings.with_method("auto", {"adapt": "off"}), messages) == ("pld", {"num_draft": 4})


def test_auto_takes_no_knobs():
    with pytest.raises(PardecUsageError, match="knobs are chosen too"):
        ChatSettings(method="pld").with_method("auto", {"k": "4"})
    assert ChatSettings(method="pld").with_method("auto").method == "auto"


def test_updates_wait_for_the_ui_and_are_spaced_by_what_they_cost(monkeypatch):
    from pardec_cli.tui import pacing

    clock = {"cpu": 0.0, "now": 100.0}
    monkeypatch.setattr(pacing.time, "thread_time", lambda: clock["cpu"])
    monkeypatch.setattr(pacing.time, "monotonic", lambda: clock["now"])
    pacer = pacing.UpdatePacer()
    assert pacer.may_send(100.0)
    pacer.sent()
    assert not pacer.may_send(500.0), "the UI has not applied the last update yet"

    def ui_spends(seconds: float) -> None:
        clock["cpu"] += seconds
        pacer.taken()

    ui_spends(0.006)  # 6 ms of UI work: the next update comes 6 ms / UI_SHARE later
    wait = 0.006 / pacing.UI_SHARE
    assert not pacer.may_send(100.0 + wait - 0.01) and pacer.may_send(100.0 + wait)
    pacer.sent()
    ui_spends(0.00001)  # cheap updates: as often as MIN_INTERVAL_S
    assert pacer.may_send(100.0 + pacing.MIN_INTERVAL_S) and not pacer.may_send(100.0 + pacing.MIN_INTERVAL_S / 2)
    pacer.sent()
    ui_spends(5.0)  # very costly updates: still one every MAX_INTERVAL_S
    assert pacer.may_send(100.0 + pacing.MAX_INTERVAL_S)
