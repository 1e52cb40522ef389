"""`pardec pull`, `list`, `show`, `rm` and `import`, end to end.

Pulls run the real huggingface_hub download code against a local HTTP server on
127.0.0.1 that serves the Hub's endpoints (``/api/models/...`` listings and
``/<repo>/resolve/<rev>/<file>`` with HEAD and range requests) for tiny random models;
``HF_ENDPOINT`` points at it. The Hub itself is never contacted. Commands run in-process
through `pardec_cli.cli.main.run` (the error boundary included) inside Click's
CliRunner, except the Ctrl-C test, which interrupts a real `pardec pull` process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from pardec_cli.cli import models as models_cli
from pardec_cli.cli.main import run
from pardec_cli.home import models_dir
from pardec_cli.store import gguf_import, hub, records
from pardec_cli.store.resolve import resolve_model
from tests.fake_hub import FakeHub, fake_hub, tiny_repos  # noqa: F401 (fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ the CLI


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def invoke(args: Sequence[str], *, input: str | None = None) -> Result:
    """Run `pardec ARGS...` in-process; capture exit code, stdout and stderr."""
    runner = CliRunner()
    with runner.isolation(input=input) as (out, err, _mixed):
        code = run(list(args))
    return Result(code, out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace"))


def cache() -> Path:
    return hub.cache_root()


def snapshot(repo: str, revision: str = "main") -> Path:
    commit = hub.read_ref(repo, revision)
    assert commit is not None, f"{repo} has no refs/{revision}"
    return hub.snapshot_dir(repo, commit)


MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja"}  # fmt: skip


# --------------------------------------------------------------------- pull


def test_pull_fetches_the_model_and_its_accelerators(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "tiny"])
    assert result.exit_code == 0, result.stderr
    snap = snapshot("test-org/tiny-target")
    assert {p.name for p in snap.iterdir()} == MODEL_FILES
    assert (cache() / "models--test-org--tiny-target" / "refs" / "main").read_text() == snap.name
    # Only what a model needs: no README, ONNX, original/ copies, pickles or training state.
    fetched = set(fake_hub.file_gets("test-org/tiny-target"))
    assert fetched == MODEL_FILES
    assert {p.name for p in snapshot("test-org/tiny-eagle").iterdir()} == {"config.json", "pytorch_model.bin"}
    assert {p.name for p in snapshot("test-org/tiny-medusa").iterdir()} == {
        "config.json", "medusa_lm_head.safetensors"
    }
    # No progress bars in a pipe: one plain line per file instead.
    assert "\r" not in result.stderr
    assert "model.safetensors" in result.stderr
    assert result.stdout.startswith("tiny: downloaded ")

    record = records.find("tiny")
    assert record is not None and record.alias == "tiny"
    assert set(record.target.files) == MODEL_FILES
    assert record.target.files["model.safetensors"] == len(
        dict(fake_hub.repos["test-org/tiny-target"]["main"][1])["model.safetensors"]
    )
    states = {(a.kind, a.name): a.status for a in record.accelerators}
    assert states == {
        ("drafter", "tiny-draft"): "compatible",
        ("eagle", "test-org/tiny-eagle"): "compatible",
        ("medusa", "test-org/tiny-medusa"): "compatible",
    }
    assert "tiny-draft" in result.stdout and "compatible" in result.stdout


def test_second_pull_is_a_no_op(fake_hub: FakeHub) -> None:
    assert invoke(["pull", "tiny"]).exit_code == 0
    gets = sum(fake_hub.gets.values())
    again = invoke(["pull", "tiny"])
    assert again.exit_code == 0, again.stderr
    assert sum(fake_hub.gets.values()) == gets  # not one file downloaded again
    assert "tiny: up to date" in again.stderr
    assert again.stdout.startswith("tiny: nothing to download")


def test_pull_by_hub_id_uses_the_alias_record(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "test-org/tiny-target", "--no-drafters"])
    assert result.exit_code == 0, result.stderr
    record = records.find("test-org/tiny-target")
    assert record is not None and record.name == "tiny" and record.accelerators == []


def test_pull_honours_hf_hub_cache(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    assert invoke(["pull", "tiny", "--no-drafters"]).exit_code == 0
    assert (other / "models--test-org--tiny-target" / "snapshots").is_dir()
    assert not (Path(os.environ["HF_HOME"]) / "hub" / "models--test-org--tiny-target").exists()
    assert resolve_model("tiny", offline=True).path.parent.parent == other / "models--test-org--tiny-target"


def test_no_drafters_and_drafter_choice(fake_hub: FakeHub) -> None:
    assert invoke(["pull", "tiny", "--no-drafters"]).exit_code == 0
    assert not any(k.startswith(("test-org/tiny-drafter/", "test-org/tiny-eagle/")) for k in fake_hub.gets)
    result = invoke(["pull", "tiny", "--drafter", "tiny-draft"])
    assert result.exit_code == 0, result.stderr
    assert fake_hub.file_gets("test-org/tiny-drafter")
    assert not fake_hub.file_gets("test-org/tiny-eagle") and not fake_hub.file_gets("test-org/tiny-medusa")
    record = records.find("tiny")
    assert record is not None and [a.name for a in record.accelerators] == ["tiny-draft"]
    both = invoke(["pull", "tiny", "--no-drafters", "--drafter", "tiny-draft"])
    assert both.exit_code == 2 and "exclude each other" in both.stderr


def test_pull_a_revision(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "tiny", "--revision", "v2", "--no-drafters"])
    assert result.exit_code == 0, result.stderr
    snap = snapshot("test-org/tiny-target", "v2")
    assert snap.name == fake_hub.repos["test-org/tiny-target"]["v2"][0]
    assert json.loads((snap / "generation_config.json").read_text()) == {"max_new_tokens": 7}
    assert not (cache() / "models--test-org--tiny-target" / "refs" / "main").exists()
    record = records.find("tiny")
    assert record is not None and record.target.revision == "v2"
    assert resolve_model("tiny", offline=True).path == snap  # the pulled revision, offline
    missing = invoke(["pull", "tiny", "--revision", "nope", "--no-drafters"])
    assert missing.exit_code == 1 and "revision 'nope' of test-org/tiny-target does not exist" in missing.stderr


def test_a_dropped_connection_resumes_the_file(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # huggingface_hub keeps what it received in whole chunks (10 MB); small chunks let
    # this 100 kB file show the resume from the middle.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 256)
    fake_hub.drop_once["model.safetensors"] = 1000
    result = invoke(["pull", "tiny", "--no-drafters"])
    assert result.exit_code == 0, result.stderr
    assert fake_hub.file_gets("test-org/tiny-target")["model.safetensors"] == 2
    assert fake_hub.ranges == [("model.safetensors", 768)]  # resumed with a range request
    served = fake_hub.repos["test-org/tiny-target"]["main"][1]["model.safetensors"]
    assert (snapshot("test-org/tiny-target") / "model.safetensors").read_bytes() == served


@pytest.mark.slow  # a pardec process and a signal
def test_ctrl_c_leaves_no_half_file_and_the_next_pull_resumes(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.stall["model.safetensors"] = 2000
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    process = subprocess.Popen(
        [sys.executable, "-m", "pardec_cli", "pull", "tiny", "--no-drafters"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert fake_hub.stalled.wait(120), "the pull never reached the weights"
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err

    repo = cache() / "models--test-org--tiny-target"
    assert not list(repo.rglob("*.incomplete"))  # the partial file is gone
    snap = next((repo / "snapshots").iterdir())
    assert not (snap / "model.safetensors").exists()
    assert (snap / "tokenizer.json").exists()  # finished files are kept
    assert not (repo / "refs" / "main").exists() and records.find("tiny") is None
    with pytest.raises(Exception, match="not available offline"):
        resolve_model("tiny", offline=True)

    fake_hub.stall.clear()
    fake_hub.release.set()
    result = invoke(["pull", "tiny", "--no-drafters"])
    assert result.exit_code == 0, result.stderr
    gets = fake_hub.file_gets("test-org/tiny-target")
    assert gets["tokenizer.json"] == 1 and gets["config.json"] == 1  # not downloaded again
    assert gets["model.safetensors"] == 2
    assert resolve_model("tiny", offline=True).path == snap


def test_progress_bars_on_a_terminal(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models_cli, "_stderr_is_terminal", lambda: True)
    result = invoke(["pull", "tiny", "--no-drafters"])
    assert result.exit_code == 0, result.stderr
    # One live display: a bar per file while it downloads, and one over the whole pull.
    frames = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stderr).replace("\r", "\n").splitlines()
    assert any("model.safetensors" in line for line in frames)
    assert any("tokenizer.json" in line for line in frames)
    overall = [line for line in frames if "tiny: all files" in line]
    assert overall and any("100%" in line and "B/s" in line for line in overall)


# ------------------------------------------------------------------ offline


def test_offline_pull_of_a_missing_model(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(["pull", "tiny", "--offline"])
    assert result.exit_code == 1
    assert result.stderr.startswith("pardec: error: test-org/tiny-target is not available offline")
    assert fake_hub.requests == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = invoke(["pull", "tiny"])
    assert result.exit_code == 1 and "not available offline" in result.stderr
    assert fake_hub.requests == []


def test_pulled_models_resolve_offline(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    assert invoke(["pull", "tiny"]).exit_code == 0
    requests = len(fake_hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = invoke(["pull", "tiny"])
    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith("tiny: nothing to download")
    snap = snapshot("test-org/tiny-target")
    for spec in ("tiny", "TINY", "test-org/tiny-target"):
        resolved = resolve_model(spec)
        assert (resolved.path, resolved.source, resolved.name) == (snap, "hf-cache", "tiny")
    drafter = resolve_model("tiny-draft")
    assert drafter.path == snapshot("test-org/tiny-drafter")
    assert len(fake_hub.requests) == requests  # nothing asked of the Hub

    from pardec_cli.store.loading import load_model

    model, tokenizer = load_model(snap, dtype="float32", device="cpu")
    assert model.config.vocab_size == 136 and tokenizer("w5 w6")["input_ids"] == [5, 6]
    assert records.last_used("tiny") is not None


def test_gen_downloads_a_missing_model_like_a_pull(fake_hub: FakeHub) -> None:
    """`-m ALIAS` online and not cached: the model alone is pulled and recorded."""
    resolved = resolve_model("tiny2", offline=False)
    assert (resolved.name, resolved.source) == ("tiny2", "hub")
    assert {p.name for p in resolved.path.iterdir()} == MODEL_FILES
    record = records.find("tiny2")
    assert record is not None and record.accelerators == []
    assert not fake_hub.file_gets("test-org/tiny-drafter")
    gets = sum(fake_hub.gets.values())
    again = resolve_model("tiny2", offline=False)
    assert (again.path, again.source) == (resolved.path, "hf-cache")
    assert sum(fake_hub.gets.values()) == gets


# ---------------------------------------------------------------- bad input


def test_unknown_alias_suggests_close_names(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "tinny"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "pardec: error: unknown model 'tinny'", "pardec: hint: did you mean: tiny, tiny2?"
    ]
    assert fake_hub.requests == []


def test_a_hub_id_that_does_not_exist(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "test-org/nope"])
    assert result.exit_code == 1
    assert "model repository 'test-org/nope' was not found on the Hugging Face Hub" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (cache() / "models--test-org--nope").exists()


def test_a_gated_repo_says_how_to_log_in(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "test-org/gated"])
    assert result.exit_code == 1
    assert "test-org/gated is gated" in result.stderr and "hf auth login" in result.stderr
    assert records.find("test-org/gated") is None
    assert not list((cache() / "models--test-org--gated").rglob("config.json"))


def test_a_drafter_with_another_tokenizer_is_an_error(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "tiny", "--drafter", "test-org/other-drafter"])
    assert result.exit_code == 1
    assert (
        "pardec: error: drafter test-org/other-drafter does not share the tokenizer of tiny: "
        "token 10 differs: target 'w10', drafter 'w11'"
    ) in result.stderr
    record = records.find("tiny")
    assert record is not None and record.target.present()  # the model itself was pulled
    (acc,) = record.accelerators
    assert (acc.status, acc.detail) == ("incompatible", "token 10 differs: target 'w10', drafter 'w11'")
    shown = json.loads(invoke(["show", "tiny", "--json"]).stdout)
    assert {a["name"]: a["status"] for a in shown["accelerators"]}["test-org/other-drafter"] == "incompatible"


def test_not_enough_disk_space(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "free_bytes", lambda path: 1000)
    result = invoke(["pull", "tiny", "--no-drafters"])
    assert result.exit_code == 1
    assert "not enough disk space for test-org/tiny-target" in result.stderr
    assert "HF_HUB_CACHE" in result.stderr
    assert not fake_hub.gets  # nothing downloaded
    assert records.find("tiny") is None


def test_truncated_weights_are_caught_and_removed(fake_hub: FakeHub) -> None:
    commit, files = fake_hub.repos["test-org/tiny-target"]["main"]
    files["model.safetensors"] = files["model.safetensors"][:-100]  # the Hub's copy is damaged
    result = invoke(["pull", "tiny", "--no-drafters"])
    assert result.exit_code == 1
    assert "model.safetensors is truncated" in result.stderr
    repo = cache() / "models--test-org--tiny-target"
    assert not repo.exists() or not list((repo / "snapshots").rglob("*"))  # nothing half-written
    assert records.find("tiny") is None


def test_an_architecture_transformers_cannot_load(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "test-org/weird"])
    assert result.exit_code == 1
    assert "cannot load architecture 'foobarnet' (test-org/weird)" in result.stderr
    assert fake_hub.file_gets("test-org/weird") == Counter({"config.json": 1})  # no weights fetched
    assert not (cache() / "models--test-org--weird").exists()


def test_pulling_a_gguf_or_nothing(fake_hub: FakeHub) -> None:
    result = invoke(["pull", "model.Q4_0.gguf"])
    assert result.exit_code == 2 and "pardec import model.Q4_0.gguf" in result.stderr


# --------------------------------------------------------------- list, show


def test_list_and_show(fake_hub: FakeHub) -> None:
    assert invoke(["list"]).stderr.startswith("pardec: no models yet")
    assert json.loads(invoke(["list", "--json"]).stdout) == []
    assert invoke(["pull", "tiny"]).exit_code == 0
    resolve_model("tiny", offline=True)  # counts as a use

    (entry,) = json.loads(invoke(["list", "--json"]).stdout)
    record = records.find("tiny")
    assert record is not None
    assert entry["name"] == "tiny" and entry["alias"] == "tiny" and entry["source"] == "hub"
    assert entry["repo"] == "test-org/tiny-target" and entry["revision"] == "main"
    assert entry["size_bytes"] == sum(
        (snapshot("test-org/tiny-target") / f).stat().st_size for f in MODEL_FILES
    )
    assert entry["last_used"] and entry["complete"]
    assert {(a["name"], a["method"], a["status"]) for a in entry["accelerators"]} == {
        ("tiny-draft", "draft", "compatible"),
        ("test-org/tiny-eagle", "eagle", "compatible"),
        ("test-org/tiny-medusa", "medusa", "compatible"),
    }
    table = invoke(["list"]).stdout.splitlines()
    assert table[0].split() == ["NAME", "ALIAS", "SOURCE", "SIZE", "ACCELERATORS", "LAST", "USED"]
    assert table[1].startswith("tiny ") and "tiny-draft (draft)" in table[1] and "just now" in table[1]

    info = json.loads(invoke(["show", "tiny", "--json"]).stdout)
    assert info["config"]["architecture"] == "LlamaForCausalLM"
    assert info["config"]["layers"] == 2 and info["config"]["context_length"] == 256
    assert info["config"]["vocab_size"] == 136 and info["config"]["chat_template"] is True
    assert info["config"]["parameters_exact"]
    from safetensors import safe_open

    with safe_open(str(snapshot("test-org/tiny-target") / "model.safetensors"), "pt") as weights:
        expected = sum(_numel(weights.get_slice(k).get_shape()) for k in weights.keys())
    assert info["config"]["parameters"] == expected
    assert {f["name"] for f in info["files"]} == MODEL_FILES
    assert info["chat_template_notes"] == "words separated by spaces"
    text = invoke(["show", "tiny"]).stdout
    assert "LlamaForCausalLM (llama)" in text and str(snapshot("test-org/tiny-target")) in text
    assert "tiny-draft  --method draft  compatible" in text


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def test_show_lists_catalog_accelerators_not_pulled(fake_hub: FakeHub) -> None:
    assert invoke(["pull", "tiny", "--no-drafters"]).exit_code == 0
    info = json.loads(invoke(["show", "tiny", "--json"]).stdout)
    assert {a["name"]: a["status"] for a in info["accelerators"]} == {
        "tiny-draft": "not pulled", "test-org/tiny-eagle": "not pulled", "test-org/tiny-medusa": "not pulled",
    }  # fmt: skip


def test_show_a_model_that_is_not_here(fake_hub: FakeHub) -> None:
    # A catalog alias not pulled yet is described from the catalog, with the way to get it.
    result = invoke(["show", "tiny"])
    assert result.exit_code == 0 and "test-org/tiny-target" in result.stdout
    assert "no: `pardec pull tiny` downloads it" in result.stdout
    result = invoke(["show", "zzzz"])
    assert result.exit_code == 1 and "unknown model 'zzzz'" in result.stderr


# ----------------------------------------------------------------------- rm


def _blob_bytes(repo: str) -> int:
    return sum(p.stat().st_size for p in (cache() / ("models--" + repo.replace("/", "--")) / "blobs").iterdir())


def test_rm_removes_what_was_pulled_and_reports_bytes(fake_hub: FakeHub) -> None:
    assert invoke(["pull", "tiny"]).exit_code == 0
    repos = ["test-org/tiny-target", "test-org/tiny-drafter", "test-org/tiny-eagle", "test-org/tiny-medusa"]
    expected = sum(_blob_bytes(r) for r in repos)
    result = invoke(["rm", "tiny", "-y"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"removed tiny (freed {models_cli._size(expected)})\n"
    for repo in repos:
        assert not hub.repo_dir(repo).exists()
    assert records.all_records() == [] and json.loads(invoke(["list", "--json"]).stdout) == []
    with pytest.raises(Exception, match="not available offline"):
        resolve_model("tiny", offline=True)
    again = invoke(["rm", "tiny", "-y"])
    assert again.exit_code == 1 and "not on this machine" in again.stderr


def test_rm_keeps_a_drafter_another_model_uses(fake_hub: FakeHub) -> None:
    assert invoke(["pull", "tiny", "--drafter", "tiny-draft"]).exit_code == 0
    assert invoke(["pull", "tiny2"]).exit_code == 0
    result = invoke(["rm", "tiny", "-y"])
    assert result.exit_code == 0, result.stderr
    assert "keeping tiny-draft (also used by tiny2)" in result.stderr
    assert resolve_model("tiny-draft", offline=True).path == snapshot("test-org/tiny-drafter")
    assert not hub.repo_dir("test-org/tiny-target").exists()
    record = records.find("tiny2")
    assert record is not None and all(r.present() for r in record.repos())


def test_rm_asks_on_a_terminal(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    assert invoke(["pull", "tiny", "--no-drafters"]).exit_code == 0
    monkeypatch.setattr(models_cli, "_stdin_is_terminal", lambda: True)
    declined = invoke(["rm", "tiny"], input="n\n")
    assert declined.exit_code == 1 and "Remove? [y/N]" in declined.stderr and "nothing removed" in declined.stderr
    assert records.find("tiny") is not None and snapshot("test-org/tiny-target").is_dir()
    accepted = invoke(["rm", "tiny"], input="y\n")
    assert accepted.exit_code == 0 and accepted.stdout.startswith("removed tiny")
    assert records.find("tiny") is None


def test_rm_leaves_cache_entries_pardec_did_not_pull(fake_hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download

    hf_hub_download("test-org/tiny-target", "config.json", cache_dir=str(cache()), endpoint=os.environ["HF_ENDPOINT"])
    result = invoke(["rm", "tiny", "-y"])
    assert result.exit_code == 1 and "tiny was not pulled by pardec" in result.stderr
    assert "--hf-cache" in result.stderr and hub.repo_dir("test-org/tiny-target").is_dir()
    forced = invoke(["rm", "tiny", "-y", "--hf-cache"])
    assert forced.exit_code == 0, forced.stderr
    assert not hub.repo_dir("test-org/tiny-target").exists()
    assert not [p for p in cache().iterdir() if p.name.startswith(".pardec-rm-")]


# ------------------------------------------------------------------ import


def write_gguf_header(path: Path, architecture: str) -> Path:
    """A minimal GGUF v3 file: no tensors, one key (general.architecture)."""

    def string(s: str) -> bytes:
        data = s.encode()
        return struct.pack("<Q", len(data)) + data

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    body += string("general.architecture") + struct.pack("<I", 8) + string(architecture)
    path.write_bytes(body)
    return path


def fake_convert(gguf_path: Path, out_dir: Path, **kwargs: object) -> None:
    """Stands in for transformers' dequantization (tested with the real GGUF elsewhere)."""
    (out_dir / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 3}))
    (out_dir / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")


def test_import_list_show_rm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gguf_import, "_convert", fake_convert)
    gguf = write_gguf_header(tmp_path / "My-Model.Q4_K_M.gguf", "llama")
    result = invoke(["import", str(gguf)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("imported my-model.q4_k_m in ") and "(weights in float32)" in result.stdout
    assert "converting My-Model.Q4_K_M.gguf (llama) into my-model.q4_k_m" in result.stderr
    named = invoke(["import", str(gguf), "--name", "mine", "--dtype", "bfloat16"])
    assert named.exit_code == 0, named.stderr
    assert [m["name"] for m in json.loads(invoke(["list", "--json"]).stdout)] == ["mine", "my-model.q4_k_m"]
    info = json.loads(invoke(["show", "mine", "--json"]).stdout)
    assert info["source"] == "gguf" and info["config"]["layers"] == 3
    assert info["marker"]["dtype"] == "bfloat16" and info["marker"]["gguf"] == str(gguf.resolve())
    assert resolve_model("mine").source == "store"

    taken = invoke(["import", str(gguf), "--name", "mine"])
    assert taken.exit_code == 1 and "already exists" in taken.stderr
    removed = invoke(["rm", "mine", "my-model.q4_k_m", "-y"])
    assert removed.exit_code == 0, removed.stderr
    assert removed.stdout.splitlines()[-1].startswith("freed ")
    assert list(models_dir().iterdir()) == []  # no hidden leftovers either



def test_import_starts_the_native_step_s_kernels_building_before_it_converts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The conversion takes one core for tens of seconds: the kernels that run the GGUF's
    blocks build beside it, once, and the user is told (not with -q, nor where none start)."""
    from pardec_cli.store import loading

    events: list[str] = []
    monkeypatch.setattr(loading, "start_native_build", lambda: events.append("build") or True)
    monkeypatch.setattr(gguf_import, "_convert", lambda *args, **kwargs: events.append("convert") or fake_convert(*args, **kwargs))
    gguf = write_gguf_header(tmp_path / "My-Model.Q4_K_M.gguf", "llama")
    result = invoke(["import", str(gguf)])
    assert result.exit_code == 0, result.stderr
    assert events == ["build", "convert"] and "building pardec's AVX2 kernels" in result.stderr
    monkeypatch.setattr(loading, "start_native_build", lambda: False)  # built already, or not this CPU
    again = invoke(["import", str(gguf), "--name", "again"])
    assert again.exit_code == 0 and "building" not in again.stderr

def test_import_errors(tmp_path: Path) -> None:
    missing = invoke(["import", str(tmp_path / "nope.gguf")])
    assert missing.exit_code == 1 and "GGUF file not found" in missing.stderr
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("not a gguf")
    result = invoke(["import", str(bogus)])
    assert result.exit_code == 1 and "not a GGUF file" in result.stderr
    bad_name = invoke(["import", str(write_gguf_header(tmp_path / "m.gguf", "llama")), "--name", "../x"])
    assert bad_name.exit_code == 2 and "invalid model name" in bad_name.stderr
    assert not models_dir().exists() or list(models_dir().iterdir()) == []


@pytest.mark.slow  # a subprocess
def test_listing_commands_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from pardec_cli.cli.main import run\n"
        "for args in (['list'], ['list', '--json'], ['show', 'nothing'], ['rm', 'nothing', '-y'], ['pull', '--help']):\n"
        "    run(args)\n"
        "heavy = [m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
