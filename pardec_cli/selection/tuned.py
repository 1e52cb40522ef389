"""Tuned results: one TOML file per (model, device, dtype) under ``pardec_home()/tuned/``.

A file holds the measured verification cost curve, and per profile the candidates
`pardec tune` measured (tokens per step, tokens/s, speed-up over vanilla, how many
outputs matched vanilla's), the winner, and the raw runs it measured them from (so an
interrupted tune resumes where it stopped). `--method auto` and `pardec doctor` read
the file whose model fingerprint, device and dtype match the loaded model exactly; a
file for the same model on another device or dtype, or for another version of the
model (different weights), is never used, and `--explain` says so.

Torch-free; checked against a schema when read (`RESULTS_SCHEMA`), written atomically
(temporary file, rename) under a lock, merging what another tune wrote meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pardec_cli import __version__, statefile
from pardec_cli.selection.costmodel import CostCurve
from pardec_cli.errors import PardecError
from pardec_cli.home import pardec_home
from pardec_cli.statefile import MapOf, Optional, StateFileError, check_shape
from pardec_cli.store.records import now

if TYPE_CHECKING:
    from pardec_cli.selection.learned import Measurement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FORMAT = 1
# Columns of a raw run, in the order the file stores them.
RUN_FIELDS = ("label", "prompt", "tokens", "seconds", "steps", "drafted", "propose_s", "match")


def tuned_dir() -> Path:
    """Where tuned results live: ``pardec_home()/tuned``."""
    return pardec_home() / "tuned"


# ----------------------------------------------------------------- the data


@dataclass
class Run:
    """One generation measured by tune: a candidate (by label) on one prompt."""

    label: str
    prompt: str
    tokens: int  # tokens generated (the prefill's first one included)
    seconds: float  # wall time of the whole generation, prefill included (end to end)
    steps: int
    drafted: int
    propose_s: float
    match: bool  # output identical to vanilla's on this prompt


@dataclass
class TunedCandidate:
    """A candidate as tune measured it, summed over the prompts it ran on."""

    method: str
    knobs: dict[str, Any]
    tokens_per_step: float
    drafted: float  # drafted tokens verified per step
    draft_ms: float  # drafting time per step
    tokens_per_s: float
    speedup: float  # tokens/s over vanilla's on the same prompts
    prompts: int
    matched: int  # prompts whose output equalled vanilla's
    round: int = 0  # the last successive-halving round it took part in

    @property
    def label(self) -> str:
        from pardec_cli.selection.profiles import method_label

        return method_label(self.method, self.knobs)


@dataclass
class TunedProfile:
    """What tune found for one profile."""

    name: str
    candidates: list[TunedCandidate] = field(default_factory=list)
    best: str | None = None  # label of the winner; None until a round finished
    complete: bool = False  # the search ran to its end (not cut by budget or Ctrl-C)
    prompts: str = "built-in"
    max_new_tokens: int = 0
    budget_s: float = 0.0
    spent_s: float = 0.0
    runs: list[Run] = field(default_factory=list)

    def best_candidate(self) -> TunedCandidate | None:
        """The search's winner (`best`: its last complete round's first)."""
        return next((c for c in self.candidates if c.label == self.best), None)

    def best_measured(self) -> TunedCandidate | None:
        """The candidate auto ranks first from what was measured: its speed-up shrunk by how
        few prompts it rests on (`selection.learned.shrunk`); None where none beats plain
        decoding or nothing was measured. The search's last round may disagree."""
        from pardec_cli.selection.learned import shrunk

        scored = [(shrunk(m.speedup, m.runs), c) for c in self.candidates if c.method != "vanilla"
                  for m in [candidate_measurement(self, c)]]  # fmt: skip
        score, best = max(scored, key=lambda sc: sc[0], default=(0.0, None))
        return best if score > 1.0 else None


@dataclass
class TunedResults:
    """Everything tuned for one model on one device in one dtype."""

    model: str
    fingerprint: str
    device: str
    dtype: str
    curve: CostCurve | None = None
    profiles: dict[str, TunedProfile] = field(default_factory=dict)
    updated: str = ""
    pardec_version: str = __version__
    path: Path | None = None

    def matches(self, fingerprint: str, device: str, dtype: str) -> bool:
        return (self.fingerprint, self.device, self.dtype) == (fingerprint, device, dtype)


def measurements(profile: TunedProfile) -> list[Measurement]:
    """Tune's candidates for one profile as measurements (canonical labels), best first."""
    found = [candidate_measurement(profile, c) for c in profile.candidates if c.method != "vanilla"]
    return sorted(found, key=lambda m: -m.speedup)


def candidate_measurement(profile: TunedProfile, candidate: TunedCandidate) -> Measurement:
    """One candidate as a measurement, with the spread of its per-prompt speed-ups (its
    tokens/s over vanilla's on the same prompt, from the profile's raw runs)."""
    from pardec_cli.selection.learned import Measurement, spread

    vanilla = {r.prompt: r for r in profile.runs if r.label == "vanilla" and r.seconds > 0}
    per_prompt = [(r.tokens / r.seconds) / (vanilla[r.prompt].tokens / vanilla[r.prompt].seconds)
                  for r in profile.runs if r.label == candidate.label and r.prompt in vanilla and r.seconds > 0]
    low, high = spread(per_prompt) if per_prompt else (candidate.speedup, candidate.speedup)
    return Measurement(_canonical_label(candidate), candidate.speedup, max(candidate.prompts, 1),
                       candidate.tokens_per_step, low, high, "tune")


def _canonical_label(candidate: TunedCandidate) -> str:
    from pardec_cli.selection.profiles import canonical_label

    try:
        return canonical_label(candidate.method, candidate.knobs)
    except (PardecError, KeyError):
        return candidate.label


# ------------------------------------------------------------- fingerprints


def fingerprint_directory(path: Path) -> str:
    """A cheap identity of a model's weights: config.json, and for every weight file its
    name, size and the first and last MiB of its bytes (a fine-tune or another
    quantization changes them; a copy of the same files does not)."""
    digest = hashlib.sha256()
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for file in sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth")):
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as f:
            digest.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                digest.update(f.read())
    return "sha256:" + digest.hexdigest()[:32]


def fingerprint_config(config: dict[str, Any], parameters: int) -> str:
    """An identity for a model known only in memory (no directory): its config and size."""
    text = json.dumps(config, sort_keys=True, default=str) + f":{parameters}"
    return "config:" + hashlib.sha256(text.encode()).hexdigest()[:32]


# ------------------------------------------------------------------- files


def results_path(model: str, fingerprint: str, device: str, dtype: str) -> Path:
    """The file for one (model, device, dtype): readable name plus a short hash of the key."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{model}--{device.split(':')[0]}--{dtype}").strip("-")
    key = hashlib.sha256(f"{fingerprint}|{device}|{dtype}".encode()).hexdigest()[:10]
    return tuned_dir() / f"{slug}--{key}.toml"


def scan_results() -> tuple[list[TunedResults], list[PardecError]]:
    """(every valid results file, one error per file that is not valid)."""
    folder = tuned_dir()
    if not folder.is_dir():
        return [], []
    found, broken = [], []
    for path in sorted(folder.glob("*.toml")):
        try:
            found.append(read_results(path))
        except PardecError as exc:
            if path.exists():
                broken.append(exc)
    return found, broken


def all_results() -> list[TunedResults]:
    """Every valid results file (broken ones are skipped: `tune --show` names them)."""
    return scan_results()[0]


def broken_results() -> list[PardecError]:
    """What is wrong with each results file that is not valid."""
    return scan_results()[1]


def find_results(fingerprint: str, device: str, dtype: str) -> TunedResults | None:
    """The results for exactly this model version, device and dtype, or None."""
    return next((r for r in all_results() if r.matches(fingerprint, device, dtype)), None)


def unusable_results(model: str, fingerprint: str, device: str, dtype: str) -> list[str]:
    """Why results that look related (same model name or same weights) do not apply here."""
    notes = [f"{exc.message}: not used ({exc.hint})" for exc in broken_results()]
    for r in all_results():
        if r.matches(fingerprint, device, dtype) or (r.model != model and r.fingerprint != fingerprint):
            continue
        if r.fingerprint != fingerprint:
            why = "another version of the model (its weights differ)"
        elif r.device != device:
            why = f"another device ({r.device})"
        else:
            why = f"another dtype ({r.dtype})"
        notes.append(f"tuned results in {r.path} are for {why}: not used")
    return notes


def _run_row(row: Any) -> str | None:
    kinds = (str, str, int, float, int, int, float, bool)
    if not isinstance(row, list) or len(row) != len(kinds):
        return f"must be a list of {len(kinds)} values ({', '.join(RUN_FIELDS)})"
    for field_name, kind, value in zip(RUN_FIELDS, kinds, row):
        problem = check_shape(value, kind, field_name)
        if problem:
            return problem
    return None


def _curve_points(value: Any) -> str | None:
    if not isinstance(value, dict) or not value:
        return "must be a table of tokens = milliseconds"
    for n, ms in value.items():
        if not str(n).isdigit() or int(n) < 1:
            return f"{n!r} is not a number of tokens"
        if check_shape(ms, float) or ms <= 0:
            return f"{n}: must be a positive number of milliseconds, not {ms!r}"
    return None


_CANDIDATE_SCHEMA = {
    "method": str, "knobs": Optional(dict), "tokens_per_step": float, "drafted": float, "draft_ms": float,
    "tokens_per_s": float, "speedup": float, "prompts": int, "matched": int, "round": Optional(int),
}  # fmt: skip
_PROFILE_SCHEMA = {
    "complete": Optional(bool), "prompts": Optional(str), "max_new_tokens": Optional(int),
    "budget_s": Optional(float), "spent_s": Optional(float), "best": Optional(str),
    "candidates": Optional([_CANDIDATE_SCHEMA]),
}  # fmt: skip
RESULTS_SCHEMA = {
    "format": lambda v: None if v == FORMAT else f"must be {FORMAT}, not {v!r}",
    "model": str, "fingerprint": str, "device": str, "dtype": str,
    "updated": Optional(str), "pardec_version": Optional(str),
    "curve": Optional({"source": str, "ms": _curve_points}),
    "profiles": Optional(MapOf(str, _PROFILE_SCHEMA)),
    "runs": Optional(MapOf(str, [_run_row])),
}  # fmt: skip
_RESET = "pardec tune --reset removes it"


def read_results(path: Path) -> TunedResults:
    """Parse one results file; a broken one (syntax or shape) is a `PardecError` naming it."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise StateFileError(path, f"cannot read it ({exc})", _RESET) from None
    problem = check_shape(data, RESULTS_SCHEMA)
    if problem:
        raise StateFileError(path, problem, _RESET)
    try:
        curve_data = data.get("curve")
        curve = None
        if curve_data:
            curve = CostCurve.from_mapping({int(n): float(ms) for n, ms in curve_data["ms"].items()}, str(curve_data["source"]))
        fields = set(TunedCandidate.__dataclass_fields__)
        profiles = {}
        for name, table in data.get("profiles", {}).items():
            profiles[name] = TunedProfile(
                name=name,
                candidates=[TunedCandidate(**{**{k: v for k, v in c.items() if k in fields}, "knobs": dict(c.get("knobs", {}))})
                            for c in table.get("candidates", [])],
                best=table.get("best") or None,
                complete=bool(table.get("complete", False)),
                prompts=str(table.get("prompts", "built-in")),
                max_new_tokens=int(table.get("max_new_tokens", 0)),
                budget_s=float(table.get("budget_s", 0.0)),
                spent_s=float(table.get("spent_s", 0.0)),
                runs=[Run(*row) for row in data.get("runs", {}).get(name, [])],
            )
        return TunedResults(
            model=str(data["model"]), fingerprint=str(data["fingerprint"]), device=str(data["device"]),
            dtype=str(data["dtype"]), curve=curve, profiles=profiles, updated=str(data.get("updated", "")),
            pardec_version=str(data.get("pardec_version", "")), path=path,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(path, f"not in the expected form ({exc})", _RESET) from None


def write_results(results: TunedResults) -> Path:
    """Save `results` to its file, atomically, under the file's lock; returns the path.

    Another `pardec tune` may have written the same file meanwhile (another profile of
    the same model): the profiles and curve it saved and this run did not measure are
    kept, so concurrent tunes both keep their results.
    """
    path = results.path or results_path(results.model, results.fingerprint, results.device, results.dtype)
    results.path = path
    with statefile.locked(path):
        try:
            theirs = read_results(path) if path.exists() else None
        except PardecError:
            theirs = None  # a broken file is replaced
        if theirs is not None and theirs.matches(results.fingerprint, results.device, results.dtype):
            for name, profile in theirs.profiles.items():
                results.profiles.setdefault(name, profile)
            if results.curve is None:
                results.curve = theirs.curve
        results.updated = now()
        statefile.atomic_write(path, to_toml(results))
    return path


def remove_results(results: list[TunedResults]) -> list[Path]:
    """Delete these results' files; returns the paths removed."""
    removed = []
    for r in results:
        if r.path is not None and r.path.is_file():
            r.path.unlink()
            removed.append(r.path)
    return removed


# -------------------------------------------------------------- TOML output


def _value(value: Any) -> str:
    """A TOML literal for a scalar, list or flat table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(round(value, 6))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON string escapes are valid TOML
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def to_toml(results: TunedResults) -> str:
    """The file's text: readable, with the raw runs last in each profile."""
    out = [
        "# pardec tune results: measured on this machine, read by --method auto and pardec doctor.",
        "# `pardec tune --show` prints them; `pardec tune --reset` removes them.",
        f"format = {FORMAT}",
        f"model = {_value(results.model)}",
        f"fingerprint = {_value(results.fingerprint)}",
        f"device = {_value(results.device)}",
        f"dtype = {_value(results.dtype)}",
        f"pardec_version = {_value(results.pardec_version)}",
        f"updated = {_value(results.updated)}",
    ]
    if results.curve is not None:
        out += ["", "# forward time (ms) of n new tokens over a realistic context", "[curve]",
                f"source = {_value(results.curve.source)}",
                f"ms = {_value({str(n): ms for n, ms in results.curve.points})}"]
    for name, profile in results.profiles.items():
        out += ["", f"[profiles.{_key(name)}]"]
        out += [f"{k} = {_value(getattr(profile, k))}" for k in ("complete", "prompts", "max_new_tokens", "budget_s", "spent_s")]
        if profile.best:
            out.append(f"best = {_value(profile.best)}")
        for c in profile.candidates:
            out += ["", f"[[profiles.{_key(name)}.candidates]]"]
            out += [f"{k} = {_value(getattr(c, k))}" for k in
                    ("method", "knobs", "tokens_per_step", "drafted", "draft_ms", "tokens_per_s", "speedup", "prompts", "matched", "round")]
    runs = {name: profile.runs for name, profile in results.profiles.items() if profile.runs}
    if runs:
        out += ["", f"# raw runs for resuming, per profile: {', '.join(RUN_FIELDS)}", "[runs]"]
        for name, rows in runs.items():
            out.append(f"{_key(name)} = [")
            out += [f"  {_value([getattr(r, f) for f in RUN_FIELDS])}," for r in rows]
            out.append("]")
    return "\n".join(out) + "\n"
