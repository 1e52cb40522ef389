"""`pardec chat` in line mode (--plain, and whenever stdin or stdout is not a terminal),
the first message as an argument, and `pardec chat --server URL` against a real server.

Through Click's CliRunner (its stdin is not a terminal, so the chat runs line by line)
on the tiny random Llama with the real tokenizer (`tiny_cli_model`): it loads in
milliseconds, and greedy replies can be compared with `pardec gen`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.tui.conversation import Conversation, ConversationStore, Message
from tests.cli_helpers import invoke


def chat(model: Path, *args: str, input: str = "") -> tuple[int, str, str]:
    result = invoke(["chat", "-m", str(model), "--dtype", "float32", *args], input=input)
    return result.exit_code, result.stdout, result.stderr


def gen_text(model: Path, prompt: str, *args: str) -> str:
    result = invoke(["gen", "-m", str(model), "--dtype", "float32", "--json", *args, prompt])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["text"]


def test_without_a_terminal_each_line_is_a_message_and_each_reply_a_streamed_block(tiny_cli_model):
    code, out, err = chat(tiny_cli_model, "--greedy", "-n", "6", input="Hello there\nAnd then?\n")
    assert code == 0, err
    first = gen_text(tiny_cli_model, "Hello there", "--temp", "0", "-n", "6")
    assert out.startswith(first), "the first reply is what `pardec gen` generates greedily"
    assert len(out.splitlines()) >= 2
    stats = [line for line in err.splitlines() if "tok/step" in line]
    assert len(stats) == 2 and all("greedy" in line and " tok · " in line for line in stats)
    [saved] = ConversationStore().list()
    assert saved.turns == 4 and saved.title == "Hello there"


def test_the_first_message_can_be_an_argument(tiny_cli_model):
    code, out, err = chat(tiny_cli_model, "--greedy", "-n", "5", "Hello", "there")
    assert code == 0, err
    assert out.strip() and out.startswith(gen_text(tiny_cli_model, "Hello there", "--temp", "0", "-n", "5"))


def test_slash_commands_are_the_full_screen_chats(tiny_cli_model, tmp_path):
    script = "\n".join([
        "/method pld[num_draft=3]",  # a label as bench and --explain print it
        "/set max_tokens=4 temp=0",
        "Hello",
        "/rename My first chat",
        "/save",
        f"/save {tmp_path / 'copy.md'}",
        "/method warp",  # refused: the chat goes on, and the exit code says something failed
        "Again",
    ]) + "\n"
    code, _, err = chat(tiny_cli_model, input=script)
    assert code == 1
    assert "unknown method 'warp'" in err
    stats = [line for line in err.splitlines() if "tok/step" in line]
    assert len(stats) == 2 and all(line.startswith("pld · ") for line in stats)
    assert all("4 tok · " in line or "eos" in line for line in stats)
    [saved] = ConversationStore().list()
    assert saved.title == "My first chat" and saved.turns == 4
    default_md = saved.path.with_suffix(".md")
    assert "saved the transcript to " + str(default_md) in err, "by default next to the saved chats"
    assert default_md.is_file() and (tmp_path / "copy.md").is_file()


def test_the_chat_profile_and_code_profile_plan_replies_as_gen_does(tiny_cli_model):
    # -P code: greedy and its own token limit (512), exactly what gen plans.
    expected = gen_text(tiny_cli_model, "Write a function", "-P", "code")
    code, out, err = chat(tiny_cli_model, "-P", "code", "--no-save", "--no-repeat-guard", input="Write a function\n")
    assert code == 0, err
    [line] = [line for line in err.splitlines() if "tok/step" in line]
    assert "greedy" in line and "512 tok · length" in line
    assert out.rstrip("\n") == expected.rstrip("\n")
    # The random tiny model loops ("... magazines steak intu imagination defeated ..."): with
    # the guard (the chat's default) the reply ends there, a prefix of the unguarded one.
    code, out, err = chat(tiny_cli_model, "-P", "code", "--no-save", input="Write a function\n")
    assert code == 0, err
    [line] = [line for line in err.splitlines() if "tok/step" in line]
    assert "· repetition ·" in line
    assert len(out.rstrip("\n")) < len(expected) and expected.startswith(out.rstrip("\n"))
    # The chat profile samples (T 0.8, top-p 0.95: SmolLM2's generation config recommends nothing).
    code, out, err = chat(tiny_cli_model, "-P", "chat", "-n", "4", "--no-save", input="Hi\n")
    assert code == 0, err
    assert "T 0.8 p 0.95" in err


def test_greedy_and_temp_together_are_refused():
    result = invoke(["chat", "--greedy", "--temp", "0.5"])
    assert result.exit_code == 2 and "--greedy and --temp cannot be combined" in result.stderr


# -- against a running `pardec serve` ----------------------------------------------------------


@pytest.fixture(scope="module")
def served(tiny_cli_model, tmp_path_factory):
    from tests.serve_helpers import running_server

    home = tmp_path_factory.mktemp("chat-serve-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARDEC_HOME", str(home / "pardec"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("PARDEC_LEARN", "0")  # as every test's isolated home: auto must not measure or learn here
        with running_server(tiny_cli_model) as server:
            yield server


def test_chat_with_a_server_gives_gens_reply_and_its_stats(served, tiny_cli_model):
    result = invoke(["chat", "--server", served.url, "--greedy", "-n", "8", "--method", "pld", "Hello there"])
    assert result.exit_code == 0, result.stderr
    expected = gen_text(tiny_cli_model, "Hello there", "--temp", "0", "-n", "8", "--method", "pld")
    assert result.stdout.startswith(expected)
    [line] = [line for line in result.stderr.splitlines() if "tok/step" in line]
    assert line.startswith("pld · ") and "8 tok · " in line and "greedy" in line
    assert f"at {served.v1}" in result.stderr


def test_a_servers_stream_carries_live_stats_and_tokens_per_step(served):
    from pardec_cli.tui.backend import RemoteChat
    from pardec_cli.tui.settings import ChatSettings

    backend = RemoteChat(served.url)
    settings = ChatSettings(method="pld", max_tokens=16, temperature=0)
    reply = backend.start([{"role": "user", "content": "Count: one two three one two three"}], None, settings)
    assert reply.method == "pld", "the first chunk says what decodes the reply"
    pieces = list(reply)
    message = reply.finish()
    live = [p.stats for p in pieces if p.stats is not None]
    assert live and live[-1].generated_tokens <= message.stats["generated_tokens"]
    assert [s.generated_tokens for s in live] == sorted(s.generated_tokens for s in live)
    steps = [n for p in pieces for n in p.steps]
    assert len(steps) == message.stats["steps"], "every decoding step's token count arrives"
    assert sum(steps) + 1 == message.stats["generated_tokens"]  # + the prefill's token
    assert message.finish_reason in ("eos", "length") and message.content == "".join(p.text for p in pieces)


def test_top_k_cannot_go_to_a_server(served):
    result = invoke(["chat", "--server", served.url, "--top-k", "5", "Hi"])
    assert result.exit_code == 2 and "top_k is not part of the OpenAI API" in result.stderr


def test_copy_finds_the_last_or_the_nth_reply_from_the_end_and_explains_the_rest():
    conversation = Conversation(messages=[Message("user", "a"), Message("assistant", "first"),
                                          Message("user", "b"), Message("assistant", "second")])
    assert conversation.reply_to_copy("") == "second"
    assert conversation.reply_to_copy("2") == "first"
    for which, words in (("3", "no such reply"), ("0", "no such reply"), ("two", "takes a number")):
        with pytest.raises(PardecUsageError, match=words):
            conversation.reply_to_copy(which)
    with pytest.raises(PardecUsageError, match="no reply to copy yet"):
        Conversation().reply_to_copy("")
