"""A fake Hugging Face Hub for tests: a local HTTP server serving tiny random models.

It answers the Hub's endpoints (``/api/models/...`` listings with file sizes, git blob
ids and LFS sha256 like the real Hub, and ``/<repo>/resolve/<rev>/<file>`` with HEAD and
range requests); ``HF_ENDPOINT`` points at it (the `fake_hub` fixture). Faults can be
injected per file: drop the connection after N bytes, stall, answer an HTTP error, or
serve damaged bytes (same size, or cut short).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".gguf")

# ------------------------------------------------------------ a fake Hub


def _commit(*parts: str) -> str:
    return hashlib.sha1("/".join(parts).encode()).hexdigest()


class FakeHub:
    """Repos served by the local server, and what the server saw."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, tuple[str, dict[str, bytes]]]] = {}
        self.gated: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self.gets: Counter[str] = Counter()  # "repo/file" -> GET requests
        self.ranges: list[tuple[str, int]] = []  # (file, first byte) of range requests
        self.drop_once: dict[str, int] = {}  # file -> bytes sent before dropping the connection
        self.stall: dict[str, int] = {}  # file -> bytes sent before waiting for `release`
        self.fail: dict[str, list[int]] = {}  # file -> HTTP statuses to answer (GET), one per request
        self.corrupt: dict[str, int] = {}  # file -> how many GETs serve it with one byte flipped
        self.short: dict[str, int] = {}  # file -> how many GETs serve it cut short (the length says so)
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def add(self, repo: str, files: dict[str, bytes], revision: str = "main") -> str:
        commit = _commit(repo, revision, str(len(self.repos)))
        self.repos.setdefault(repo, {})[revision] = (commit, dict(files))
        return commit

    def files_at(self, repo: str, revision: str) -> tuple[str, dict[str, bytes]] | None:
        revisions = self.repos.get(repo, {})
        if revision in revisions:
            return revisions[revision]
        return next(((c, f) for c, f in revisions.values() if c == revision), None)

    def file_gets(self, repo: str) -> Counter[str]:
        prefix = repo + "/"
        return Counter({k[len(prefix):]: v for k, v in self.gets.items() if k.startswith(prefix)})


def git_blob_id(data: bytes) -> str:
    """The git blob id the Hub lists for a file: sha1 of "blob <size>\\0" and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sibling(name: str, data: bytes) -> dict[str, object]:
    """A listing entry as the Hub writes it: LFS files carry their sha256."""
    entry: dict[str, object] = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
    if name.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._handle(head=False)

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def _error(self, status: int, code: str) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self, head: bool) -> None:
        fake = self.server.fake
        with fake.lock:
            fake.requests.append((self.command, self.path))
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/")[1:]]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = "/".join(parts[2:4])
            revision = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
            self._listing(repo, revision)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        else:
            self._error(404, "EntryNotFound")

    def _listing(self, repo: str, revision: str) -> None:
        fake = self.server.fake
        if repo not in fake.repos:
            return self._error(404, "RepoNotFound")
        found = fake.files_at(repo, revision)
        if found is None:
            return self._error(404, "RevisionNotFound")
        commit, files = found
        siblings = [_sibling(n, b) for n, b in files.items()]
        body = json.dumps({"id": repo, "modelId": repo, "sha": commit, "siblings": siblings,
                           "private": False, "gated": "auto" if repo in fake.gated else False}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _file(self, repo: str, revision: str, name: str, head: bool) -> None:
        fake = self.server.fake
        if repo not in fake.repos:
            return self._error(404, "RepoNotFound")
        if repo in fake.gated:
            return self._error(403, "GatedRepo")
        found = fake.files_at(repo, revision)
        if found is None:
            return self._error(404, "RevisionNotFound")
        commit, files = found
        if name not in files:
            return self._error(404, "EntryNotFound")
        data = files[name]
        etag = hashlib.sha256(data).hexdigest() if name.endswith(LFS_SUFFIXES) else git_blob_id(data)
        if not head:
            with fake.lock:
                statuses = fake.fail.get(name)
                status = statuses.pop(0) if statuses else None
                if self.corrupt_now(name):
                    data = data[:-1] + bytes([data[-1] ^ 0xFF])
                elif fake.short.get(name):
                    fake.short[name] -= 1
                    data = data[: len(data) // 2]
            if status is not None:
                fake.gets[f"{repo}/{name}"] += 1
                return self._error(status, "InternalError" if status >= 500 else "Error")
        start = 0
        header = self.headers.get("Range")
        if header and header.startswith("bytes="):
            start = int(header[len("bytes="):].split("-")[0])
        status = 206 if start else 200
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        with fake.lock:
            fake.gets[f"{repo}/{name}"] += 1
            if start:
                fake.ranges.append((name, start))
            drop = fake.drop_once.pop(name, None)
            stall = fake.stall.get(name)
        if drop is not None:
            self.wfile.write(data[start : start + drop])
            self.wfile.flush()
            self.close_connection = True  # the client sees the body end early
            return
        if stall is not None:
            self.wfile.write(data[start : start + stall])
            self.wfile.flush()
            fake.stalled.set()
            fake.release.wait(60)
            self.close_connection = True
            return
        self.wfile.write(data[start:])


    def corrupt_now(self, name: str) -> bool:
        fake = self.server.fake
        if fake.corrupt.get(name):
            fake.corrupt[name] -= 1
            return True
        return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeHub


# ---------------------------------------------------------- tiny models


def _tokenizer_files(words: list[str]) -> dict[str, bytes]:
    import tempfile

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(words)}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token=words[0]))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token=words[0], bos_token=words[1], eos_token=words[2]
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir()}


def _model_files(seed: int, *, vocab: int, layers: int) -> dict[str, bytes]:
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, bos_token_id=1, eos_token_id=2,
        max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        LlamaForCausalLM(config).save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def tiny_repos() -> dict[str, dict[str, bytes]]:
    """Hub repos of tiny random models (built once per module)."""
    import torch
    from safetensors.torch import save as save_safetensors

    words = [f"w{i}" for i in range(128)]
    swapped = list(words)
    swapped[10], swapped[11] = swapped[11], swapped[10]
    tokenizer = _tokenizer_files(words)
    # The target pads its embedding to 136 rows; its tokenizer has 128 tokens.
    target = {**_model_files(0, vocab=136, layers=2), **tokenizer}
    target.update({
        "README.md": b"# tiny\n", "onnx/model.onnx": b"onnx" * 100, "original/consolidated.pth": b"pth" * 100,
        "pytorch_model.bin": b"a duplicate in pickle form", "training_args.bin": b"not weights",
    })  # fmt: skip
    buffer = io.BytesIO()
    torch.save({"fc.weight": torch.zeros(32, 64)}, buffer)
    return {
        "test-org/tiny-target": target,
        "test-org/tiny-target2": {**_model_files(1, vocab=128, layers=2), **tokenizer},
        "test-org/tiny-drafter": {**_model_files(2, vocab=128, layers=1), **tokenizer},
        "test-org/other-drafter": {**_model_files(3, vocab=128, layers=1), **_tokenizer_files(swapped)},
        "test-org/tiny-eagle": {
            "config.json": json.dumps({"model_type": "llama", "hidden_size": 32, "vocab_size": 136,
                                       "num_hidden_layers": 1}).encode(),
            "pytorch_model.bin": buffer.getvalue(),
        },
        "test-org/tiny-medusa": {
            "config.json": json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                       "base_model_name_or_path": "test-org/tiny-target"}).encode(),
            "medusa_lm_head.safetensors": save_safetensors({"0.0.linear.weight": torch.zeros(32, 32)}),
        },
        "test-org/weird": {
            **{k: v for k, v in target.items() if "/" not in k},
            "config.json": json.dumps({"model_type": "foobarnet", "architectures": ["FooBar"]}).encode(),
        },
    }


CATALOG = """
[models.tiny]
repo = "test-org/tiny-target"
family = "llama"
drafters = ["tiny-draft"]
eagle = ["test-org/tiny-eagle"]
medusa = ["test-org/tiny-medusa"]
chat_template = "words separated by spaces"

[models.tiny2]
repo = "test-org/tiny-target2"
family = "llama"
drafters = ["tiny-draft"]

[models.tiny-draft]
repo = "test-org/tiny-drafter"
family = "llama"
"""


@pytest.fixture
def fake_hub(
    tiny_repos: dict[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[FakeHub]:
    """A local Hub serving the tiny repos; pardec online, pointed at it."""
    import huggingface_hub.constants

    fake = FakeHub()
    for repo, files in tiny_repos.items():
        fake.add(repo, files)
    v2 = dict(tiny_repos["test-org/tiny-target"])
    v2["generation_config.json"] = b'{"max_new_tokens": 7}'
    fake.add("test-org/tiny-target", v2, revision="v2")
    fake.add("test-org/gated", tiny_repos["test-org/tiny-drafter"])
    fake.gated.add("test-org/gated")

    server = _Server(("127.0.0.1", 0), _Handler)
    server.fake = fake
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    catalog = Path(os.environ["PARDEC_CONFIG_DIR"]) / "catalog.toml"
    catalog.parent.mkdir(parents=True, exist_ok=True)
    catalog.write_text(CATALOG)
    try:
        yield fake
    finally:
        fake.release.set()
        server.shutdown()
        server.server_close()


