"""Which accelerators (drafters, Medusa/EAGLE heads) a model can use on this machine now.

`--method auto` may pick a method that needs an accelerator only when one is here:
pulled with the model (and not found incompatible), or a catalog accelerator of the
model that is on disk anyway (a drafter in pardec's store, such as the embedded
SmolLM2-135M for the larger SmolLM2 models, or in the Hugging Face cache). Nothing is
downloaded or converted, and neither torch nor transformers is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pardec_cli.home import models_dir
from pardec_cli.store import records
from pardec_cli.store.catalog import entry_for_repo, lookup_alias
from pardec_cli.store.layout import is_complete


@dataclass(frozen=True)
class InstalledAccelerator:
    """An accelerator on disk: its kind ("drafter", "medusa", "eagle", "eagle3"), the
    reference a method's knob takes (alias, Hub id or path), and its size when known
    (for the drafting cost)."""

    kind: str
    ref: str
    path: Path | None = None
    parameters: int | None = None
    layers: int | None = None
    # Tokens per step measured for this accelerator (trained heads: from their held-out
    # agreement with the model); None: the profile's prior for its method applies.
    tokens_per_step: float | None = None


def local_path(ref: str) -> Path | None:
    """Where the model `ref` (store name, pulled name, alias, Hub id or directory) is on
    disk, without downloading or converting anything; None when it is not here."""
    from pardec_cli.store.resolve import cached_snapshot, is_usable, looks_like_hub_id

    spec = ref.strip()
    path = Path(spec).expanduser()
    if spec.startswith((".", "/", "~")):
        return path if (path / "config.json").is_file() else None
    if "/" not in spec and is_complete(models_dir() / spec):
        return models_dir() / spec
    record = records.find(spec)
    if record is not None and record.target.present():
        return record.target.snapshot
    entry = lookup_alias(spec)
    repo = entry.repo if entry else spec if looks_like_hub_id(spec) else None
    if repo:
        cached = cached_snapshot(repo, entry.revision if entry else None)
        if cached is not None and is_usable(cached, require_weights=True):
            return cached
    return None


def sized_accelerator(kind: str, ref: str, path: Path | None) -> InstalledAccelerator:
    """An `InstalledAccelerator` with its size read from the files at `path` (if any)."""
    from pardec_cli.store.inventory import config_summary

    if path is None:
        return InstalledAccelerator(kind, ref)
    summary = config_summary(path)
    return InstalledAccelerator(kind, ref, path, summary.get("parameters"), summary.get("layers"))


def installed_accelerators(
    model_name: str, repo: str | None = None, *, source: str | None = None, path: Path | None = None
) -> list[InstalledAccelerator]:
    """The accelerators usable with the model named `model_name` (from repo `repo`;
    `source` and `path` as in `ResolvedModel`, to find heads trained for a local folder).

    Heads trained here come first (with the tokens per step their training measured),
    then pulled accelerators (in the pull's order, best first), then catalog ones found
    on disk. Accelerators a pull found incompatible are left out.
    """
    from pardec_cli.store.heads import trained_heads

    found: list[InstalledAccelerator] = [
        InstalledAccelerator(head.kind, f"{head.kind} heads (trained)", head.path, tokens_per_step=head.tokens_per_step)
        for head in trained_heads(model_name, source=source, path=path)
    ]
    seen: set[str] = set()
    record = records.find(model_name) or (records.find(repo) if repo else None)
    if record is not None:
        for acc in record.accelerators:
            if acc.present() and acc.status != records.INCOMPATIBLE:
                ref = acc.name or acc.repo
                found.append(sized_accelerator(acc.kind, ref, acc.snapshot))
                seen.update({ref.lower(), acc.repo.lower()})
    entry = lookup_alias(model_name) or (entry_for_repo(repo) if repo else None)
    if entry is not None:
        for acc in entry.accelerators():
            if acc.ref.lower() in seen:
                continue
            path = local_path(acc.ref)
            if path is not None:
                found.append(sized_accelerator(acc.kind, acc.ref, path))
                seen.add(acc.ref.lower())
    return found
