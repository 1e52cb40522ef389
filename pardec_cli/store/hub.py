"""The one seam between pardec and the Hugging Face Hub, plus the cache's on-disk layout.

Everything pardec asks the Hub goes through `HubClient` (two calls: list a repo's files
at a revision, download one file into the cache). huggingface_hub does the work, so the
standard cache is used (``HF_HUB_CACHE`` / ``HF_HOME`` honoured, no private copy),
downloads go to a temporary file that is renamed into place only when complete, and a
dropped connection resumes with an HTTP range request. `get_client` returns the client
in use; tests replace it, or point ``HF_ENDPOINT`` at a local server.

Hub failures become one-line `PardecError`s (`hub_error`). huggingface_hub, httpx and
tqdm are imported lazily, inside the functions that need them.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pardec_cli.errors import ModelNotFoundError, PardecError, first_line

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
LOGIN_HINT = "`hf auth login` (or set HF_TOKEN)"


# ------------------------------------------------------------- cache layout


def endpoint() -> str:
    """The Hub's address: ``HF_ENDPOINT`` (read now, not at import) or huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_root() -> Path:
    """The Hugging Face hub cache, as huggingface_hub computes it, from the environment now.

    ``HF_HUB_CACHE``, else the legacy ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``,
    else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
    """
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def repo_dir(repo: str, cache: Path | None = None) -> Path:
    """``<cache>/models--org--name``: where one model repo lives in the cache."""
    return (cache or cache_root()) / ("models--" + repo.replace("/", "--"))


def snapshot_dir(repo: str, commit: str, cache: Path | None = None) -> Path:
    return repo_dir(repo, cache) / "snapshots" / commit


def read_ref(repo: str, revision: str, cache: Path | None = None) -> str | None:
    """The commit a branch or tag points to in the cache (a commit is returned as is)."""
    if COMMIT_RE.fullmatch(revision):
        return revision
    try:
        text = (repo_dir(repo, cache) / "refs" / revision).read_text("utf-8").strip()
    except OSError:
        return None
    return text if text and "/" not in text and "\\" not in text and text not in (".", "..") else None


def write_ref(repo: str, revision: str, commit: str, cache: Path | None = None) -> None:
    """Point ``refs/<revision>`` at `commit` (atomically), as huggingface_hub does."""
    if COMMIT_RE.fullmatch(revision):
        return
    ref = repo_dir(repo, cache) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit, "utf-8")
    os.replace(tmp, ref)


def _blob_of(link: Path) -> Path | None:
    """The blob a snapshot symlink points to (None for a plain file)."""
    if not link.is_symlink():
        return None
    return (link.parent / os.readlink(link)).resolve()


def _inside(path: Path, folder: Path) -> bool:
    """Whether `path` (already resolved) is `folder` (resolved) or lies under it."""
    return path == folder or folder in path.parents


def remove_snapshot_files(repo: str, commit: str, names: list[str] | tuple[str, ...],
                          cache: Path | None = None, problems: list[str] | None = None) -> int:  # fmt: skip
    """Remove files from one snapshot of the cache, safely; return the bytes freed.

    config.json goes first (so a half-removed snapshot is never taken for a model),
    each snapshot link before its blob, and a blob only when no other snapshot links
    to it. Emptied folders go too: the snapshot and the refs naming it, and the whole
    repo folder once it has no snapshot left. Bytes are counted for blobs (and plain
    files) actually deleted.

    Nothing outside the repo's own cache folder is ever deleted, whatever `names` or the
    snapshot's links say: a name that leads out of the snapshot is skipped, and a link
    to a file outside the repo's ``blobs/`` is removed without its target; each is
    described in `problems`.
    """
    root = repo_dir(repo, cache)
    snap = root / "snapshots" / commit
    if not snap.is_dir() or root.is_symlink() or snap.is_symlink():
        if snap.exists() and problems is not None:
            problems.append(f"{snap} is a link out of the cache folder: left alone")
        return 0
    problems = problems if problems is not None else []
    real_snap, real_blobs = snap.resolve(), (root / "blobs").resolve()
    doomed = set()
    for name in names:
        path = snap / name
        if not _inside(path.parent.resolve(), real_snap):
            problems.append(f"{name!r} points outside {snap}: not removed")
            continue
        doomed.add(path)
    in_use = {
        blob
        for link in (root / "snapshots").rglob("*")
        if link not in doomed and (blob := _blob_of(link)) is not None
    }
    freed = 0
    for path in sorted(doomed, key=lambda p: (p.name != "config.json", str(p))):
        blob = _blob_of(path)
        if blob is not None and not _inside(blob, real_blobs):
            problems.append(f"{path} links to {blob}, outside the cache folder: removed the link only")
            blob = None
        elif blob is None and path.is_file():
            freed += path.stat().st_size
        if path.is_symlink() or path.is_file():
            path.unlink()
        if blob is not None and blob not in in_use and blob.is_file():
            freed += blob.stat().st_size
            blob.unlink()
    for folder in sorted((p for p in snap.rglob("*") if p.is_dir() and not p.is_symlink()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    if not any(snap.iterdir()):
        snap.rmdir()
        refs = root / "refs"
        for ref in refs.rglob("*") if refs.is_dir() else ():
            if ref.is_file() and not ref.is_symlink() and ref.read_text("utf-8", "replace").strip() == commit:
                ref.unlink()
    if not any((root / "snapshots").iterdir()):
        for blob in (root / "blobs").glob("*") if (root / "blobs").is_dir() else ():
            if blob.is_file() and not blob.is_symlink() and not blob.name.endswith(".incomplete"):
                freed += blob.stat().st_size
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(root.parent / ".locks" / root.name, ignore_errors=True)
    return freed


def remove_stale_partials(repo: str, cache: Path | None = None) -> list[Path]:
    """Remove partial downloads that a killed pull left in the repo's ``blobs/``; return them.

    huggingface_hub downloads into ``<etag>.<random>.incomplete`` under the lock
    ``.locks/<repo folder>/<etag>.lock``: a partial file whose lock is free belongs to no
    running download (its random name means no later download resumes it either).
    """
    from filelock import FileLock, Timeout

    root = repo_dir(repo, cache)
    blobs = root / "blobs"
    removed = []
    for part in sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else ():
        lock_file = root.parent / ".locks" / root.name / f"{part.name.split('.')[0]}.lock"
        try:
            with FileLock(str(lock_file), timeout=0):
                part.unlink(missing_ok=True)
                removed.append(part)
        except (Timeout, OSError):
            continue  # being downloaded right now (or the lock cannot be taken: leave it)
    return removed


def remove_repo(repo: str, cache: Path | None = None) -> int:
    """Remove a repo's whole cache folder (every revision); return the bytes freed.

    The folder is first renamed to a hidden sibling, so no one sees it half-removed.
    """
    root = repo_dir(repo, cache)
    if not root.is_dir():
        return 0
    # Blobs, plus snapshot files that are copies rather than links (no symlink support);
    # a repo folder that is itself a link frees nothing (the link goes, not its target).
    freed = 0 if root.is_symlink() else sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    trash = Path(tempfile.mkdtemp(prefix=".pardec-rm-", dir=root.parent))
    os.replace(root, trash / root.name)
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(root.parent / ".locks" / root.name, ignore_errors=True)
    return freed


def file_hash(path: Path, kind: str) -> str:
    """The hash of a file's content as the Hub computes it: "sha256" or "git-sha1" (the
    git blob id: sha1 of ``blob <size>\\0`` and the content)."""
    import hashlib

    size = path.stat().st_size
    digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return f"{kind}:{digest.hexdigest()}"


def content_problem(path: Path, expected_hash: str | None, expected_size: int | None) -> str | None:
    """Why the downloaded `path` is not the file the Hub listed (size, then hash), or None."""
    try:
        size = path.stat().st_size
        if expected_size is not None and size != expected_size:
            return f"{size} bytes, the Hub lists {expected_size}"
        if expected_hash:
            kind = expected_hash.split(":", 1)[0]
            actual = file_hash(path, kind)
            if actual != expected_hash:
                return f"its {kind} is {actual.split(':', 1)[1][:12]}..., the Hub's is {expected_hash.split(':', 1)[1][:12]}..."
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    return None


def free_bytes(path: Path) -> int:
    """Free space on the disk that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return 1 << 62  # cannot tell: do not block the download


# ------------------------------------------------------------------- client


@dataclass(frozen=True)
class RepoListing:
    """A repo's files at one commit: ``files`` maps each path to its size (None: unknown)."""

    repo: str
    revision: str
    commit: str
    files: dict[str, int | None] = field(default_factory=dict)
    # path -> the hash the Hub gives for its content: "sha256:<hex>" (LFS files) or
    # "git-sha1:<hex>" (the git blob id of small files); a file not listed is not checked.
    hashes: dict[str, str] = field(default_factory=dict)


def _bar_class(label: str, show: bool, display: Any = None, overall: Any = None) -> type:
    """A tqdm class for one file's download bar (or a silent one when not `show`).

    With a live `display` (`pardec_cli.progress.ProgressDisplay`), the bar is drawn there
    instead (tqdm itself stays silent) and every byte also advances `overall`, the
    pull's bar across all its files.
    """
    from tqdm import tqdm

    if display is not None and display.enabled:

        class DisplayBar(tqdm):  # type: ignore[misc]
            monitor_interval = 0  # no monitor thread: one would start per class, i.e. per file

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                total, initial = kwargs.get("total"), kwargs.get("initial") or 0
                super().__init__(disable=True)
                self._task = display.task(label, total)
                if initial:
                    self.update(initial)

            def update(self, n: float | None = 1) -> bool | None:
                self._task.advance(n or 0)
                if overall is not None:
                    overall.advance(n or 0)
                return None

            def close(self) -> None:
                if getattr(self, "_task", None) is not None:
                    self._task.done()
                    self._task = None
                super().close()

        return DisplayBar

    class FileBar(tqdm):  # type: ignore[misc]
        monitor_interval = 0  # no monitor thread: one would start per class, i.e. per file

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs["desc"] = label
            kwargs["file"] = sys.stderr
            kwargs["disable"] = not show
            size = shutil.get_terminal_size()  # 80x24 when a terminal reports none (0x0)
            kwargs.setdefault("ncols", size.columns)
            kwargs.setdefault("nrows", size.lines)
            super().__init__(*args, **kwargs)

    return FileBar


@contextmanager
def quiet_hub() -> Iterator[None]:
    """Hide huggingface_hub's own progress bars, log lines and warnings meanwhile."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from huggingface_hub.utils import logging as hub_logging

    bars_were_disabled = are_progress_bars_disabled()
    verbosity = hub_logging.get_verbosity()
    disable_progress_bars()
    hub_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hub_logging.set_verbosity(verbosity)
        if not bars_were_disabled:
            enable_progress_bars()


class HubClient:
    """What pardec asks the Hub, through huggingface_hub."""

    def listing(self, repo: str, revision: str | None) -> RepoListing:
        """The files (with sizes) of `repo` at `revision` (None: the main branch)."""
        from huggingface_hub import HfApi

        with quiet_hub():
            info = HfApi(endpoint=endpoint()).model_info(
                repo, revision=revision, files_metadata=True
            )
        files = {s.rfilename: s.size for s in (info.siblings or [])}
        hashes = {}
        for sibling in info.siblings or []:
            lfs = getattr(sibling, "lfs", None)
            sha256 = getattr(lfs, "sha256", None) if lfs is not None else None
            if sha256:
                hashes[sibling.rfilename] = f"sha256:{sha256}"
            elif getattr(sibling, "blob_id", None):
                hashes[sibling.rfilename] = f"git-sha1:{sibling.blob_id}"
        if not info.sha:
            raise PardecError(f"the Hub did not say which commit {repo} is at")
        return RepoListing(repo, revision or "main", info.sha, files, hashes)

    def download(self, repo: str, filename: str, commit: str, *, progress: bool, display: Any = None,
                 overall: Any = None) -> Path:  # fmt: skip
        """One file of `repo` at `commit` into the cache; returns its snapshot path.

        Returns at once when the file is already in the snapshot. `progress` draws a bar
        (name, size, speed) on stderr: in `display` when it is given (a live
        `pardec_cli.progress.ProgressDisplay`), where its bytes also advance `overall`.
        """
        from huggingface_hub import hf_hub_download

        with quiet_hub():
            path = hf_hub_download(
                repo,
                filename,
                revision=commit,
                cache_dir=str(cache_root()),
                endpoint=endpoint(),
                tqdm_class=_bar_class(filename, progress, display, overall),
            )
        return Path(str(path))


_client: HubClient = HubClient()


def get_client() -> HubClient:
    """The client in use (tests may replace ``hub._client``)."""
    return _client


# ------------------------------------------------------------------- errors



def hub_error(exc: Exception, repo: str, revision: str | None = None) -> PardecError:
    """A one-line `PardecError` for a failure of a Hub call about `repo`."""
    from huggingface_hub import errors

    if isinstance(exc, PardecError):
        return exc
    if isinstance(exc, errors.GatedRepoError):
        return ModelNotFoundError(
            f"{repo} is gated on the Hugging Face Hub: it needs an accepted licence and a login",
            hint=f"accept the terms at {endpoint()}/{repo}, then run {LOGIN_HINT}",
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return ModelNotFoundError(f"revision {revision!r} of {repo} does not exist on the Hub")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ModelNotFoundError(
            f"model repository {repo!r} was not found on the Hugging Face Hub",
            hint=f"check the name; for a private repo run {LOGIN_HINT}",
        )
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return ModelNotFoundError(
            f"cannot download {repo}: Hugging Face offline mode is on",
            hint="unset HF_HUB_OFFLINE to download it",
        )
    if isinstance(exc, errors.LocalEntryNotFoundError):
        return ModelNotFoundError(
            f"cannot download {repo}: the Hugging Face Hub is unreachable and it is not cached",
            hint="check the network connection (or a proxy), or pass a local model directory",
        )
    if isinstance(exc, errors.HfHubHTTPError):
        return PardecError(f"downloading {repo} failed: {first_line(exc)}")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return PardecError(
            f"the disk is full: downloading {repo} to {cache_root()} failed",
            hint="free some space, or point HF_HUB_CACHE at a bigger disk",
        )
    if isinstance(exc, OSError) and not type(exc).__module__.startswith(("httpx", "httpcore")):
        return PardecError(f"downloading {repo} failed: {first_line(exc)}")
    return PardecError(  # httpx connection errors, timeouts and the like
        f"downloading {repo} failed: {first_line(exc, typed=True)}",
        hint=f"check the network connection to {endpoint()}, or pass a local model directory",
    )


def call(fn: Callable[[], Any], repo: str, revision: str | None = None) -> Any:
    """Run one Hub call; any failure but Ctrl-C becomes a one-line `PardecError`."""
    try:
        return fn()
    except PardecError:
        raise
    except Exception as exc:
        raise hub_error(exc, repo, revision) from None
