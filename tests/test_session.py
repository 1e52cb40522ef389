"""The Session is where decoding meets the store: it hands each method what it needs
(a drafter loader that checks the tokenizer, where heads are and pardec's notes on
them), so methods and the engine never import the store themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from pardec_cli.errors import PardecError, PardecUsageError
from tests.tiny_models import WORDS, peaked, save_word_level_model, tiny_llama, word_level_tokenizer


@pytest.fixture
def session():
    from pardec_cli.session import Session

    return Session(peaked(tiny_llama(vocab=len(WORDS) + 3, layers=2)), word_level_tokenizer(), model_name="tiny")


def test_a_drafter_with_the_same_tokenizer_drafts(session, tmp_path: Path) -> None:
    drafter = save_word_level_model(tmp_path / "drafter", seed=1, layers=1)
    session.set_method("draft", {"model": str(drafter)})
    assert session.generate(session.encode("w5 w6 w7"), max_new_tokens=6).stats.generated_tokens == 6


def test_a_drafter_with_another_tokenizer_is_refused_when_loaded(session, tmp_path: Path) -> None:
    drafter = save_word_level_model(tmp_path / "drafter", seed=1, layers=1)
    config = drafter / "tokenizer.json"
    config.write_text(config.read_text().replace('"w3": 3', '"w3": 4').replace('"w4": 4', '"w4": 3'))
    with pytest.raises(PardecUsageError, match="does not share the target's tokenizer") as info:
        session.set_method("draft", {"model": str(drafter)})
    assert info.value.hint == "choose a drafter from the same model family"


def test_methods_get_the_stores_notes_on_heads_through_their_env(session, monkeypatch, tmp_path: Path) -> None:
    from pardec_cli.methods import registry
    from pardec_cli.store.heads import MARKER_NAME

    (tmp_path / MARKER_NAME).write_text('{"draft_vocab": [5, 6, 7]}')
    seen = {}
    monkeypatch.setattr(registry, "create", lambda name, options, env: seen.setdefault("env", env))
    session.build_proposer("vanilla")
    assert seen["env"].heads_notes(tmp_path) == {"draft_vocab": [5, 6, 7]}


def test_loading_pauses_the_cyclic_collector_and_leaves_it_as_it_was(tmp_path: Path, monkeypatch) -> None:
    """Loading imports torch and transformers and builds the model: the collector's passes
    over those objects as they pile up cost part of a second of start-up, and a pass over
    them after cost a quarter of a second of the first reply: a load leaves them frozen."""
    import gc

    from pardec_cli.session import Session
    from pardec_cli.store import loading

    seen = []
    real = loading.load_model

    def spying(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_model", spying)
    model = save_word_level_model(tmp_path / "model")
    assert gc.isenabled()
    gc.unfreeze()
    Session.load(str(model), device="cpu", offline=True)
    assert seen == [False] and gc.isenabled() and gc.get_freeze_count() > 0
    gc.disable()
    try:
        Session.load(str(model), device="cpu", offline=True)
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()
    gc.unfreeze()
    with pytest.raises(PardecError):  # a failed load too, and it freezes nothing
        Session.load(str(tmp_path / "no-such-model"), device="cpu", offline=True)
    assert gc.isenabled() and gc.get_freeze_count() == 0
