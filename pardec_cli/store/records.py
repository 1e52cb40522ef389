"""What pardec pulled, and when each model was last used.

A pull leaves its files in the Hugging Face cache and a record here, one JSON file per
model under ``pardec_home()/pulled/``: the target repo's commit and the exact files
pardec fetched, the same for every accelerator, and each accelerator's compatibility
with the target. `pardec list`, `show` and `rm` read these records; `rm` removes only
the files a record names. Records are written atomically (temporary file, rename), and
only once the files they name are complete.

``pardec_home()/usage.json`` maps model names to when `-m NAME` last resolved them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pardec_cli.home import pardec_home

FORMAT = 1

# Accelerator states recorded by a pull.
COMPATIBLE, INCOMPATIBLE, UNCHECKED = "compatible", "incompatible", "unchecked"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class RepoRecord:
    """One repo that a pull fetched: which commit, which files (name -> bytes), where.

    For an accelerator, `kind` is "drafter", "medusa", "eagle" or "eagle3", `name` what
    the catalog (or the user) called it, and `status`/`detail` the compatibility check.
    """

    repo: str
    revision: str
    commit: str
    cache: str
    files: dict[str, int] = field(default_factory=dict)
    kind: str = "model"
    name: str = ""
    status: str = UNCHECKED
    detail: str = ""

    @property
    def snapshot(self) -> Path:
        return Path(self.cache) / ("models--" + self.repo.replace("/", "--")) / "snapshots" / self.commit

    def present(self) -> bool:
        """Whether every recorded file is still in the snapshot (links and blobs)."""
        snap = self.snapshot
        return bool(self.files) and all((snap / name).exists() for name in self.files)

    @property
    def size(self) -> int:
        return sum(self.files.values())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepoRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class PullRecord:
    """A pulled model: its name (alias or Hub id), target repo and accelerators."""

    name: str
    target: RepoRecord
    alias: str | None = None
    accelerators: list[RepoRecord] = field(default_factory=list)
    pulled_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PullRecord:
        return cls(
            name=str(data["name"]),
            alias=data.get("alias"),
            target=RepoRecord.from_dict(data["target"]),
            accelerators=[RepoRecord.from_dict(a) for a in data.get("accelerators", [])],
            pulled_at=str(data.get("pulled_at", "")),
            updated_at=str(data.get("updated_at", "")),
        )

    def repos(self) -> list[RepoRecord]:
        return [self.target, *self.accelerators]

    def matches(self, spec: str) -> bool:
        """Whether `spec` names this model: its name, alias or repo (case-insensitive)."""
        wanted = spec.strip().lower()
        return wanted in {self.name.lower(), (self.alias or "").lower(), self.target.repo.lower()}


def records_dir() -> Path:
    return pardec_home() / "pulled"


def _file_for(name: str) -> Path:
    return records_dir() / (name.replace("/", "--").lower() + ".json")


def _write_json(path: Path, data: Any) -> None:
    """Write JSON atomically: a temporary sibling, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(record: PullRecord) -> None:
    record.updated_at = now()
    _write_json(_file_for(record.name), record.to_dict())


def delete(record: PullRecord) -> None:
    _file_for(record.name).unlink(missing_ok=True)


def all_records() -> list[PullRecord]:
    """Every readable record, sorted by name (unreadable files are skipped)."""
    folder = records_dir()
    if not folder.is_dir():
        return []
    found = []
    for file in sorted(folder.glob("*.json")):
        try:
            found.append(PullRecord.from_dict(json.loads(file.read_text("utf-8"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda r: r.name.lower())


def find(spec: str) -> PullRecord | None:
    """The record that `spec` names (name, alias or target repo), or None."""
    return next((r for r in all_records() if r.matches(spec)), None)


# -------------------------------------------------------------------- usage


def _usage_file() -> Path:
    return pardec_home() / "usage.json"


def usage() -> dict[str, str]:
    """Model name (lower-case) -> when it was last used."""
    try:
        data = json.loads(_usage_file().read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def touch(*names: str) -> None:
    """Record that the model known by `names` was used now (best effort)."""
    try:
        data = usage()
        stamp = now()
        for name in names:
            if name:
                data[name.lower()] = stamp
        _write_json(_usage_file(), data)
    except OSError:
        pass


def forget(*names: str) -> None:
    """Drop the usage entries of a removed model (best effort)."""
    try:
        data = usage()
        if any(n.lower() in data for n in names):
            for name in names:
                data.pop(name.lower(), None)
            _write_json(_usage_file(), data)
    except OSError:
        pass


def last_used(*names: str) -> str | None:
    data = usage()
    stamps = [data[n.lower()] for n in names if n and n.lower() in data]
    return max(stamps) if stamps else None
