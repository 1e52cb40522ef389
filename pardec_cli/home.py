"""Where pardec keeps its files.

Everything pardec writes lives under one home directory so that tests (and users who
want a separate store) can redirect it with one environment variable:

- ``PARDEC_HOME``: the data home (models, chats, tuning results). Default:
  ``$XDG_DATA_HOME/pardec`` or ``~/.local/share/pardec``.
- ``PARDEC_CONFIG_DIR``: the configuration directory (config.toml, user profiles).
  Default: ``$XDG_CONFIG_HOME/pardec`` or ``~/.config/pardec``.

Functions return paths without creating them; writers create what they need.
"""

from __future__ import annotations

import os
from pathlib import Path


def pardec_home() -> Path:
    """The data home: ``PARDEC_HOME`` or the XDG data directory."""
    explicit = os.environ.get("PARDEC_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "pardec"


def models_dir() -> Path:
    """Models that pardec converted or imported itself (GGUF imports, the embedded model)."""
    return pardec_home() / "models"


def compile_cache_dir() -> Path:
    """torch.compile's on-disk caches for the compiled runner (safe to delete)."""
    return pardec_home() / "compiled"


def kernels_dir() -> Path:
    """Kernels pardec compiled for this machine (`pardec_cli.kernels`; safe to delete)."""
    return pardec_home() / "kernels"


def config_dir() -> Path:
    """The configuration directory: ``PARDEC_CONFIG_DIR`` or the XDG config directory."""
    explicit = os.environ.get("PARDEC_CONFIG_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "pardec"
