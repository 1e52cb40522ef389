"""llama.cpp as a peer (`pardec bench --baseline llamacpp`): the worker protocol, surviving
a crash, finding the model's GGUF file, the report, and a real run when llama-cpp-python
is installed.

The protocol tests run a fake worker (tests/fake_llamacpp_worker.py) in a real
subprocess, so a real SIGSEGV is what the crash tests survive.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from pardec_cli.bench import (
    HF_GREEDY, LLAMA_CPP, OVERALL, Run, format_tables, parse_baselines, summarize,
)
from pardec_cli.errors import PardecUsageError, PeerError
from pardec_cli.peers import llamacpp
from pardec_cli.peers.llamacpp import LlamaCpp, find_gguf, require_installed
from tests.cli_helpers import invoke

FAKE_WORKER = Path(__file__).with_name("fake_llamacpp_worker.py")
FAKE_COMMAND = [sys.executable, str(FAKE_WORKER)]


@pytest.fixture
def worker_log(tmp_path, monkeypatch) -> Path:
    """The fake worker appends every request it receives here."""
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_LLAMACPP_LOG", str(log))
    return log


def requests(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def fake(tmp_path: Path, mode: str, monkeypatch, **settings) -> LlamaCpp:
    monkeypatch.setenv("FAKE_LLAMACPP_MODE", mode)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    return LlamaCpp(gguf, command=FAKE_COMMAND, **{"n_ctx": 512, "n_threads": 2, **settings})


# -- the worker protocol ------------------------------------------------------------


def test_the_worker_is_fed_token_ids_and_answers_tokens_and_seconds(tmp_path, monkeypatch, worker_log):
    with fake(tmp_path, "ok", monkeypatch) as engine:
        generation = engine.generate([5, 6, 7], max_tokens=4, stop=[99])
    assert generation.tokens == [8, 9, 10, 11]
    assert generation.seconds == pytest.approx(0.004)
    load, generate = requests(worker_log)
    assert load == {"op": "load", "model": str(tmp_path / "model.gguf"), "n_ctx": 512, "n_threads": 2, "n_batch": 512}
    assert generate == {"op": "generate", "tokens": [5, 6, 7], "max_tokens": 4, "stop": [99]}


def test_generation_ends_at_a_stop_token_which_it_keeps(tmp_path, monkeypatch):
    with fake(tmp_path, "ok", monkeypatch) as engine:
        assert engine.generate([5], max_tokens=10, stop=[8]).tokens == [6, 7, 8]


def test_the_settings_used_are_reported(tmp_path, monkeypatch):
    with fake(tmp_path, "ok", monkeypatch, n_threads=3) as engine:
        engine.generate([1], max_tokens=1)
        assert engine.describe() == [
            "llama.cpp: llama-cpp-python 0.0-fake, n_threads=3, n_batch=512, n_ctx=512, greedy, same prompt token ids, "
            "on model.gguf"
        ]
        assert engine.settings()["events"] == []


def test_a_crash_in_batched_evaluation_is_retried_once_with_n_batch_1_and_reported(tmp_path, monkeypatch, worker_log):
    with fake(tmp_path, "crash-batched", monkeypatch) as engine:
        first = engine.generate([5], max_tokens=2)
        second = engine.generate([7], max_tokens=2)
        assert (first.tokens, second.tokens) == ([6, 7], [8, 9])
        assert engine.n_batch == 1
        lines = engine.describe()
    assert "n_batch=1" in lines[0]
    assert lines[1] == ("llama.cpp: the worker crashed (SIGSEGV: ggml: about to crash) with n_batch=512; "
                        "retried with n_batch=1, used from then on")
    sent = requests(worker_log)
    assert [r["op"] for r in sent] == ["load", "generate", "load", "generate", "generate"]
    assert [r["n_batch"] for r in sent if r["op"] == "load"] == [512, 1]


def test_a_crash_with_n_batch_1_too_is_a_clear_error(tmp_path, monkeypatch):
    with fake(tmp_path, "crash-always", monkeypatch) as engine:
        with pytest.raises(PeerError, match=r"llama.cpp crashed again \(SIGSEGV.*\), also with n_batch=1"):
            engine.generate([5], max_tokens=2)
        assert engine._worker is None  # nothing left running


def test_an_error_reply_becomes_a_peer_error(tmp_path, monkeypatch):
    with fake(tmp_path, "error", monkeypatch) as engine:
        with pytest.raises(PeerError, match="llama.cpp: ValueError: Requested tokens exceed context window"):
            engine.generate([5], max_tokens=2)


def test_the_real_worker_answers_a_missing_model_file_with_an_error_line(tmp_path):
    # The real worker, with or without llama-cpp-python: either way one error line comes back.
    with LlamaCpp(tmp_path / "missing.gguf", n_ctx=256, n_threads=1) as engine:
        with pytest.raises(PeerError, match="^llama.cpp: "):
            engine.start()


# -- finding the GGUF file, and what is missing --------------------------------------


def test_not_installed_is_one_line_with_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # find_spec answers None for it
    with pytest.raises(PeerError) as caught:
        require_installed()
    assert caught.value.message.endswith("pip install 'pardec[peers]'")
    assert caught.value.hint is None


def test_the_embedded_model_uses_the_gguf_inside_its_package(tmp_path, monkeypatch):
    packaged = tmp_path / "SmolLM2.gguf"
    packaged.write_bytes(b"GGUF")
    monkeypatch.setattr("pardec_cli.store.embedded.find_embedded_gguf", lambda: packaged)
    assert find_gguf("smollm2-135m", source="embedded", path=tmp_path / "converted") == packaged


def test_an_imported_model_uses_the_gguf_its_marker_records(tmp_path):
    from pardec_cli.store.layout import write_marker

    source = tmp_path / "model-q4.gguf"
    source.write_bytes(b"GGUF")
    (tmp_path / "store").mkdir()
    write_marker(tmp_path / "store", source="gguf", gguf=str(source))
    assert find_gguf("mine", source="store", path=tmp_path / "store") == source
    source.unlink()
    with pytest.raises(PeerError, match="imported from .*model-q4.gguf, which is no longer there"):
        find_gguf("mine", source="store", path=tmp_path / "store")


def test_a_model_without_a_gguf_file_points_to_pardec_import(tmp_path):
    with pytest.raises(PeerError, match="was not imported from one") as caught:
        find_gguf("org/model", source="hub", path=tmp_path)
    assert "`pardec import FILE.gguf`" in caught.value.hint


# -- baselines in the bench ------------------------------------------------------------


def test_baseline_lists():
    assert parse_baselines("hf, llamacpp") == ["hf", "llamacpp"]
    assert parse_baselines("llama.cpp,hf,hf") == ["llamacpp", "hf"]
    assert parse_baselines(None) == []
    with pytest.raises(PardecUsageError, match="unknown baseline 'vllm'"):
        parse_baselines("hf,vllm")


def run(label, pid, tokens, seconds, ids=None):
    return Run(label, pid, "c", tokens, seconds, max(tokens - 1, 0), 0, 0, ids or list(range(tokens)))


def test_the_ratio_to_llama_cpp_and_its_match_rate_against_vanilla():
    runs = [run("vanilla", "1", 10, 1.0), run("vanilla", "2", 10, 1.0),
            run("auto", "1", 10, 0.25), run("auto", "2", 10, 0.25),
            run(LLAMA_CPP, "1", 10, 0.5), run(LLAMA_CPP, "2", 10, 0.5, ids=[7] * 10)]
    table = summarize(runs, ["vanilla", "auto", LLAMA_CPP])
    overall = table[OVERALL]
    assert overall["auto"].speedup_vs_llamacpp == pytest.approx(2.0)
    assert overall["vanilla"].speedup_vs_llamacpp == pytest.approx(0.5)
    assert overall[LLAMA_CPP].speedup_vs_vanilla == pytest.approx(2.0)
    assert overall[LLAMA_CPP].match_rate == 0.5
    text = format_tables(table)
    assert "vs llama.cpp" in text
    assert any(line.startswith("auto ") and " 2.00x " in line for line in text.splitlines())


def test_no_llama_cpp_column_without_llama_cpp():
    table = summarize([run("vanilla", "1", 10, 1.0), run(HF_GREEDY, "1", 10, 1.0)], ["vanilla", HF_GREEDY])
    assert "vs llama.cpp" not in format_tables(table)


@pytest.fixture
def model_with_gguf(tiny_cli_model, tmp_path) -> Path:
    """The tiny model, as if imported from a GGUF file (its marker records one)."""
    from pardec_cli.store.layout import write_marker

    model = tmp_path / "imported"
    shutil.copytree(tiny_cli_model, model)
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    write_marker(model, source="gguf", gguf=str(tmp_path / "tiny.gguf"))
    return model


def bench_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["Say hello."]}) + "\n"
                    + json.dumps({"question_id": 2, "category": "code", "turns": ["Write a loop."]}) + "\n")
    return path


def test_bench_runs_llama_cpp_interleaved_and_reports_its_settings(model_with_gguf, tmp_path, monkeypatch, worker_log):
    monkeypatch.setattr(llamacpp, "WORKER", FAKE_WORKER)
    monkeypatch.setattr(llamacpp, "require_installed", lambda: None)
    monkeypatch.setenv("FAKE_LLAMACPP_MODE", "crash-batched")
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--prompts", str(bench_prompts(tmp_path)), "-m", str(model_with_gguf), "-n", "6",
                     "--dtype", "float32", "--compile", "off", "--methods", "vanilla", "--baseline", "hf,llamacpp",
                     "--json", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "pardec bench: 2 prompts x 3 methods (vanilla, hf, llama.cpp)" in result.stderr
    assert "vs llama.cpp" in result.stdout
    assert "llama.cpp: llama-cpp-python 0.0-fake, n_threads=" in result.stdout
    assert "retried with n_batch=1, used from then on" in result.stdout
    document = json.loads(out.read_text())
    settings = document["config"]["baselines"][LLAMA_CPP]
    assert settings["n_batch"] == 1 and settings["version"] == "0.0-fake" and settings["model"].endswith("tiny.gguf")
    llama_runs = [r for r in document["runs"] if r["label"] == LLAMA_CPP]
    assert len(llama_runs) == 2 and all(r["new_tokens"] == 6 for r in llama_runs)
    # The warm-up (crashed, then repeated with n_batch=1), then the two prompts' ids.
    fed = [r["tokens"] for r in requests(worker_log) if r["op"] == "generate"]
    assert len(fed) == 4 and fed[0] == fed[1] and fed[2] != fed[3]
    assert document["summary"][OVERALL][LLAMA_CPP]["match_rate"] == 0.0  # the fake's tokens are not vanilla's


def test_bench_with_a_model_that_has_no_gguf_names_pardec_import(tiny_cli_model, tmp_path, monkeypatch):
    """Said before the model loads (and compiles its steps: a minute for a bench)."""
    from pardec_cli.session import Session

    monkeypatch.setattr(llamacpp, "require_installed", lambda: None)
    monkeypatch.setattr(Session, "load", classmethod(lambda *a, **k: pytest.fail("the model was loaded")))
    result = invoke(["bench", "--prompts", str(bench_prompts(tmp_path)), "-m", str(tiny_cli_model), "-n", "2",
                     "--methods", "vanilla", "--baseline", "llamacpp"])
    assert result.exit_code == 1
    assert "was not imported from one" in result.stderr and "pardec import" in result.stderr


def test_bench_without_llama_cpp_python_says_how_to_install_it_before_loading(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    result = invoke(["bench", "--prompts", str(bench_prompts(tmp_path)), "-m", "no-such-model",
                     "--baseline", "llamacpp"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "pardec: error: the llama.cpp baseline needs llama-cpp-python, which is not installed: "
        "pip install 'pardec[peers]'"]


# -- the real llama.cpp ----------------------------------------------------------------


@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_real_llama_cpp_on_the_embedded_gguf_continues_like_pardec(embedded_pardec_home, monkeypatch):
    import importlib.metadata

    from pardec_cli.session import Session

    monkeypatch.setenv("PARDEC_HOME", str(embedded_pardec_home))
    session = Session.load(None, dtype="float32", device="cpu", offline=True)
    ids = session.encode("What is the capital of France?")
    with LlamaCpp(find_gguf(session.model_name, source=session.model_source, path=session.model_path),
                  n_ctx=256, n_threads=2) as engine:
        first = engine.generate(ids, max_tokens=12, stop=sorted(session.eos_token_ids))
        again = engine.generate(ids, max_tokens=12, stop=sorted(session.eos_token_ids))
        settings = engine.settings()
    assert again.tokens == first.tokens and first.seconds > 0  # greedy; nothing carried over between runs
    # The same Q4_1 weights (dequantized by pardec, kept packed by llama.cpp, whose int8
    # activations move logits by up to ~1): each of llama.cpp's first tokens is pardec's
    # own greedy choice or within a logit of it. Token equality is too strict: on an AMD
    # EPYC this prompt's first token is a near-tie (25.33 vs 25.24) that llama.cpp flips.
    with torch.no_grad():
        logits = session.target.model(torch.tensor([ids + first.tokens[:4]])).logits[0, len(ids) - 1 :]  # [5, V]
    gaps = [float(logits[i].max() - logits[i, token]) for i, token in enumerate(first.tokens[:4])]
    assert len(gaps) == 4 and max(gaps) < 1.0, gaps
    assert settings["version"] == importlib.metadata.version("llama_cpp_python")
