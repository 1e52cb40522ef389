"""The fault suite: pardec under faults and abuse, not only bad flags (issue 17).

Every case ends in a correct result or one clear error line with the documented exit
code; none in a traceback, a silently wrong result, a lost file or a file left behind.
Each test function is named after its category (test_<category>[_...]), parametrized
over the cases, so the matrix counts with:

    pytest tests/test_faults.py --collect-only -q | grep :: | sed 's/.*::test_//; s/[_[].*//' | sort | uniq -c

Categories:
  hub        the fake Hub drops a connection, answers 500, serves a damaged or short file
  disk       files damaged on disk after a pull: `list` says so, the next pull repairs them
  rm         `rm` against crafted records and links: never deletes outside its folders
  weights    weights that do not fit the config: a load error, not random tensors
  kill       kill -9 and SIGTERM during import, pull and train-heads, then the next command
  concurrent two writers of each state file at once: nothing lost, nothing torn
  fs         read-only, full and misplaced PARDEC_HOME
  corrupt    every state file broken in syntax and in shape, against the commands reading it
  text       invalid UTF-8 and lone surrogates in every prompt path
  number     nan, inf and out-of-range numbers in flags, profiles and knobs
  misc       the small lies: --seed when greedy, a model removed while loading, time zones
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pardec_cli.home import models_dir, pardec_home
from pardec_cli.store import gguf_import, hub, layout, records
from tests.cli_helpers import CliResult, invoke
from tests.fake_hub import FakeHub, fake_hub, tiny_repos  # noqa: F401 (fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGET = "test-org/tiny-target"
TARGET_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja"]  # fmt: skip


def assert_clean(result: CliResult, *codes: int) -> None:
    """No traceback; an allowed exit code; a failure is one error line (plus a hint)."""
    allowed = codes or (0, 1, 2)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    assert result.exit_code in allowed, (result.exit_code, result.stderr)
    if result.exit_code not in (0,):
        errors = [line for line in result.stderr.splitlines() if line.startswith(("pardec: error:", "Error:"))]
        assert len(errors) == 1, result.stderr
        hints = [line for line in result.stderr.splitlines() if line.startswith("pardec: hint:")]
        assert len(hints) <= 1, result.stderr


def leftovers(folder: Path) -> list[str]:
    """Hidden scratch files and folders pardec may leave: staging, temporary, partial."""
    if not folder.exists():
        return []
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*")
        if (".tmp-" in p.name or ".old-" in p.name or ".rm-" in p.name or p.name.endswith((".tmp", ".incomplete")))
    )  # fmt: skip


def snapshot(repo: str = TARGET) -> Path:
    commit = hub.read_ref(repo, "main")
    assert commit is not None, f"{repo} has no refs/main"
    return hub.snapshot_dir(repo, commit)


def pull(*extra: str) -> CliResult:
    return invoke(["pull", "tiny", "--no-drafters", *extra])


def served(fake: FakeHub, name: str, repo: str = TARGET) -> bytes:
    return fake.repos[repo]["main"][1][name]


# ======================================================================== hub

HUB_FAULTS = ["drop", "error500-once", "error500-always", "corrupt-once", "corrupt-always", "short-once"]


@pytest.mark.parametrize("name", TARGET_FILES)
@pytest.mark.parametrize("fault", HUB_FAULTS)
def test_hub(fake_hub: FakeHub, fault: str, name: str) -> None:
    """A faulty download ends in a correct pull (after a retry if need be) or one clear
    error with nothing registered; a second pull then completes with the Hub's bytes."""
    size = len(served(fake_hub, name))
    if fault == "drop":
        fake_hub.drop_once[name] = size // 2
    elif fault == "error500-once":
        fake_hub.fail[name] = [500]
    elif fault == "error500-always":
        fake_hub.fail[name] = [500] * 50
    elif fault == "corrupt-once":
        fake_hub.corrupt[name] = 1
    elif fault == "corrupt-always":
        fake_hub.corrupt[name] = 50
    elif fault == "short-once":
        fake_hub.short[name] = 1
    first = pull()
    assert_clean(first, 0, 1)
    if first.exit_code:
        assert records.find("tiny") is None and hub.read_ref(TARGET, "main") is None  # nothing registered
        assert fault in ("error500-once", "error500-always", "corrupt-always", "short-once"), first.stderr
    if fault == "corrupt-always":
        assert first.exit_code == 1 and "corrupt" in first.stderr
    if fault == "corrupt-once":
        assert first.exit_code == 0 and "damaged" in first.stderr  # detected and fetched again
    fake_hub.fail.clear()
    fake_hub.corrupt.clear()
    fake_hub.short.clear()
    second = pull()
    assert_clean(second, 0)
    for file in TARGET_FILES:
        assert (snapshot() / file).read_bytes() == served(fake_hub, file), file
    assert leftovers(hub.cache_root()) == []
    assert records.find("tiny").target.present()


# ======================================================================= disk

DAMAGE = ["truncate", "flip", "delete"]


@pytest.mark.parametrize("name", TARGET_FILES)
@pytest.mark.parametrize("damage", DAMAGE)
def test_disk(fake_hub: FakeHub, damage: str, name: str) -> None:
    """A pulled file damaged later: `list` does not call the model healthy, and the next
    pull finds it, fetches it again and is whole (not "up to date")."""
    assert pull().exit_code == 0
    file = (snapshot() / name).resolve()  # the blob behind the snapshot link
    data = file.read_bytes()
    if damage == "truncate":
        file.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        file.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    else:
        (snapshot() / name).unlink()
    listed = invoke(["list", "--json"])
    assert_clean(listed, 0)
    complete = json.loads(listed.stdout)[0]["complete"]
    assert complete is (damage == "flip")  # a same-size change is only seen by the hash, on pull
    again = pull()
    assert_clean(again, 0)
    assert "up to date" not in again.stderr
    assert (snapshot() / name).read_bytes() == served(fake_hub, name)
    assert json.loads(invoke(["list", "--json"]).stdout)[0]["complete"] is True


# ========================================================================= rm


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "decoy" / "victim.txt"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("precious")
    return victim


RM_ATTACKS = ["record-dotdot", "record-absolute", "link-to-outside", "link-dir-outside",
              "blob-link-outside", "store-entry-link", "repo-folder-link"]  # fmt: skip


@pytest.mark.parametrize("attack", RM_ATTACKS)
def test_rm(fake_hub: FakeHub, tmp_path: Path, attack: str) -> None:
    """`rm` removes only what lies in the folders it owns, whatever records and links say."""
    victim = _victim(tmp_path)
    assert pull().exit_code == 0
    snap = snapshot()
    record_file = records.records_dir() / "tiny.json"
    data = json.loads(record_file.read_text())
    if attack == "record-dotdot":
        depth = len(snap.relative_to(tmp_path).parts)
        data["target"]["files"]["/".join([".."] * depth) + "/decoy/victim.txt"] = 8
        record_file.write_text(json.dumps(data))
    elif attack == "record-absolute":
        data["target"]["files"][str(victim)] = 8
        record_file.write_text(json.dumps(data))
    elif attack == "link-to-outside":
        (snap / "tokenizer.json").unlink()
        (snap / "tokenizer.json").symlink_to(victim)
    elif attack == "link-dir-outside":
        (snap / "sub").symlink_to(victim.parent, target_is_directory=True)
        data["target"]["files"]["sub/victim.txt"] = 8
        record_file.write_text(json.dumps(data))
    elif attack == "blob-link-outside":
        blob = (snap / "config.json").resolve()
        blob.unlink()
        blob.symlink_to(victim)
    elif attack == "store-entry-link":
        outside = tmp_path / "elsewhere" / "mine"
        outside.mkdir(parents=True)
        (outside / "config.json").write_text("{}")
        (outside / "big.bin").write_bytes(b"x" * 5000)
        (outside / layout.MARKER_NAME).write_text("{}")
        models_dir().mkdir(parents=True, exist_ok=True)
        (models_dir() / "mine").symlink_to(outside, target_is_directory=True)
        result = invoke(["rm", "mine", "-y"])
        assert_clean(result, 0)
        assert "freed 0 B" in result.stdout and "only the link" in result.stderr
        assert (outside / "big.bin").is_file() and not (models_dir() / "mine").exists()
        return
    elif attack == "repo-folder-link":
        real = hub.repo_dir(TARGET)
        moved = tmp_path / "moved-repo"
        shutil.move(str(real), moved)
        real.symlink_to(moved, target_is_directory=True)
        (moved / "keep.txt").write_text("mine")
        result = invoke(["rm", "tiny", "-y", "--hf-cache"])
        assert_clean(result, 0, 1)
        assert (moved / "keep.txt").is_file()
        assert victim.read_text() == "precious"
        return
    result = invoke(["rm", "tiny", "-y"])
    assert_clean(result, 0)
    assert victim.read_text() == "precious"
    if attack in ("record-dotdot", "record-absolute"):
        # A record naming a path out of its folder is not a valid record: only it goes.
        assert "broken pull record" in result.stderr
    elif attack in ("link-to-outside", "link-dir-outside", "blob-link-outside"):
        assert "warning:" in result.stderr and "outside" in result.stderr
    assert records.find("tiny") is None and not record_file.exists()


# ==================================================================== weights


def _tiny_checkpoint(path: Path, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=136, max_position_embeddings=256, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    for file in tokenizer_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, path / file.name)
    return path


WEIGHT_FAULTS = ["renamed-tensor", "dropped-tensor", "extra-tensor", "more-layers", "fewer-layers", "wrong-shape"]


@pytest.mark.parametrize("fault", WEIGHT_FAULTS)
def test_weights(fake_hub: FakeHub, tmp_path: Path, fault: str) -> None:
    """Weights that do not fill the model exactly are a load error naming the tensors."""
    import torch
    from safetensors.torch import load_file, save_file

    assert pull().exit_code == 0
    model = _tiny_checkpoint(tmp_path / "model", snapshot())
    weights = model / "model.safetensors"
    tensors = load_file(weights)
    config = json.loads((model / "config.json").read_text())
    key = "model.layers.0.self_attn.q_proj.weight"
    if fault == "renamed-tensor":
        tensors["model.layers.0.self_attn.qq_proj.weight"] = tensors.pop(key)
    elif fault == "dropped-tensor":
        del tensors[key]
    elif fault == "extra-tensor":
        tensors["model.layers.0.extra.weight"] = torch.zeros(2, 2)
    elif fault == "more-layers":
        config["num_hidden_layers"] = 3
    elif fault == "fewer-layers":
        config["num_hidden_layers"] = 1
    elif fault == "wrong-shape":
        tensors[key] = torch.zeros(16, 32)
    save_file(tensors, weights, metadata={"format": "pt"})
    (model / "config.json").write_text(json.dumps(config))
    result = invoke(["gen", "-m", str(model), "-n", "2", "--method", "vanilla", "hello"])
    assert_clean(result, 1)
    assert result.stdout == ""
    if fault != "wrong-shape":
        assert "do not match its config.json" in result.stderr


# ======================================================================= kill

_SLOW_IMPORT = """
import sys, time
from pathlib import Path
from pardec_cli.store import gguf_import
def slow(gguf_path, out_dir, **kwargs):
    (out_dir / "config.json").write_text("{}")
    (out_dir / "model.safetensors").write_bytes(b"x" * 100000)
    print("STAGED", flush=True)
    time.sleep(60)
gguf_import._convert = slow
from pardec_cli.cli.main import run
sys.exit(run(sys.argv[1:]))
"""

_SLOW_HEADS = """
import sys, time
from pathlib import Path
from pardec_cli.store.heads import replace_dir, trained_heads_dir
def write(tmp):
    (tmp / "config.json").write_text("{}")
    (tmp / "heads.safetensors").write_bytes(b"x" * 100000)
    print("STAGED", flush=True)
    time.sleep(60)
replace_dir(trained_heads_dir("tiny", "medusa"), write)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def _wait_for(predicate: Callable[[], bool], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _kill_after_staged(code: str, args: list[str], sig: int) -> tuple[int, str]:
    process = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "STAGED" in line, process.stderr.read() if process.stderr else ""
        process.send_signal(sig)
        _out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, err


def _write_gguf(path: Path) -> Path:
    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("general.architecture") + struct.pack("<I", 8) + string("llama")
    path.write_bytes(body)
    return path


@pytest.mark.slow  # processes killed mid-write
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_kill_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int) -> None:
    """An import killed mid-conversion leaves no model; SIGTERM cleans its staging folder
    at once, and after kill -9 the next command removes the stale one."""
    gguf = _write_gguf(tmp_path / "m.gguf")
    code, err = _kill_after_staged(_SLOW_IMPORT, ["import", str(gguf), "--name", "mine"], sig)
    assert "Traceback" not in err
    if sig == signal.SIGTERM:
        assert code == 143 and leftovers(models_dir()) == []
    else:
        assert code == -9 and leftovers(models_dir()) != []  # what kill -9 leaves...
    assert_clean(invoke(["list"]), 0)
    assert leftovers(models_dir()) == [] and not (models_dir() / "mine").exists()  # ...the next command removes
    monkeypatch.setattr(gguf_import, "_convert", lambda g, out, **k: (out / "config.json").write_text("{}"))
    assert_clean(invoke(["import", str(gguf), "--name", "mine"]), 0)
    assert layout.installed_models() == ["mine"] and leftovers(models_dir()) == []


@pytest.mark.slow  # processes killed mid-write
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_kill_train_heads(sig: int) -> None:
    """Heads killed while being written: none are half-installed, nothing is left behind."""
    from pardec_cli.store.heads import heads_root, trained_heads_dir

    code, err = _kill_after_staged(_SLOW_HEADS, [], sig)
    assert "Traceback" not in err
    assert code == (143 if sig == signal.SIGTERM else -9)
    assert not trained_heads_dir("tiny", "medusa").exists()
    assert_clean(invoke(["list"]), 0)
    from pardec_cli.store.heads import replace_dir

    replace_dir(trained_heads_dir("tiny", "medusa"), lambda tmp: (tmp / "config.json").write_text("{}"))
    assert leftovers(heads_root()) == [] and (trained_heads_dir("tiny", "medusa") / "config.json").is_file()


@pytest.mark.slow  # processes killed mid-write
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_kill_pull(fake_hub: FakeHub, sig: int) -> None:
    """A pull killed mid-file registers nothing; the next pull completes and checks out."""
    fake_hub.stall["model.safetensors"] = 2000
    process = subprocess.Popen([sys.executable, "-m", "pardec_cli", "pull", "tiny", "--no-drafters"],
                               cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert fake_hub.stalled.wait(120), "the pull never reached the weights"
        process.send_signal(sig)
        _out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert "Traceback" not in err
    assert records.find("tiny") is None and hub.read_ref(TARGET, "main") is None
    fake_hub.stall.clear()
    fake_hub.release.set()
    result = pull()
    assert_clean(result, 0)
    assert (snapshot() / "model.safetensors").read_bytes() == served(fake_hub, "model.safetensors")
    assert leftovers(hub.cache_root()) == []


# ================================================================= concurrent


def _in_processes(work: Callable[[int], None], writers: int = 3) -> None:
    """Run `work(i)` in `writers` forked processes at once; each must exit 0."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start = context.Barrier(writers)

    def body(i: int) -> None:
        start.wait(30)
        work(i)

    processes = [context.Process(target=body, args=(i,)) for i in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0] * writers


def _results(profile: str, value: float) -> object:
    from pardec_cli.selection.tuned import TunedCandidate, TunedProfile, TunedResults

    candidate = TunedCandidate("pld", {}, value, 1.0, 0.1, 10.0 * value, value, 3, 3)
    return TunedResults("tiny", "sha256:abc", "cpu", "float32",
                        profiles={profile: TunedProfile(profile, [candidate], best="pld", complete=True)})  # fmt: skip


def _record(name: str) -> records.PullRecord:
    rec = records.RepoRecord(TARGET, "main", "a" * 40, str(hub.cache_root()), {"config.json": 10})
    return records.PullRecord(name, rec)


CONCURRENT = ["usage-touch", "usage-touch-forget", "records-distinct", "records-same", "tuned-profiles",
              "tuned-same-profile", "store-import", "heads-dir", "hf-ref"]  # fmt: skip


@pytest.mark.slow  # processes killed mid-write
@pytest.mark.parametrize("case", CONCURRENT)
def test_concurrent(case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two or more writers of one state file at once: every writer's part survives, and
    the file is whole and valid (written atomically under a lock)."""
    from pardec_cli.selection.tuned import all_results, broken_results, write_results

    rounds = 15
    if case == "usage-touch":
        _in_processes(lambda i: [records.touch(f"model-{i}-{n}") for n in range(rounds)])
        assert len(records.usage()) == 3 * rounds
    elif case == "usage-touch-forget":
        for n in range(rounds):
            records.touch(f"old-{n}")
        _in_processes(lambda i: [records.touch(f"new-{n}") if i else records.forget(f"old-{n}") for n in range(rounds)], 2)
        assert sorted(records.usage()) == sorted(f"new-{n}" for n in range(rounds))
    elif case == "records-distinct":
        _in_processes(lambda i: [records.save(_record(f"m{i}-{n}")) for n in range(5)])
        assert len(records.all_records()) == 15 and records.broken_records() == []
    elif case == "records-same":
        _in_processes(lambda i: [records.save(_record("same")) for _ in range(rounds)])
        assert [r.name for r in records.all_records()] == ["same"] and records.broken_records() == []
    elif case == "tuned-profiles":
        _in_processes(lambda i: [write_results(_results(f"p{i}", 1.0 + n)) for n in range(rounds)])
        (results,) = all_results()
        assert sorted(results.profiles) == ["p0", "p1", "p2"]
    elif case == "tuned-same-profile":
        _in_processes(lambda i: [write_results(_results("code", 1.0 + i)) for _ in range(rounds)])
        (results,) = all_results()
        assert list(results.profiles) == ["code"] and broken_results() == []
    elif case == "store-import":
        monkeypatch.setattr(gguf_import, "_convert", lambda g, out, **k: (out / "config.json").write_text("{}"))
        gguf = _write_gguf(tmp_path / "m.gguf")
        _in_processes(lambda i: gguf_import.import_gguf(gguf, "mine", overwrite=True))
        assert layout.installed_models() == ["mine"]
    elif case == "heads-dir":
        from pardec_cli.store.heads import heads_root, replace_dir, trained_heads_dir

        folder = trained_heads_dir("tiny", "eagle")

        def write(i: int) -> None:
            for n in range(5):
                replace_dir(folder, lambda tmp, n=n: (tmp / "config.json").write_text(json.dumps({"writer": i, "n": n})))

        _in_processes(write)
        assert json.loads((folder / "config.json").read_text())["n"] == 4
        assert leftovers(heads_root()) == []
    elif case == "hf-ref":
        _in_processes(lambda i: [hub.write_ref(TARGET, "main", f"{i}" * 40) for _ in range(rounds)])
        assert hub.read_ref(TARGET, "main") in {f"{i}" * 40 for i in range(3)}
    assert leftovers(pardec_home()) == [] and leftovers(hub.cache_root()) == []
    assert not list(pardec_home().rglob(".*.tmp")) if pardec_home().exists() else True


# ========================================================================= fs


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount small tmpfs folders (needs root and mount: skipped otherwise)."""
    mounted: list[Path] = []

    def mount(name: str, size: str = "256k", read_only: bool = False) -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True, exist_ok=True)
        options = f"size={size}" + (",ro" if read_only else "")
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _big_convert(gguf_path: Path, out_dir: Path, **kwargs: object) -> None:
    (out_dir / "config.json").write_text("{}")
    (out_dir / "model.safetensors").write_bytes(b"x" * (2 << 20))  # more than the tmpfs holds


def _small_convert(gguf_path: Path, out_dir: Path, **kwargs: object) -> None:
    (out_dir / "config.json").write_text("{}")


FS_PLACES = ["readonly-home", "full-home", "home-is-a-file", "readonly-hf-cache", "full-hf-cache"]
FS_COMMANDS = ["import", "pull", "list", "gen-dir", "first-run-conversion", "tune-reset", "rm"]


@pytest.mark.slow  # processes killed mid-write
@pytest.mark.parametrize("command", FS_COMMANDS)
@pytest.mark.parametrize("place", FS_PLACES)
def test_fs(place: str, command: str, fake_hub: FakeHub, tmpfs: Callable[..., Path], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch, tiny_cli_model: Path) -> None:  # fmt: skip
    """Where pardec writes is read-only, full, or a file: one clear line (or success when
    the command needs no writing), and nothing half-written is registered."""
    from pardec_cli.store import embedded

    gguf = _write_gguf(tmp_path / "m.gguf")
    monkeypatch.setattr(gguf_import, "_convert", _big_convert if place.startswith("full") else _small_convert)
    if place == "readonly-home":
        monkeypatch.setenv("PARDEC_HOME", str(tmpfs("home", read_only=True)))
    elif place == "full-home":
        home = tmpfs("home")
        try:  # fill it up: every later write fails
            with open(home / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        monkeypatch.setenv("PARDEC_HOME", str(home))
    elif place == "home-is-a-file":
        (tmp_path / "home-file").write_text("not a folder")
        monkeypatch.setenv("PARDEC_HOME", str(tmp_path / "home-file"))
    elif place == "readonly-hf-cache":
        monkeypatch.setenv("HF_HUB_CACHE", str(tmpfs("hf", read_only=True)))
    elif place == "full-hf-cache":
        monkeypatch.setenv("HF_HUB_CACHE", str(tmpfs("hf", size="64k")))
        monkeypatch.setattr(hub, "free_bytes", lambda path: 1 << 40)  # the pre-check is fooled: the write fails
    if command == "import":
        result = invoke(["import", str(gguf), "--name", "mine"])
    elif command == "pull":
        result = pull()
    elif command == "list":
        result = invoke(["list"])
    elif command == "gen-dir":
        result = invoke(["gen", "-m", str(tiny_cli_model), "-n", "2", "--method", "vanilla", "hi"])
    elif command == "first-run-conversion":
        monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: gguf)
        result = invoke(["gen", "-n", "2", "--method", "vanilla", "hi"])
    elif command == "tune-reset":
        result = invoke(["tune", "--reset", "-m", str(tiny_cli_model)])
    else:
        result = invoke(["rm", "tiny", "-y"])
    assert_clean(result)
    home_writes = command in ("import", "first-run-conversion") or (command == "pull" and "home" in place)
    cache_writes = command == "pull" and "hf-cache" in place
    if home_writes and place in ("readonly-home", "full-home", "home-is-a-file"):
        assert result.exit_code == 1 and "Traceback" not in result.stderr
    if cache_writes:
        assert result.exit_code == 1
        assert records.find("tiny") is None and hub.read_ref(TARGET, "main") is None
    if command in ("list", "gen-dir", "tune-reset") and place != "home-is-a-file":
        assert result.exit_code == 0, result.stderr  # reading commands work, writing nothing vital
    home = Path(os.environ["PARDEC_HOME"])
    if home.is_dir():
        assert leftovers(home) == [] and set(layout.installed_models()) <= {"mine", "smollm2-135m"}
        if home_writes and result.exit_code and "home" in place:
            assert layout.installed_models() == [] and records.find("tiny") is None
        for name in layout.installed_models():
            assert layout.damaged_files(home / "models" / name) == []


# ==================================================================== corrupt


def _populate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Path]:
    """A home with one of each state file: a pulled model, an imported one, usage, tuned
    results, a user profile, trained heads' marker, config and catalog."""
    from pardec_cli.config import config_path
    from pardec_cli.selection.profiles import user_profiles_dir
    from pardec_cli.store.heads import model_key, trained_heads_dir
    from pardec_cli.selection.tuned import write_results

    assert pull().exit_code == 0
    monkeypatch.setattr(gguf_import, "_convert", _small_convert)
    gguf_import.import_gguf(_write_gguf(tmp_path / "m.gguf"), "mine")
    records.touch("tiny")
    results = _results("code", 2.0)
    results.model = "tiny"
    tuned = write_results(results)
    profile = user_profiles_dir() / "code.toml"
    profile.parent.mkdir(parents=True, exist_ok=True)
    profile.write_text("[sampling]\ntemperature = 0.0\n")
    heads = trained_heads_dir(model_key("tiny"), "medusa")
    heads.mkdir(parents=True)
    (heads / "config.json").write_text("{}")
    (heads / "pardec-heads.json").write_text(json.dumps({"steps": 3, "eval": {"top1_per_head": [0.5]}}))
    config_path().write_text("[gen]\nmax_tokens = 4\n")
    return {
        "record": records.records_dir() / "tiny.json", "usage": pardec_home() / "usage.json", "tuned": tuned,
        "config": config_path(), "profile": profile, "marker": models_dir() / "mine" / layout.MARKER_NAME,
        "heads": heads / "pardec-heads.json", "catalog": config_path().parent / "catalog.toml",
        "ref": hub.repo_dir(TARGET) / "refs" / "main",
    }  # fmt: skip


_SYNTAX = {"garbage": b"\x00\xff{[not it", "truncated": b'{"format": 1, "na', "empty": b"", "bad-utf8": b'{"a": "\xff\xfe"}'}
CORRUPTIONS: dict[str, tuple[str, bytes | str]] = {
    **{f"record-{k}": ("record", v) for k, v in _SYNTAX.items()},
    "record-list": ("record", "[1, 2]"),
    "record-files-list": ("record", "SHAPE:target.files=[1]"),
    "record-size-string": ("record", 'SHAPE:target.files={"config.json": "big"}'),
    "record-commit": ("record", 'SHAPE:target.commit="../../x"'),
    "record-repo": ("record", 'SHAPE:target.repo="../../../etc"'),
    "record-no-target": ("record", "SHAPE:target=null"),
    "record-accelerators": ("record", 'SHAPE:accelerators={"a": 1}'),
    **{f"usage-{k}": ("usage", v) for k, v in _SYNTAX.items()},
    "usage-list": ("usage", "[1]"),
    "usage-values": ("usage", '{"tiny": 5, "x": null}'),
    "tuned-garbage": ("tuned", b"\x00\xff[[["),
    "tuned-profiles-list": ("tuned", 'format = 1\nmodel = "tiny"\nfingerprint = "f"\ndevice = "cpu"\ndtype = "float32"\nprofiles = [1]\n'),
    "tuned-candidate-types": ("tuned", 'format = 1\nmodel = "tiny"\nfingerprint = "f"\ndevice = "cpu"\ndtype = "float32"\n'
                              '[[profiles.code.candidates]]\nmethod = 3\nspeedup = "fast"\n'),
    "tuned-nan": ("tuned", 'format = 1\nmodel = "tiny"\nfingerprint = "f"\ndevice = "cpu"\ndtype = "float32"\n'
                  '[[profiles.code.candidates]]\nmethod = "pld"\ntokens_per_step = nan\ndrafted = 1.0\ndraft_ms = 1.0\n'
                  'tokens_per_s = inf\nspeedup = 1.0\nprompts = 1\nmatched = 1\n'),
    "tuned-runs": ("tuned", 'format = 1\nmodel = "tiny"\nfingerprint = "f"\ndevice = "cpu"\ndtype = "float32"\n[runs]\ncode = [[1]]\n'),
    "tuned-curve": ("tuned", 'format = 1\nmodel = "tiny"\nfingerprint = "f"\ndevice = "cpu"\ndtype = "float32"\n[curve]\nsource = "x"\nms = { a = "b" }\n'),
    "tuned-missing-keys": ("tuned", "format = 1\n"),
    "config-garbage": ("config", b"[gen\nmax_tokens = = 4"),
    "config-type": ("config", '[gen]\nmax_tokens = "many"\n'),
    "config-list": ("config", "[gen]\ntemperature = [1, 2]\n"),
    "config-nan": ("config", "[gen]\ntemperature = nan\n"),
    "config-inf": ("config", "top_p = inf\n"),
    "config-bad-number": ("config", "[gen]\ntop_p = 7.5\n"),
    "config-table": ("config", "[gen]\nmethod = { a = 1 }\n"),
    "config-unknown-table": ("config", "[nope]\nx = 1\n"),
    "profile-garbage": ("profile", b"[sampling\n"),
    "profile-sampling-number": ("profile", "sampling = 5\n"),
    "profile-nan": ("profile", "[sampling]\ntemperature = nan\n"),
    "profile-inf": ("profile", "[sampling]\ntop_p = inf\n"),
    "profile-candidates": ("profile", '[candidates]\ncpu = "pld"\n'),
    "profile-candidate-nan": ("profile", '[[candidates.cpu]]\nmethod = "pld"\ntokens_per_step = nan\n'),
    "marker-garbage": ("marker", b"\x00{"),
    "marker-list": ("marker", "[]"),
    "marker-files": ("marker", '{"format": 1, "files": {"config.json": "x", "../../x": 1}}'),
    "heads-garbage": ("heads", b"{{{"),
    "heads-eval": ("heads", '{"steps": "x", "eval": {"top1_per_head": ["a", null]}}'),
    "heads-eval-nan": ("heads", '{"eval": {"top1_per_depth": [NaN, Infinity]}}'),
    "catalog-garbage": ("catalog", b"[models.tiny\n"),
    "catalog-shape": ("catalog", '[models.tiny]\nrepo = 5\ndrafters = "x"\n'),
    "ref-traversal": ("ref", "../../../../etc"),
    "ref-empty": ("ref", ""),
}
CORRUPT_COMMANDS = {
    "list": ["list", "--json"], "show": ["show", "tiny"], "gen": ["gen", "-m", "tiny", "hi"],
    "doctor": ["doctor", "-m", "tiny", "--json"], "tune-show": ["tune", "--show"],
    "tune-reset": ["tune", "--reset", "-m", "tiny"], "rm": ["rm", "tiny", "-y"],
}  # fmt: skip


def _corrupt(file: Path, content: bytes | str) -> None:
    if isinstance(content, str) and content.startswith("SHAPE:"):
        path, _, value = content[len("SHAPE:"):].partition("=")
        data = json.loads(file.read_text())
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = json.loads(value)
        file.write_text(json.dumps(data))
    elif isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content)


@pytest.mark.parametrize("command", list(CORRUPT_COMMANDS))
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt(corruption: str, command: str, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch,
                 tmp_path: Path) -> None:  # fmt: skip
    """A state file broken in syntax or shape: every command that reads it ends in one
    line naming the file (or works around it, saying so), never a traceback; the
    documented fix (`tune --reset`, `rm`) works on the broken file."""
    files = _populate(monkeypatch, tmp_path)
    kind, content = CORRUPTIONS[corruption]
    _corrupt(files[kind], content)
    result = invoke(CORRUPT_COMMANDS[command])
    assert_clean(result)
    if result.exit_code and kind in ("record", "tuned", "config", "profile", "catalog"):
        assert str(files[kind]) in result.stderr or files[kind].name in result.stderr, result.stderr
    if command == "list" and kind == "record":
        assert str(files["record"]) in result.stderr  # named, not silently skipped
    if command == "tune-reset" and kind == "tuned":
        assert result.exit_code == 0 and not files["tuned"].exists()
    if command == "rm" and kind == "record":
        assert result.exit_code == 0 and not files["record"].exists()
    if command == "tune-show" and kind == "tuned":
        assert result.exit_code == 0 and str(files["tuned"]) in result.stderr
    assert leftovers(pardec_home()) == []


# ======================================================================= text


def _gen_bytes(args: list[str], stdin: bytes | None = None) -> tuple[int, bytes, str]:
    """`pardec gen ARGS` in-process with raw bytes on stdin; (exit code, stdout bytes, stderr)."""
    from click.testing import CliRunner

    from pardec_cli.cli.main import run

    with CliRunner().isolation(input=stdin) as (out, err, _mixed):
        code = run(["gen", *args])
    return code, out.getvalue(), err.getvalue().decode("utf-8", "replace")


BAD_TEXT = {"not-utf8": "caf\udce9 ok", "lone-low": "x \udcff y", "lone-high": "x \ud83d y"}
TEXT_PATHS = ["argument", "argument-and-stdin", "stdin", "stdin-dash", "each-line", "prompts-stdin-json",
              "prompts-file-json", "prompts-file-bytes", "system", "stop", "json-output", "raw"]  # fmt: skip


@pytest.mark.parametrize("path", TEXT_PATHS)
@pytest.mark.parametrize("bad", list(BAD_TEXT))
def test_text(bad: str, path: str, tiny_cli_model: Path, tmp_path: Path) -> None:
    """Text that is not valid Unicode, wherever a prompt comes in: the rule is that each
    bad byte or lone surrogate becomes U+FFFD and the prompt runs; stdout stays UTF-8."""
    text = BAD_TEXT[bad]
    raw = text.encode("utf-8", "surrogateescape") if bad == "not-utf8" else text.encode("utf-8", "surrogatepass")
    base = ["-m", str(tiny_cli_model), "-n", "2", "--method", "vanilla"]
    stdin = None
    batch = False
    if path == "argument":
        args = [*base, text]
    elif path == "argument-and-stdin":
        args, stdin = [*base, text], raw + b"\n"
    elif path == "stdin":
        args, stdin = base, raw
    elif path == "stdin-dash":
        args, stdin = [*base, "-"], raw
    elif path == "each-line":
        args, stdin, batch = [*base, "--each-line"], b"first\n" + raw + b"\nlast\n", True
    elif path == "prompts-stdin-json":
        line = json.dumps({"id": text, "prompt": text}, ensure_ascii=True).encode()
        args, stdin, batch = [*base, "--prompts", "-"], b'"first"\n' + line + b"\n", True
    elif path in ("prompts-file-json", "prompts-file-bytes"):
        file = tmp_path / "prompts.jsonl"
        encoded = json.dumps({"prompt": text}, ensure_ascii=True).encode() if path == "prompts-file-json" else \
            b'{"prompt": "' + raw + b'"}'
        file.write_bytes(b'"first"\n' + encoded + b"\n")
        args, batch = [*base, "--prompts", str(file)], True
    elif path == "system":
        args = [*base, "-s", text, "hello"]
    elif path == "stop":
        args = [*base, "--stop", text, "hello"]
    elif path == "json-output":
        args = [*base, "--json", text]
    else:
        args = [*base, "--raw", text]
    code, out, err = _gen_bytes(args, stdin)
    assert "Traceback" not in err
    assert code == 0, err
    decoded = out.decode("utf-8")  # strict: never a surrogate or a stray byte on stdout
    if batch:
        rows = [json.loads(line) for line in decoded.splitlines()]
        assert len(rows) == (3 if path == "each-line" else 2) and all("error" not in r for r in rows)
        assert "\ufffd" in rows[1]["prompt"] and rows[-1]["text"] is not None
    elif path == "json-output":
        assert json.loads(decoded)["text"] is not None


@pytest.mark.parametrize("where", ["middle", "first", "last"])
def test_text_bad_json_line_on_stdin(where: str, tiny_cli_model: Path) -> None:
    """A JSONL line on stdin that is not a prompt gets its error line; the others run; exit 1."""
    lines = [b'"one"', b'"two"', b'"three"']
    index = {"first": 0, "middle": 1, "last": 2}[where]
    lines[index] = b'{"prompt": \xff broken'
    code, out, err = _gen_bytes(["-m", str(tiny_cli_model), "-n", "2", "--method", "vanilla", "--prompts", "-"],
                                b"\n".join(lines) + b"\n")  # fmt: skip
    assert "Traceback" not in err and code == 1
    rows = [json.loads(line) for line in out.decode("utf-8").splitlines()]
    assert [("error" in r) for r in rows] == [i == index for i in range(3)]
    assert "1 of 3 prompts failed" in err


# ===================================================================== number

NUMBER_CASES = {
    "temp-nan": (["gen", "--temp", "nan", "hi"], "--temp"),
    "temp-inf": (["gen", "--temp", "inf", "hi"], "--temp"),
    "temp-minus-inf": (["gen", "--temp", "-inf", "hi"], "--temp"),
    "temp-huge": (["gen", "--temp", "1e999", "hi"], "--temp"),
    "top-p-nan": (["gen", "--top-p", "nan", "hi"], "--top-p"),
    "top-p-inf": (["gen", "--top-p", "inf", "hi"], "--top-p"),
    "max-tokens-zero": (["gen", "-n", "0", "hi"], "--max-tokens"),
    "seed-nan": (["gen", "--seed", "nan", "hi"], "--seed"),
    "tune-budget-nan": (["tune", "--budget", "nan"], "--budget"),
    "tune-budget-inf": (["tune", "--budget", "inf"], "--budget"),
    "train-lr-nan": (["train-heads", "--lr", "nan"], "--lr"),
    "train-budget-inf": (["train-heads", "--budget", "inf"], "--budget"),
    "knob-nan": (["gen", "--method", "suffix", "-O", "factor=nan", "hi"], "factor"),
    "knob-inf": (["gen", "--method", "suffix", "-O", "factor=inf", "hi"], "factor"),
    "layers-too-many": (["gen", "--method", "layerskip", "-O", "layers=999", "hi"], "or 0 for the default draft"),
    "layers-negative": (["gen", "--method", "layerskip", "-O", "layers=-1", "hi"], "or 0 for the default draft"),
}


@pytest.mark.parametrize("case", list(NUMBER_CASES))
def test_number(case: str, tiny_cli_model: Path) -> None:
    """Numbers that are not finite or out of range are usage errors (exit 2) naming the option."""
    args, named = NUMBER_CASES[case]
    result = invoke([args[0], "-m", str(tiny_cli_model), *args[1:]])
    assert_clean(result, 2)
    assert named in result.stderr


def test_number_layers_zero_is_the_documented_default(tiny_cli_model: Path) -> None:
    result = invoke(["gen", "-m", str(tiny_cli_model), "--method", "layerskip", "-O", "layers=0", "-n", "3", "hi"])
    assert_clean(result, 0)


# ======================================================================= misc


def test_misc_seed_without_temperature_is_reported(tiny_cli_model: Path) -> None:
    greedy = invoke(["gen", "-m", str(tiny_cli_model), "-n", "2", "--temp", "0", "--seed", "1", "hi"])
    assert_clean(greedy, 0)
    assert "--seed has no effect" in greedy.stderr
    sampled = invoke(["gen", "-m", str(tiny_cli_model), "-n", "2", "--seed", "1", "--temp", "0.7", "hi"])
    assert_clean(sampled, 0)
    assert "--seed" not in sampled.stderr


def test_misc_model_removed_while_loading(tiny_cli_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pardec_cli.store import loading

    model = tmp_path / "model"
    shutil.copytree(tiny_cli_model, model)
    checked = loading.check_model_files

    def check_then_vanish(path: Path) -> dict[str, object]:
        config = checked(path)
        shutil.rmtree(path)  # `pardec rm` in another terminal, right now
        return config

    monkeypatch.setattr(loading, "check_model_files", check_then_vanish)
    result = invoke(["gen", "-m", str(model), "-n", "2", "hi"])
    assert_clean(result, 1)
    assert "was removed while it was loading" in result.stderr and "Repo id" not in result.stderr


@pytest.mark.parametrize("zones", [("America/Los_Angeles", "Asia/Tokyo"), ("Asia/Kolkata", "UTC"), ("UTC", "Pacific/Auckland")],
                         ids=["la-tokyo", "kolkata-utc", "utc-auckland"])  # fmt: skip
def test_misc_last_used_across_time_zones(zones: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A stamp written in one time zone reads right in another ("just now", not hours)."""
    from pardec_cli.cli.models import _ago

    writer, reader = zones
    try:
        monkeypatch.setenv("TZ", writer)
        time.tzset()
        records.touch("tiny")
        stamp = records.usage()["tiny"]
        monkeypatch.setenv("TZ", reader)
        time.tzset()
        assert _ago(stamp) == "just now", stamp
        assert records.last_used("tiny") == stamp
    finally:
        monkeypatch.undo()
        time.tzset()


def test_misc_last_used_compares_moments_not_text() -> None:
    records._update_usage(lambda d: d.update({"a": "2026-01-01T10:00:00+09:00", "b": "2026-01-01T02:00:00+00:00"}))
    assert records.last_used("a", "b") == "2026-01-01T02:00:00+00:00"  # 02:00Z is after 01:00Z


def test_misc_truncated_store_model_is_not_listed_as_healthy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def convert(g: Path, out: Path, **k: object) -> None:
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"x" * 1000)

    monkeypatch.setattr(gguf_import, "_convert", convert)
    path = gguf_import.import_gguf(_write_gguf(tmp_path / "m.gguf"), "mine")
    assert json.loads(invoke(["list", "--json"]).stdout)[0]["complete"] is True
    (path / "model.safetensors").write_bytes(b"x" * 10)
    listed = invoke(["list"])
    assert_clean(listed, 0)
    assert "files missing" in listed.stdout


@pytest.mark.slow  # processes killed mid-write
@pytest.mark.parametrize("owner", ["dead-pid", "live-pid", "no-pid-old", "no-pid-fresh"])
def test_misc_stale_staging_folders(owner: str) -> None:
    """Scratch folders of a killed pardec are removed; those of a running one are kept."""
    root = models_dir()
    root.mkdir(parents=True)
    if owner == "dead-pid":
        child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        folder = root / f".mine.tmp-{child.stdout.strip()}-abcd"
    elif owner == "live-pid":
        folder = root / f".mine.tmp-{os.getpid()}-abcd"
    else:
        folder = root / ".mine.tmp-abcd1234"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    if owner == "no-pid-old":
        os.utime(folder, (time.time() - 7200, time.time() - 7200))
    assert_clean(invoke(["list"]), 0)
    assert folder.exists() is (owner in ("live-pid", "no-pid-fresh"))


def test_misc_config_lists_only_for_repeatable_options() -> None:
    """config.REPEATABLE names exactly the options that take several values."""
    import click

    from pardec_cli.cli.main import COMMANDS, cli
    from pardec_cli.config import REPEATABLE

    ctx = click.Context(cli)
    multiple = {p.name for name in COMMANDS for p in cli.get_command(ctx, name).params
                if isinstance(p, click.Option) and p.multiple}  # fmt: skip
    assert multiple == set(REPEATABLE)


def test_misc_rm_reports_links_it_did_not_follow(fake_hub: FakeHub, tmp_path: Path) -> None:
    """Regression (issue 17, defect 1): the exact attack, a crafted record entry."""
    victim = _victim(tmp_path)
    assert pull().exit_code == 0
    record_file = records.records_dir() / "tiny.json"
    data = json.loads(record_file.read_text())
    data["target"]["files"]["../../../../decoy/victim.txt"] = 8
    record_file.write_text(json.dumps(data))
    freed = hub.remove_snapshot_files(TARGET, data["target"]["commit"], ["../../../../decoy/victim.txt"],
                                      problems=(problems := []))  # fmt: skip
    assert freed == 0 and victim.read_text() == "precious" and "points outside" in problems[0]


def test_an_exception_reads_as_one_line_in_every_message() -> None:
    from pardec_cli.errors import first_line

    assert first_line(OSError("disk full\n  (details)")) == "disk full"
    assert first_line(KeyError()) == "KeyError", "no text: its type names it"
    assert first_line(ValueError("  bad header \nmore"), typed=True) == "ValueError: bad header"
    assert first_line(RuntimeError(), typed=True) == "RuntimeError"
