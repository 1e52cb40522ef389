"""What real generations taught auto: tokens per step and step costs, per configuration.

Every generation that goes through `Session.stream` (gen, chat, bench, serve) ends with
one call to `record_generation`, which appends a compact row to ``learned.json`` under
pardec's home, keyed by model fingerprint, hardware key, step kind (dtype, weights, eager
or compiled: `step_kind`), task profile and method label. `--method auto` reads the rows
for its model, machine and step kind (`read_usage`) and
turns them into measured speed-ups (`Usage.measurements`), so a user who never runs
`pardec tune` still gets choices fitted to this machine.

A row is what one generation saw after its first token:

    tokens      tokens emitted by decoding steps (the prefill's first token excluded)
    steps       decoding steps
    drafted     drafted tokens verified
    decode_s    wall time of the decoding steps (prefill excluded)
    propose_s   drafting time
    verify_s    time of the target forwards
    base_steps  steps that drafted nothing (a one-token forward: plain decoding's step)
    base_s      the verify time of those steps

Plain decoding's cost per step, the denominator of every speed-up, comes from what was
measured here, best first: generations with plain decoding (any profile); else the
one-token steps inside drafting generations (prompt lookup drafts nothing when no
n-gram matches) plus the loop's own overhead per step; else `pardec tune`'s measured
curve. With none of these a row says nothing about speed and is not used.

The file is bounded (`WINDOW` rows per key, `MAX_KEYS` keys, the least recently used
dropped), written once per generation under a lock and atomically (`statefile`), and
learning is off with ``learn = false`` in config.toml or ``PARDEC_LEARN=0``.
Torch-free.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pardec_cli import statefile
from pardec_cli.home import pardec_home
from pardec_cli.statefile import MapOf, Optional
from pardec_cli.selection.costmodel import CostCurve

FORMAT = 1
WINDOW = 32  # rows kept per (model, hardware, dtype, profile, method): recent use counts
MAX_KEYS = 256  # keys kept in all; the least recently updated go first
MIN_STEPS = 16  # shorter generations (warm-ups, one-line replies) say little about a method's speed
ROW_FIELDS = ("tokens", "steps", "drafted", "decode_s", "propose_s", "verify_s", "base_steps", "base_s")
_RESET = "delete it (pardec starts learning afresh), or set learn = false in config.toml"
VANILLA = "vanilla"


def step_kind(dtype: str, weights: str, runner: str) -> str:
    """What a decoding step is, as far as its cost goes: "bfloat16/int4/compiled",
    "float32/full/eager", "float32/q4q8/native" (`Session.step_kind` for a loaded model;
    `runner` as `Session.runner`)."""
    return f"{dtype}/{weights}/{runner}"


def learned_path() -> Path:
    """The usage file: ``pardec_home()/learned.json``."""
    return pardec_home() / "learned.json"


def learning_enabled(config_file: Path | None = None) -> bool:
    """False when ``PARDEC_LEARN`` is 0/false/no/off, or config.toml says ``learn = false``.

    The config file is read leniently here: a broken one is reported by the command
    that reads it for its options, not by every generation.
    """
    env = os.environ.get("PARDEC_LEARN")
    if env is not None:
        return env.strip().lower() not in ("0", "false", "no", "off")
    from pardec_cli.config import config_path

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    path = config_file or config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return True
    return data.get("learn", True) is not False


# ------------------------------------------------------------------ the data


@dataclass(frozen=True)
class UsageKey:
    """Where a row belongs: this model's weights on this machine, run by this kind of step
    (`step_kind`), a profile, a method."""

    fingerprint: str
    hardware: str  # Hardware.key
    step: str  # step_kind(): a compiled int4 step costs half an eager one, so they learn apart
    profile: str
    label: str  # canonical method label, as tune writes it ("pld[num_draft=8]")

    def text(self) -> str:
        return "|".join((self.fingerprint, self.hardware, self.step, self.profile, self.label))

    @classmethod
    def parse(cls, text: str) -> UsageKey | None:
        parts = text.split("|")
        return cls(*parts) if len(parts) == 5 else None


@dataclass(frozen=True)
class Row:
    """One generation, after its first token (see the module docstring)."""

    tokens: int
    steps: int
    drafted: int
    decode_s: float
    propose_s: float
    verify_s: float
    base_steps: int = 0
    base_s: float = 0.0

    def to_list(self) -> list[float | int]:
        return [round(v, 6) if isinstance(v, float) else v for v in (getattr(self, f) for f in ROW_FIELDS)]


@dataclass(frozen=True)
class Measurement:
    """A configuration measured on this machine, for one profile: what auto ranks first.

    `speedup` is tokens/s over plain decoding's; `low`/`high` the spread over the runs
    (per-run speed-ups: the 10th and 90th percentiles, or min and max of a few).
    """

    label: str
    speedup: float
    runs: int
    tokens_per_step: float
    low: float
    high: float
    source: str  # "tune" or "use" (or "tune+use")

    def describe(self) -> str:
        """'1.42x (1.30-1.51) over 12 runs by tune'."""
        spread = f" ({self.low:.2f}-{self.high:.2f})" if self.runs > 1 else ""
        return f"{self.speedup:.2f}x{spread} over {self.runs} run{'s' * (self.runs != 1)} ({self.source})"


#: A measured speed-up s over n runs ranks as 1 + (s - 1) * n / (n + SHRINK_RUNS): a
#: configuration measured once counts a third of its gain, one measured eight times 80%.
SHRINK_RUNS = 2


def shrunk(speedup: float, runs: int) -> float:
    """What a speed-up measured over `runs` runs ranks as: shrunk towards plain decoding's
    1.0 by how few runs stand behind it, so one lucky prompt does not beat eight."""
    return 1.0 + (speedup - 1.0) * runs / (runs + SHRINK_RUNS)


def spread(values: list[float]) -> tuple[float, float]:
    """(low, high) of per-run speed-ups: min and max of up to 5, else the 10th and 90th percentiles."""
    ordered = sorted(values)
    if len(ordered) <= 5:
        return ordered[0], ordered[-1]
    k = len(ordered) - 1
    return ordered[round(0.1 * k)], ordered[round(0.9 * k)]


def merge(measurements: Iterable[Measurement]) -> Measurement:
    """Several measurements of one label (tune's and use's) as one, weighted by runs."""
    items = list(measurements)
    runs = sum(m.runs for m in items)
    mean = sum(m.speedup * m.runs for m in items) / runs
    tokens = sum(m.tokens_per_step * m.runs for m in items) / runs
    sources = "+".join(dict.fromkeys(m.source for m in items))
    return Measurement(items[0].label, mean, runs, tokens, min(m.low for m in items), max(m.high for m in items), sources)


@dataclass
class Usage:
    """The rows for one model on one machine and step kind: profile -> label -> rows; and
    the verification cost curve measured there (None: never measured)."""

    rows: dict[str, dict[str, list[Row]]] = field(default_factory=dict)
    curve: CostCurve | None = None

    def vanilla_step_s(self) -> float | None:
        """Plain decoding's seconds per step as measured in use (any profile), or None."""
        rows = [r for by_label in self.rows.values() for r in by_label.get(VANILLA, [])]
        steps = sum(r.steps for r in rows)
        return sum(r.decode_s for r in rows) / steps if steps else None

    def base_forward_s(self) -> float | None:
        """Seconds of a one-token target forward, from the steps that drafted nothing."""
        rows = [r for by_label in self.rows.values() for label, rs in by_label.items() if label != VANILLA for r in rs]
        steps = sum(r.base_steps for r in rows)
        return sum(r.base_s for r in rows) / steps if steps >= 8 else None

    def measurements(self, profile: str, *, curve_base_ms: float | None = None) -> list[Measurement]:
        """The labels used under `profile` with their speed-up over plain decoding here.

        Per row: speed-up = tokens per step * plain decoding's step time / the row's step
        time, where plain decoding's step time is measured (see the module docstring);
        `curve_base_ms` (tune's measured one-token forward) is the last resort.
        """
        vanilla = self.vanilla_step_s()
        base_forward = self.base_forward_s()
        if base_forward is None and curve_base_ms is not None:
            base_forward = curve_base_ms / 1000
        found = []
        for label, rows in self.rows.get(profile, {}).items():
            if label == VANILLA:
                continue
            per_run = []
            for row in rows:
                if vanilla is not None:
                    base = vanilla
                elif base_forward is not None:
                    # The loop's own cost per step (sampling, bookkeeping) is paid by plain decoding too.
                    overhead = max(row.decode_s - row.verify_s - row.propose_s, 0.0) / row.steps
                    base = base_forward + overhead
                else:
                    continue
                per_run.append((row.tokens / row.steps) * base / (row.decode_s / row.steps))
            if not per_run:
                continue
            tokens = sum(r.tokens for r in rows) / sum(r.steps for r in rows)
            low, high = spread(per_run)
            found.append(Measurement(label, _geomean(per_run), len(per_run), tokens, low, high, "use"))
        return sorted(found, key=lambda m: -m.speedup)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


# ------------------------------------------------------------------- the file


def _row(value: Any) -> str | None:
    if not isinstance(value, list) or len(value) != len(ROW_FIELDS):
        return f"must be a list of {len(ROW_FIELDS)} numbers ({', '.join(ROW_FIELDS)})"
    if any(statefile.check_shape(v, float) for v in value) or any(v < 0 for v in value):
        return "must hold numbers >= 0"
    if value[1] < 1:
        return "steps must be at least 1"
    return None


SCHEMA = {
    "format": lambda v: None if v == FORMAT else f"must be {FORMAT}, not {v!r}",
    "entries": MapOf(str, {"updated": float, "rows": [_row]}),
    # Verification cost curves measured here, by "fingerprint|hardware|step kind".
    "curves": Optional(MapOf(str, {"updated": float, "source": str, "ms": MapOf(str, float),
                                   "context_tokens": Optional(int), "row_ms_per_1k": Optional(float)})),
    "note": Optional(str),
}  # fmt: skip
NOTE = "what pardec learned from generations on this machine (learn = false stops it)"


def _rows(raw: list[list[float]]) -> list[Row]:
    return [Row(int(r[0]), int(r[1]), int(r[2]), float(r[3]), float(r[4]), float(r[5]), int(r[6]), float(r[7])) for r in raw]


def read_usage(fingerprint: str, hardware: str, step: str, path: Path | None = None) -> Usage:
    """The rows and cost curve for this model, machine and kind of step (`step_kind`;
    empty when none, or the file is broken)."""
    try:
        data = statefile.read_json(path or learned_path(), SCHEMA, _RESET)
    except statefile.StateFileError:
        return Usage()  # a broken file teaches nothing; the next write replaces it
    usage = Usage(curve=_curve((data or {}).get("curves") or {}, _curve_key(fingerprint, hardware, step)))
    for text, entry in (data or {}).get("entries", {}).items():
        key = UsageKey.parse(text)
        if key is None or (key.fingerprint, key.hardware, key.step) != (fingerprint, hardware, step):
            continue
        usage.rows.setdefault(key.profile, {})[key.label] = _rows(entry["rows"])
    return usage


def _most_recent(entries: dict[str, Any]) -> dict[str, Any]:
    """At most `MAX_KEYS` of `entries` ({key: {"updated": ..., ...}}), the most recently updated."""
    if len(entries) <= MAX_KEYS:
        return entries
    keep = sorted(entries, key=lambda k: -entries[k]["updated"])[:MAX_KEYS]
    return {k: entries[k] for k in keep}


def record_generation(key: UsageKey, row: Row, *, path: Path | None = None, clock: float | None = None) -> bool:
    """Add one generation's row under `key` (one locked, atomic write). False when the
    row is too short to say anything (fewer than `MIN_STEPS` steps) and nothing was written."""
    return bool(record_rows([(key, row)], path=path, clock=clock))


def says_something(row: Row) -> bool:
    """Whether a row is worth keeping: `MIN_STEPS` steps or more, and time measured."""
    return row.steps >= MIN_STEPS and row.decode_s > 0


def record_rows(items: Sequence[tuple[UsageKey, Row]], *, path: Path | None = None,
                clock: float | None = None) -> list[tuple[UsageKey, Row]]:  # fmt: skip
    """Add rows (one generation's: a switching method's has one per arm) in one locked,
    atomic write; rows too short to say anything (fewer than `MIN_STEPS` steps) are left
    out. Returns the rows written."""
    kept = [(key, row) for key, row in items if says_something(row)]
    if not kept:
        return []
    import time

    stamp = time.time() if clock is None else clock

    def change(current: Mapping[str, Any] | None) -> dict[str, Any]:
        entries = dict((current or {}).get("entries", {}))
        for key, row in kept:
            entry = entries.get(key.text(), {"rows": []})
            entries[key.text()] = {"updated": stamp, "rows": [*entry["rows"], row.to_list()][-WINDOW:]}
        return {**(current or {}), "format": FORMAT, "note": NOTE, "entries": _most_recent(entries)}

    statefile.update_json(path or learned_path(), change, SCHEMA, _RESET)
    return kept


def generation_rows(label: str, stream: Any) -> list[tuple[str, Row]]:
    """What one finished generation (a `session.TextStream`) of the configuration `label`
    teaches: [(label, its row)], or for a switching method (adaptive: `stats.arms`) one row
    per arm but plain decoding, under the arm's own label.

    auto runs as adaptive; an "adaptive[arms=...]" row would rank nothing (it is no
    candidate), so a user who only ever ran auto taught it nothing. An arm's row holds its
    own steps, tokens and drafting and verifying time, plus its share (by steps) of the
    loop's time outside them, which a row of the configuration alone would hold too. Plain
    decoding's arm is left out: inside adaptive its steps carry the other arms' dry runs,
    and plain decoding's step time is what every speed-up is measured against. Arms run
    while they measure fastest, so their rows lean optimistic; an arm auto then chooses
    runs through its bad stretches too, and its later rows say so.
    """
    stats = stream.stats
    decode_s = stats.total_s - stats.ttft_s
    if not stats.arms:
        return [(label, Row(stats.generated_tokens - 1, stats.steps, stats.drafted_tokens, decode_s,
                            stream.decode_propose_s, stream.decode_verify_s, stream.base_steps, stream.base_verify_s))]
    from pardec_cli.selection.profiles import canonical_label, parse_label

    outside = max(decode_s - sum(a.seconds for a in stats.arms.values()), 0.0) / max(stats.steps, 1)
    rows = []
    for arm, totals in stats.arms.items():
        try:
            arm_label = canonical_label(*parse_label(arm))
        except Exception:  # noqa: BLE001 - an arm outside the registry (a test double): nothing to learn
            continue
        if arm_label == VANILLA:
            continue
        rows.append((arm_label, Row(totals.tokens, totals.steps, totals.drafted, totals.seconds + totals.steps * outside,
                                    totals.propose_s, totals.seconds - totals.propose_s, totals.base_steps,
                                    totals.base_verify_s)))
    return rows


#: Bumped when pardec's steps change what verifying n tokens costs (2: the compiled CPU
#: steps' attention, `engine.attention`; 3: int4 layers of one input sharing a kernel
#: call, `quant.share_products`; 4: pardec's int4 kernels on every core, not one; 5: pardec's
#: attention op in the steps on its kernels; 6: the float16 cache of q4q8 models, and 8
#: timings of the small sizes, `tuning.curve.STEP_CURVE_REPEATS`; 7: the AVX2 library's
#: 512-bit q4q8 kernel in its VNNI build; 8: its int8 head on codes packed 16 outputs to a
#: register, `quant.pack_head`; 9: the native step's per-row work on every core, and
#: attention's queries shared out evenly; 10: q4q8 records prefetched into L2; 11: what
#: each row costs per 1000 tokens of text, `CostCurve.row_ms_per_1k`; 12: GPU steps timed to
#: the end of their work, not their launch, `hardware.synchronize_device`): curves measured
#: before are measured again.
CURVE_VERSION = 12


def _curve_key(fingerprint: str, hardware: str, step: str) -> str:
    return "|".join((fingerprint, hardware, step, f"v{CURVE_VERSION}"))


def _curve(curves: Mapping[str, Any], key: str) -> CostCurve | None:
    found = curves.get(key)
    if not found:
        return None
    try:
        curve = CostCurve.from_mapping({int(n): ms for n, ms in found["ms"].items()}, found["source"])
    except ValueError:  # a hand-edited curve without its n=1 point: measured again
        return None
    return replace(curve, context_tokens=int(found.get("context_tokens") or 0),
                   row_ms_per_1k=max(float(found.get("row_ms_per_1k") or 0.0), 0.0))


def read_curve(fingerprint: str, hardware: str, step: str, path: Path | None = None) -> CostCurve | None:
    """The verification cost curve measured for this model, machine and step kind (None:
    never measured here, or the file is broken)."""
    return read_usage(fingerprint, hardware, step, path).curve


def record_curve(fingerprint: str, hardware: str, step: str, curve: CostCurve, *, path: Path | None = None) -> None:
    """Keep `curve` (measured on this machine for this step kind) for later sessions."""
    import time

    def change(current: Mapping[str, Any] | None) -> dict[str, Any]:
        curves = dict((current or {}).get("curves") or {})
        curves[_curve_key(fingerprint, hardware, step)] = {
            "updated": time.time(), "source": curve.source, "ms": {str(n): round(ms, 3) for n, ms in curve.points},
            "context_tokens": curve.context_tokens, "row_ms_per_1k": round(curve.row_ms_per_1k, 4),
        }  # fmt: skip
        return {"entries": {}, **(current or {}), "format": FORMAT, "note": NOTE, "curves": _most_recent(curves)}

    statefile.update_json(path or learned_path(), change, SCHEMA, _RESET)


def keep_session_curve(session: Any, curve: CostCurve) -> None:
    """`record_curve` for a loaded `Session`'s model, machine and step kind. A read-only
    home or a busy lock loses only the curve: it is measured again next time."""
    from pardec_cli.errors import PardecError
    from pardec_cli.selection.selector import session_model

    hardware, info = session_model(session)
    try:
        record_curve(info.fingerprint, hardware.key, session.step_kind, curve)
    except (PardecError, OSError):
        pass


def forget(path: Path | None = None) -> bool:
    """Delete the usage file; True when there was one."""
    target = path or learned_path()
    if target.is_file():
        target.unlink()
        return True
    return False


# ------------------------------------------------------------ from a session


class UsageRecorder:
    """Records the generations of one `Session` (built on its first generation).

    What does not change between generations (learning on or off, the model's
    fingerprint, the hardware key) is worked out once, on the first generation that
    finishes; each later one costs one locked write.
    """

    def __init__(self, session: Any, on_record: Callable[[str, str, Row], None] | None = None) -> None:
        self.session = session
        # Told (profile, label, row) of each row written by a generation that teaches at
        # once (`callback`'s `live`): the session's auto uses it from its next choice.
        self.on_record = on_record
        self._where: tuple[str, str, str] | None = None
        self._enabled: bool | None = None
        self.path: Path | None = None  # None: learned_path() at write time

    def enabled(self) -> bool:
        if self._enabled is None:
            self._enabled = learning_enabled()
        return self._enabled

    def where(self) -> tuple[str, str, str]:
        """(fingerprint, hardware key, step kind) of the session's model here."""
        if self._where is None:
            from pardec_cli.selection.selector import session_model

            hardware, info = session_model(self.session)
            self._where = (info.fingerprint, hardware.key, self.session.step_kind)
        return self._where

    def callback(self, proposer: Any, prompt_ids: Any, profile: str | None, *, live: bool = True) -> Any:
        """The `on_finish` for one generation of `proposer` on `prompt_ids` (None when
        learning is off); with `live`, the rows written also go to `on_record`."""
        if not self.enabled():
            return None
        from pardec_cli.selection.profiles import canonical_label

        try:
            label = canonical_label(proposer.name, proposer.knobs())
        except Exception:  # noqa: BLE001 - a proposer outside the registry (a test double): nothing to learn
            return None

        def on_finish(stream: Any) -> None:
            rows = [(arm, row) for arm, row in generation_rows(label, stream) if says_something(row)]
            if not rows:
                return
            name = profile
            if name is None:
                from pardec_cli.selection.tasks import detect_task

                name = detect_task(self.session.tokenizer.decode(list(prompt_ids))).profile
            from pardec_cli.errors import PardecError

            try:
                written = record_rows([(UsageKey(*self.where(), name, arm), row) for arm, row in rows], path=self.path)
            except (PardecError, OSError):
                return  # learning is a bonus: a read-only home or a busy lock never fails a generation
            if live and self.on_record is not None:
                for key, row in written:
                    self.on_record(key.profile, key.label, row)

        return on_finish
