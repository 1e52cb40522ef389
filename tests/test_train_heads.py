"""`pardec train-heads`: training lowers the loss, the heads it saves load and decode exactly,
Ctrl-C saves them, and the store finds them (`gen --method`, `list`, `show`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.store import records
from pardec_cli.store.heads import find_heads, installed_heads, model_key, trained_heads_dir
from pardec_cli.training.corpus import read_corpus
from tests.cli_helpers import invoke

FAST = ["--samples", "6", "--reply-tokens", "24", "--dtype", "float32"]


@pytest.fixture(scope="module")
def tiny_chat_model(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny peaked Llama (repetitive, so heads can learn it fast) with SmolLM2's tokenizer and chat template."""
    from tests.tiny_models import peaked, save_with_real_tokenizer, tiny_llama

    return save_with_real_tokenizer(
        lambda vocab: peaked(tiny_llama(3, vocab=vocab, layers=4, hidden=64, max_positions=1024), scale=4.0),
        embedded_model_dir, tmp_path_factory.mktemp("tiny-chat-model"),
    )


def _session(model_dir: Path):
    from pardec_cli.session import Session

    return Session.load(str(model_dir), dtype="float32", device="cpu")


def _train(session, kind: str, steps: int, **extra):
    from pardec_cli.training.run import TrainOptions, train_heads

    options = TrainOptions(kind=kind, steps=steps, samples=8, reply_tokens=32, lr=3e-3, checkpoint_s=1e9, **extra)
    return train_heads(session, options, say=lambda _: None, show=lambda _: None)


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_training_lowers_the_loss_and_the_heads_decode_exactly(tiny_chat_model, kind):
    session = _session(tiny_chat_model)
    result = _train(session, kind, steps=60)
    history = result.state.history
    assert result.state.step == 60 and result.state.finished
    assert history[-1][1] < 0.9 * history[0][1], history
    assert (result.folder / "pardec-heads.json").is_file() and result.evaluation
    # Found as the model's installed heads, and exact.
    session.set_method(kind)
    prompt = session.encode("Write a poem about the sea")
    ours = session.generate(prompt, max_new_tokens=40)
    session.set_method("vanilla")
    assert ours.token_ids == session.generate(prompt, max_new_tokens=40).token_ids
    assert ours.stats.accepted_tokens > 0


def test_ctrl_c_saves_the_heads_and_resume_continues(tiny_chat_model, monkeypatch):
    from pardec_cli.training import run as run_module

    session = _session(tiny_chat_model)
    original = run_module.Trainer.run

    def interrupted_run(self):
        report = self.report

        def stop_at_five(state, progress):
            report(state, progress)
            if state.step == 5:
                raise KeyboardInterrupt

        self.report = stop_at_five
        return original(self)

    monkeypatch.setattr(run_module.Trainer, "run", interrupted_run)
    with pytest.raises(run_module.TrainingInterrupted) as info:
        _train(session, "eagle", steps=50)
    folder = trained_heads_dir(session.heads_key(), "eagle")
    assert info.value.saved == folder
    marker = json.loads((folder / "pardec-heads.json").read_text())
    assert marker["steps"] == 5 and marker["interrupted"] is True
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    monkeypatch.setattr(run_module.Trainer, "run", original)
    cache = folder.parent / ".cache"
    assert len(list(cache.glob("distilled-*.jsonl"))) == 1 and len(list(cache.glob("features-*.safetensors"))) == 1

    def no_target_runs(*args, **kwargs):
        raise AssertionError("the cached replies and hidden states should have been reused")

    monkeypatch.setattr(session.target, "forward_features", no_target_runs)
    monkeypatch.setattr(session.target.model, "generate", no_target_runs)
    result = _train(session, "eagle", steps=10, resume=True)
    assert result.state.step == 15
    _session(tiny_chat_model).set_method("eagle")  # still loadable


def test_train_heads_command_installs_heads_that_gen_list_and_show_find(tiny_chat_model):
    model = str(tiny_chat_model)
    result = invoke(["train-heads", "-m", model, "--kind", "medusa", "--steps", "30", "--heads", "2", *FAST])
    assert result.exit_code == 0, result.stderr
    assert "saved to" in result.stderr and f"pardec gen -m {model} --method medusa" in result.stderr
    assert "\033[" not in result.stderr  # no progress bar drawn off a terminal
    folder = Path(result.stderr.split("saved to ")[1].split("\n")[0])
    assert {"config.json", "medusa_lm_head.safetensors", "pardec-heads.json"} <= {p.name for p in folder.iterdir()}
    assert json.loads((folder / "config.json").read_text())["medusa_num_heads"] == 2

    def gen(*args):
        out = invoke(["gen", "-m", model, "--dtype", "float32", "-n", "30", "--temp", "0", "--json", *args, "Tell me about the sea"])
        assert out.exit_code == 0, out.stderr
        return json.loads(out.stdout)

    with_heads = gen("--method", "medusa")
    assert with_heads["text"] == gen("--method", "vanilla")["text"]
    assert with_heads["knobs"]["heads"] == str(folder)
    assert gen("--method", "medusa", "--heads", str(folder))["text"] == with_heads["text"]
    shown = invoke(["show", model, "--json"])
    assert any(a["kind"] == "medusa" and a["status"] == "trained" for a in json.loads(shown.stdout)["accelerators"])


def test_bad_training_input_is_one_clear_error(tiny_chat_model, tmp_path):
    model = str(tiny_chat_model)
    missing_kind = invoke(["train-heads", "-m", model])
    assert missing_kind.exit_code == 2 and "--kind" in missing_kind.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    no_files = invoke(["train-heads", "-m", model, "--kind", "eagle", "--data", str(empty)])
    assert no_files.exit_code == 2 and "no .txt, .md or .jsonl files" in no_files.stderr
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"prompt": "hi"}\n{"oops": 1}\n')
    bad = invoke(["train-heads", "-m", model, "--kind", "eagle", "--data", str(bad_line)])
    assert bad.exit_code == 2 and "bad.jsonl:2: expected" in bad.stderr
    nothing = invoke(["train-heads", "-m", model, "--kind", "medusa", "--resume", "--steps", "1", *FAST])
    assert nothing.exit_code == 2 and "--resume: no medusa heads" in nothing.stderr
    assert "Traceback" not in no_files.stderr + bad.stderr + nothing.stderr


def test_methods_without_heads_say_how_to_get_them(tiny_chat_model):
    out = invoke(["gen", "-m", str(tiny_chat_model), "--method", "eagle", "hi"])
    assert out.exit_code == 2
    assert f"no EAGLE heads are installed for {tiny_chat_model}" in out.stderr
    assert "pardec train-heads --kind eagle" in out.stderr
    wrong = invoke(["gen", "-m", str(tiny_chat_model), "--method", "pld", "--heads", str(tiny_chat_model), "hi"])
    assert wrong.exit_code == 2 and "--heads is for --method" in wrong.stderr


def test_corpus_files_hold_text_and_prompts(tmp_path):
    (tmp_path / "notes.md").write_text("# Notes\nSome text.")
    (tmp_path / "data.jsonl").write_text('{"text": "plain"}\n"a bare prompt"\n{"prompt": "p"}\n{"turns": ["t1", "t2"]}\n')
    corpus = read_corpus(tmp_path)
    assert corpus.texts == ["plain", "# Notes\nSome text."]
    assert corpus.prompts == ["a bare prompt", "p", "t1"]
    assert len(read_corpus(None).prompts) > 200  # the built-in prompts
    with pytest.raises(PardecUsageError, match="no such file"):
        read_corpus(tmp_path / "nope")


# ------------------------------------------------------------------------ store


def _fake_trained(key: str, kind: str) -> Path:
    folder = trained_heads_dir(key, kind)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "pardec-heads.json").write_text(json.dumps({"steps": 12, "created": "2026-01-01"}))
    return folder


def test_installed_heads_are_found_trained_first_then_pulled(tmp_path):
    trained = _fake_trained("smollm2-135m", "eagle")
    (trained_heads_dir("smollm2-135m", "medusa")).mkdir(parents=True)  # no marker: unfinished, ignored
    cache = tmp_path / "hf"
    snapshot = cache / "models--org--heads" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    head = records.RepoRecord("org/heads", "main", "abc", str(cache), {"config.json": 2}, "eagle", "org/heads", records.COMPATIBLE)
    bad = records.RepoRecord("org/bad", "main", "abc", str(cache), {"config.json": 2}, "medusa", "org/bad", records.INCOMPATIBLE)
    target = records.RepoRecord("HuggingFaceTB/SmolLM2-135M-Instruct", "main", "c", str(cache), {"x": 1})
    records.save(records.PullRecord("smollm2-135m", target, alias="smollm2-135m", accelerators=[head, bad]))
    found = installed_heads("smollm2-135m")
    assert [(h.kind, h.source) for h in found] == [("eagle", "trained"), ("eagle", "pulled")]
    assert find_heads("smollm2-135m", "eagle").path == trained
    assert find_heads("smollm2-135m", "medusa") is None  # unfinished and incompatible heads do not count
    assert find_heads("smollm2-135m", "eagle3") is None


def test_model_keys_name_store_hub_and_local_models(tmp_path):
    assert model_key("smollm2-135m") == "smollm2-135m"
    assert model_key("Org/Some Model") == "org--some-model"
    local = model_key("./x", source="local", path=tmp_path / "my model")
    assert local.startswith("local-my-model-") and local == model_key("other", source="local", path=tmp_path / "my model")
    assert local != model_key("./x", source="local", path=tmp_path / "other")
