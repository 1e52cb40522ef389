"""The Python API (`pardec_cli.api`), and the example of docs/python-api.md run as written.

The example loads "the embedded model"; here a pardec home holds a tiny random Llama
(with the real SmolLM2 tokenizer and chat template) in the embedded model's place, so
the documented code runs unchanged in well under a second per call.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from pardec_cli import api
from pardec_cli.errors import PardecError

ROOT = Path(__file__).resolve().parent.parent


def documented_example() -> str:
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- python-api-example:begin -->\s*```python\n(.*?)```", text, re.S)
    assert block, "docs/python-api.md lost its example block"
    return block.group(1)


def test_the_documented_example_runs_as_written(tiny_as_embedded: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(documented_example(), "docs/python-api.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert any(re.fullmatch(r"\S+: \d+\.\d tok/s, \d+\.\d\d tokens per step \((stop|length)\)", line) for line in lines)


def test_generate_with_auto_reports_what_it_chose(tiny_as_embedded: Path) -> None:
    model = api.load()
    reply = api.generate(model, "Write a Python function that adds two numbers.", max_tokens=12)
    assert reply.method in api.methods() and reply.profile == "code"  # detected from the prompt
    assert reply.finish_reason in ("stop", "length") and reply.stats.generated_tokens == len(reply.token_ids) <= 12
    assert reply.stats.tokens_per_s > 0


def test_every_method_gives_the_greedy_text_of_vanilla(tiny_as_embedded: Path) -> None:
    model = api.load(dtype="float32")
    prompt = "List the numbers one two three one two three one two three"
    plain = api.generate(model, prompt, method="vanilla", max_tokens=16, temperature=0)  # a chat prompt samples by default
    for method, knobs in (("pld", {"num_draft": 4}), ("suffix", None)):
        reply = api.generate(model, prompt, method=method, knobs=knobs, max_tokens=16, temperature=0)
        assert reply.token_ids == plain.token_ids and reply.method == method


def test_a_session_reads_the_profile_files_once(tiny_as_embedded: Path, monkeypatch) -> None:
    """~5 ms a read, a twentieth of a 16-token reply: read on the session's first reply and kept
    (as auto's selector keeps them) until `Session.profiles(refresh=True)`."""
    from pardec_cli.selection import profiles

    model = api.load()
    reads: list[int] = []
    load = profiles.load_profiles
    monkeypatch.setattr(profiles, "load_profiles", lambda: reads.append(1) or load())
    api.generate(model, "Write a haiku.", profile="chat", max_tokens=4)
    assert reads == [1]  # auto's selector takes the session's profiles too
    api.generate(model, "Write a haiku.", profile="chat", max_tokens=4)
    api.generate(model, "Write a haiku.", profile="code", method="vanilla", max_tokens=4)
    assert reads == [1]
    assert "chat" in model.profiles(refresh=True) and reads == [1, 1]
    with pytest.raises(PardecError, match="no-such-profile"):
        api.generate(model, "hi", profile="no-such-profile")  # still checked, against the kept ones


def test_streaming_yields_the_reply_piece_by_piece(tiny_as_embedded: Path) -> None:
    model = api.load()
    stream = api.stream(model, "Say hello.", method="vanilla", max_tokens=10)
    assert stream.reply is None
    pieces = list(stream)
    assert stream.reply is not None and "".join(pieces) == stream.reply.text
    assert stream.reply.stats.generated_tokens == len(stream.reply.token_ids)


def test_a_stream_can_stop_early(tiny_as_embedded: Path) -> None:
    model = api.load()
    stream = api.stream(model, "Say hello.", method="vanilla", max_tokens=40)
    for _ in stream:
        break
    reply = stream.cancel()
    assert reply.finish_reason == "cancelled" and len(reply.token_ids) < 40


def test_profile_defaults_fill_what_the_call_leaves_unset(tiny_as_embedded: Path) -> None:
    from pardec_cli.selection.profiles import load_profiles

    model = api.load()
    code_default = load_profiles()["code"].sampling.get("max_tokens")
    reply = api.generate(model, "hi", method="vanilla", profile="code")
    assert reply.stats.generated_tokens <= (code_default or 256)
    assert api.generate(model, "hi", method="vanilla", profile="code", max_tokens=3).stats.generated_tokens <= 3


def test_errors_are_pardec_errors_with_one_line_messages(tiny_as_embedded: Path) -> None:
    with pytest.raises(PardecError) as info:
        api.load("no-such-model-xyz", offline=True)
    assert "\n" not in info.value.message
    model = api.load()
    with pytest.raises(PardecError):
        api.generate(model, "hi", method="no-such-method")
    with pytest.raises(PardecError):
        api.generate(model, "hi", profile="no-such-profile")
