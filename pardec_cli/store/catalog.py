"""The model catalog: short aliases for Hub models, with their drafters and heads.

The built-in catalog is ``pardec_cli/data/catalog.toml`` (read through
importlib.resources, so it is found in a wheel install too). A user catalog at
``config_dir()/catalog.toml`` with the same layout adds aliases or replaces built-in
ones. Aliases are lower-case and matched case-insensitively.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pardec_cli.errors import PardecError
from pardec_cli.home import config_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_LIST_FIELDS = ("drafters", "medusa", "eagle", "eagle3")
_TEXT_FIELDS = ("description", "chat_template", "notes", "params")
_KNOWN_FIELDS = {"repo", "revision", "family", *_TEXT_FIELDS, *_LIST_FIELDS}

# Accelerator kind -> the decoding method it serves.
ACCELERATOR_METHODS: dict[str, str] = {
    "drafter": "draft",
    "medusa": "medusa",
    "eagle": "eagle",
    "eagle3": "eagle3",
}

_ACCELERATOR_NOUNS = {"drafter": "drafter", "medusa": "Medusa heads", "eagle": "EAGLE heads", "eagle3": "EAGLE-3 heads"}


def accelerator_noun(kind: str, *, article: bool = False) -> str:
    """How people call an accelerator kind: "drafter", "Medusa heads", "EAGLE-3 heads";
    with `article`, as the object of "needs": "a drafter", "EAGLE heads"."""
    noun = _ACCELERATOR_NOUNS.get(kind, kind)
    return f"a {noun}" if article and not noun.endswith("s") else noun


@dataclass(frozen=True)
class Accelerator:
    """Something that makes a model faster: a drafter model or a trained head.

    `ref` is what the catalog names (an alias or a Hub id); `kind` is "drafter",
    "medusa", "eagle" or "eagle3"; `method` the decoding method it serves.
    """

    kind: str
    ref: str

    @property
    def method(self) -> str:
        return ACCELERATOR_METHODS[self.kind]


@dataclass(frozen=True)
class CatalogEntry:
    """One alias: the Hub repo it names, and what can draft for it.

    `drafters` holds aliases or Hub ids of smaller models sharing the tokenizer (best
    first); `medusa`, `eagle` and `eagle3` hold Hub ids of heads trained for this exact
    model. `chat_template` and `notes` are text for people.
    """

    alias: str
    repo: str
    family: str
    revision: str | None = None
    drafters: tuple[str, ...] = ()
    medusa: tuple[str, ...] = ()
    eagle: tuple[str, ...] = ()
    eagle3: tuple[str, ...] = ()
    description: str = ""
    chat_template: str = ""
    notes: str = ""
    params: str = ""  # parameter count as the model card gives it: "1.71B", "135M"

    @property
    def parameters(self) -> int | None:
        """`params` as a number ("1.71B" -> 1_710_000_000), or None when not given."""
        return parse_parameter_count(self.params)

    @property
    def approx_download_bytes(self) -> int | None:
        """About what `pardec pull` downloads for the model alone: 2 bytes a parameter
        (the Hub checkpoints in this catalog hold 16-bit weights), or None when unknown."""
        count = self.parameters
        return None if count is None else 2 * count

    def accelerators(self) -> list[Accelerator]:
        """Every accelerator of this model: drafters first (best first), then heads."""
        return [
            *(Accelerator("drafter", ref) for ref in self.drafters),
            *(Accelerator("medusa", ref) for ref in self.medusa),
            *(Accelerator("eagle", ref) for ref in self.eagle),
            *(Accelerator("eagle3", ref) for ref in self.eagle3),
        ]


_PARAM_UNITS = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_parameter_count(text: str) -> int | None:
    """"1.71B" -> 1_710_000_000, "135M" -> 135_000_000; None for "" or anything else."""
    text = text.strip().lower()
    if len(text) < 2 or text[-1] not in _PARAM_UNITS:
        return None
    try:
        value = float(text[:-1])
    except ValueError:
        return None
    return int(round(value * _PARAM_UNITS[text[-1]])) if value > 0 else None


def _entry(alias: str, table: Any, source: str) -> CatalogEntry:
    """Validate one ``[models.<alias>]`` table."""
    where = f"{source}: [models.{alias}]"
    if not isinstance(table, dict):
        raise PardecError(f"{where} must be a table")
    unknown = sorted(set(table) - _KNOWN_FIELDS)
    if unknown:
        raise PardecError(f"{where} has unknown field(s): {', '.join(unknown)}")
    for key in ("repo", "family"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise PardecError(f"{where} needs a non-empty string {key!r}")
    lists: dict[str, tuple[str, ...]] = {}
    for key in _LIST_FIELDS:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PardecError(f"{where}: {key!r} must be a list of strings")
        lists[key] = tuple(value)
    for key in ("revision", *_TEXT_FIELDS):
        if table.get(key) is not None and not isinstance(table[key], str):
            raise PardecError(f"{where}: {key!r} must be a string")
    if table.get("params") and parse_parameter_count(table["params"]) is None:
        raise PardecError(f"{where}: 'params' must read like \"1.7B\" or \"135M\", not {table['params']!r}")
    return CatalogEntry(
        alias=alias.lower(),
        repo=table["repo"],
        family=table["family"],
        revision=table.get("revision") or None,
        **{key: table.get(key, "") for key in _TEXT_FIELDS},
        **lists,
    )


def parse_catalog(text: str, source: str = "catalog.toml") -> dict[str, CatalogEntry]:
    """Parse catalog TOML text; `source` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PardecError(f"{source} is not valid TOML: {exc}") from None
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise PardecError(f"{source}: 'models' must be a table of aliases")
    return {alias.lower(): _entry(alias, table, source) for alias, table in models.items()}


def builtin_catalog_text() -> str:
    """The text of the catalog shipped with pardec."""
    return resources.files("pardec_cli").joinpath("data", "catalog.toml").read_text("utf-8")


def user_catalog_path() -> Path:
    """Where a user catalog is read from (it need not exist)."""
    return config_dir() / "catalog.toml"


def load_catalog() -> dict[str, CatalogEntry]:
    """All aliases: the built-in catalog, then the user catalog on top."""
    catalog = parse_catalog(builtin_catalog_text(), "pardec's built-in catalog.toml")
    user = user_catalog_path()
    if user.is_file():
        catalog.update(parse_catalog(user.read_text("utf-8"), str(user)))
    return catalog


def lookup_alias(name: str) -> CatalogEntry | None:
    """The catalog entry for an alias (case-insensitive), or None."""
    return load_catalog().get(name.strip().lower())


def suggest_aliases(name: str, n: int = 3) -> list[str]:
    """Aliases that look like `name` (for "did you mean" hints), closest first."""
    return difflib.get_close_matches(name.strip().lower(), list(load_catalog()), n=n, cutoff=0.6)


def entry_for_repo(repo: str) -> CatalogEntry | None:
    """The catalog entry whose repo is `repo` (case-insensitive), or None."""
    wanted = repo.strip().lower()
    return next((e for e in load_catalog().values() if e.repo.lower() == wanted), None)
