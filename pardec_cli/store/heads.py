"""The Medusa and EAGLE heads installed for a model: trained here, or pulled from the catalog.

Trained heads (`pardec train-heads`) live in pardec's store, next to the models:

    heads_root()/<model key>/<kind>/      kind: medusa, eagle or eagle3
        config.json, weights               the published layout of that kind
        pardec-heads.json                  pardec's notes (written last: marks it complete)

The model key is the name `-m` resolves to (``smollm2-135m``, ``qwen2.5-7b``, ``org/name``
as ``org--name``); a model given as a directory gets ``local-<folder>-<hash of its path>``.
Pulled heads are the accelerators a pull recorded (see `records`), when their files are
still there and they passed the compatibility check.

Torch-free and cheap, so `auto` selection and `pardec list` can ask which kinds exist.
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pardec_cli.home import pardec_home
from pardec_cli.store import records
from pardec_cli.store.layout import clean_stale_scratch, read_json_object, scratch_prefix, swap_into_place, terminate_cleanly

HEAD_KINDS: tuple[str, ...] = ("medusa", "eagle", "eagle3")
#: pardec's own notes about heads it trained (the corpus, the draft vocabulary, the
#: losses, the held-out agreement). Written last, so its presence means the directory is
#: complete; published heads have none and need none.
MARKER_NAME = "pardec-heads.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class InstalledHead:
    """Heads of one kind for one model: where they are and where they came from.

    source: "trained" (by pardec train-heads) or "pulled" (a catalog accelerator);
    name: what to call them (the Hub repo of pulled heads); detail: one line for people;
    tokens_per_step: what trained heads' held-out agreement predicts (None: not measured).
    """

    kind: str
    path: Path
    source: str
    name: str
    detail: str = ""
    tokens_per_step: float | None = None


def heads_root() -> Path:
    """Where trained heads are kept: ``pardec_home()/heads``."""
    return pardec_home() / "heads"


def model_key(name: str, *, source: str | None = None, path: Path | str | None = None) -> str:
    """The folder name of a model's trained heads (see the module docstring).

    `source` and `path` are those of the resolved model (`ResolvedModel.source`,
    `.path`): a "local" model is keyed by its directory, anything else by its name.
    """
    if source == "local" and path is not None:
        resolved = Path(path).expanduser().resolve()
        digest = hashlib.sha1(str(resolved).encode("utf-8")).hexdigest()[:8]
        return f"local-{_UNSAFE.sub('-', resolved.name).strip('-') or 'model'}-{digest}"
    key = _UNSAFE.sub("-", name.strip().lower().replace("/", "--")).strip("-.")
    return key or "model"


def trained_heads_dir(key: str, kind: str) -> Path:
    """Where `pardec train-heads` puts heads of `kind` for the model with `key` (may not exist)."""
    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}")
    return heads_root() / key / kind


def read_marker(folder: Path) -> dict[str, Any]:
    """pardec's notes on heads it trained (empty for published heads)."""
    return read_json_object(folder / MARKER_NAME)


def _trained(key: str) -> list[InstalledHead]:
    found = []
    for kind in HEAD_KINDS:
        folder = heads_root() / key / kind
        marker = read_marker(folder)
        if marker and (folder / "config.json").is_file():
            parts = [f"{marker['steps']} steps" if marker.get("steps") else "", str(marker.get("created") or "")]
            if marker.get("interrupted"):
                parts.append("interrupted")
            detail = ", ".join(p for p in parts if p)
            found.append(InstalledHead(kind, folder, "trained", f"{kind} heads", detail, expected_tokens_per_step(marker)))
    return found


def trained_heads(model: str, *, source: str | None = None, path: Path | str | None = None) -> list[InstalledHead]:
    """The heads `pardec train-heads` made for a model (arguments as in `installed_heads`)."""
    return _trained(model_key(model, source=source, path=path))


def expected_tokens_per_step(marker: dict[str, Any]) -> float | None:
    """Tokens per step that trained heads should give, from their held-out agreement
    recorded in their marker (`read_marker`).

    Training records, per depth d, how often the heads' top-1 draft equals the model's
    own next token ("top1_per_depth" for EAGLE, "top1_per_head" for Medusa). A chain
    draft then accepts depth d only if depths 1..d all agree, so a step emits
    1 + sum_d prod_{i<=d} a_i tokens: a floor for a tree, which also tries runners-up.
    None when the heads carry no such measurement (pulled heads, an older format).
    """
    evaluation = marker.get("eval")
    if not isinstance(evaluation, dict):
        return None
    agreement = evaluation.get("top1_per_depth") or evaluation.get("top1_per_head")
    if not isinstance(agreement, list) or not agreement:
        return None
    if not all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in agreement):
        return None  # a damaged marker: no estimate rather than a wrong one
    tokens, reach = 1.0, 1.0
    for share in agreement:
        reach *= min(max(float(share), 0.0), 1.0)
        tokens += reach
    return tokens


def _pulled(model: str, repo: str | None) -> list[InstalledHead]:
    record = records.find(model) or (records.find(repo) if repo else None)
    if record is None:
        return []
    return [
        InstalledHead(acc.kind, acc.snapshot, "pulled", acc.name or acc.repo, acc.detail)
        for acc in record.accelerators
        if acc.kind in HEAD_KINDS and acc.status == records.COMPATIBLE and acc.present()
    ]


def installed_heads(
    model: str, *, source: str | None = None, path: Path | str | None = None, repo: str | None = None
) -> list[InstalledHead]:
    """Every usable head set for a model, trained ones first, then pulled ones (best first per kind).

    `model` is the resolved model's name; `source`, `path` and `repo` as in
    `ResolvedModel` (they let a local directory and a pulled repo be found).
    """
    return [*trained_heads(model, source=source, path=path), *_pulled(model, repo)]


def find_heads(
    model: str, kind: str, *, source: str | None = None, path: Path | str | None = None, repo: str | None = None
) -> InstalledHead | None:
    """The heads of `kind` that `--method <kind>` uses for this model, or None."""
    return next((h for h in installed_heads(model, source=source, path=path, repo=repo) if h.kind == kind), None)


def trained_accelerators(key: str) -> list[dict[str, Any]]:
    """Trained heads as `pardec list`/`show` accelerator rows."""
    rows = []
    for head in _trained(key):
        size = sum(p.stat().st_size for p in head.path.iterdir() if p.is_file())
        rows.append({
            "name": head.name, "kind": head.kind, "method": head.kind, "repo": None, "revision": None,
            "commit": None, "status": "trained", "detail": head.detail, "size_bytes": size, "path": str(head.path),
        })  # fmt: skip
    return rows


def replace_dir(folder: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh hidden sibling of `folder` with `write(tmp)`, then swap it in for `folder`.

    Readers see the old heads or the new ones, never half of either; a failure (or
    Ctrl-C) inside `write` leaves `folder` as it was.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_scratch(folder.parent)  # what a killed train-heads left behind
    tmp = Path(tempfile.mkdtemp(prefix=scratch_prefix(folder.name, "tmp"), dir=folder.parent))
    with terminate_cleanly():
        try:
            write(tmp)
            swap_into_place(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
