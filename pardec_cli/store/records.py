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

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pardec_cli import statefile
from pardec_cli.home import pardec_home
from pardec_cli.statefile import MapOf, Optional, StateFileError

FORMAT = 1

# Accelerator states recorded by a pull.
COMPATIBLE, INCOMPATIBLE, UNCHECKED = "compatible", "incompatible", "unchecked"


def now() -> str:
    """This moment as an ISO 8601 stamp with its UTC offset (comparable across time zones)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def parse_stamp(stamp: str) -> datetime | None:
    """A stamp written by `now()` (or by older versions, "%Y-%m-%dT%H:%M:%S%z") as an aware
    datetime; one without an offset is taken as local time. None when it is not a stamp."""
    try:
        moment = datetime.fromisoformat(stamp.strip())
    except (ValueError, AttributeError):
        return None
    return moment if moment.tzinfo is not None else moment.astimezone()


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
        """Whether every recorded file is still in the snapshot (links and blobs), whole:
        a file of another size than the pull recorded (truncated, replaced) does not count."""
        return bool(self.files) and not self.damaged()

    def damaged(self) -> list[str]:
        """The recorded files that are missing or not of the recorded size."""
        snap = self.snapshot
        bad = []
        for name, size in self.files.items():
            try:
                if (snap / name).stat().st_size != size:
                    bad.append(name)
            except OSError:
                bad.append(name)
        return bad

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


_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _commit(value: Any) -> str | None:
    # A snapshot folder's name: one plain path component (a commit hash, as pulls write).
    if isinstance(value, str) and value and not re.search(r"[/\\]", value) and value not in (".", ".."):
        return None
    return f"must be a commit hash, not {value!r}"


def _repo(value: Any) -> str | None:
    if isinstance(value, str) and _REPO.fullmatch(value) and ".." not in value:
        return None
    return f"must be a Hub id org/name, not {value!r}"


REPO_SCHEMA = {
    "repo": _repo, "revision": str, "commit": _commit, "cache": str,
    "files": MapOf(statefile.relative_path, statefile.non_negative),
    "kind": Optional(str), "name": Optional(str), "status": Optional(str), "detail": Optional(str),
}  # fmt: skip
RECORD_SCHEMA = {
    "format": lambda v: None if v == FORMAT else f"must be {FORMAT}, not {v!r}",
    "name": str, "alias": Optional(str), "target": REPO_SCHEMA, "accelerators": Optional([REPO_SCHEMA]),
    "pulled_at": Optional(str), "updated_at": Optional(str),
}  # fmt: skip
USAGE_SCHEMA = MapOf(str, str)


def records_dir() -> Path:
    return pardec_home() / "pulled"


def _file_for(name: str) -> Path:
    return records_dir() / (name.replace("/", "--").lower() + ".json")


def _reset_hint(file: Path) -> str:
    return f"`pardec rm {file.stem}` removes this record (the downloaded files stay in the Hugging Face cache)"


def save(record: PullRecord) -> None:
    """Write the record atomically, under its lock."""
    record.updated_at = now()
    path = _file_for(record.name)
    statefile.update_json(path, lambda _current: record.to_dict(), RECORD_SCHEMA, _reset_hint(path))


def delete(record: PullRecord) -> None:
    _file_for(record.name).unlink(missing_ok=True)


def read_record(file: Path) -> PullRecord:
    """One record file, checked; `StateFileError` when it is broken."""
    data = statefile.read_json(file, RECORD_SCHEMA, _reset_hint(file))
    if data is None:
        raise StateFileError(file, "it is gone", _reset_hint(file))
    return PullRecord.from_dict(data)


def scan_records() -> tuple[list[PullRecord], list[StateFileError]]:
    """(valid records sorted by name, one error per broken record file)."""
    folder = records_dir()
    if not folder.is_dir():
        return [], []
    found, broken = [], []
    for file in sorted(folder.glob("*.json")):
        try:
            found.append(read_record(file))
        except StateFileError as exc:
            if file.exists():
                broken.append(exc)
    return sorted(found, key=lambda r: r.name.lower()), broken


def all_records() -> list[PullRecord]:
    """Every valid record, sorted by name (broken ones: `broken_records`)."""
    return scan_records()[0]


def broken_records() -> list[StateFileError]:
    """What is wrong with each record file that is not valid (`pardec list` warns)."""
    return scan_records()[1]


def broken_record_file(spec: str) -> Path | None:
    """The record file `spec` would name, when it exists but is not a valid record."""
    file = _file_for(spec.strip())
    if not file.is_file() or file.parent != records_dir():
        return None
    try:
        read_record(file)
    except StateFileError:
        return file
    return None


def find(spec: str) -> PullRecord | None:
    """The record that `spec` names (name, alias or target repo), or None."""
    return next((r for r in all_records() if r.matches(spec)), None)


# -------------------------------------------------------------------- usage


def _usage_file() -> Path:
    return pardec_home() / "usage.json"


_USAGE_RESET = "delete it: it only holds when each model was last used"


def usage() -> dict[str, str]:
    """Model name (lower-case) -> when it was last used (empty when the file is broken)."""
    try:
        return statefile.read_json(_usage_file(), USAGE_SCHEMA, _USAGE_RESET) or {}
    except StateFileError:
        return {}


def _update_usage(change: Any) -> None:
    """Merge a change into usage.json under its lock (best effort: it is only a convenience)."""

    def merged(current: Any) -> dict[str, str]:
        data = dict(current or {})
        change(data)
        return data

    try:
        statefile.update_json(_usage_file(), merged, USAGE_SCHEMA, _USAGE_RESET)
    except (OSError, statefile.PardecError):
        pass


def touch(*names: str) -> None:
    """Record that the model known by `names` was used now (best effort)."""
    stamp = now()

    def change(data: dict[str, str]) -> None:
        for name in names:
            if name:
                data[name.lower()] = stamp

    _update_usage(change)


def forget(*names: str) -> None:
    """Drop the usage entries of a removed model (best effort)."""
    if not any(n and n.lower() in usage() for n in names):
        return

    def change(data: dict[str, str]) -> None:
        for name in names:
            data.pop(name.lower(), None)

    _update_usage(change)


def last_used(*names: str) -> str | None:
    """The latest stamp among `names`' usage entries (compared as moments, not text)."""
    data = usage()
    stamps = [(moment, data[n.lower()]) for n in names if n and n.lower() in data
              if (moment := parse_stamp(data[n.lower()])) is not None]  # fmt: skip
    return max(stamps)[1] if stamps else None
