"""Head directories on disk: config.json plus weights, in the layouts their authors publish.

Weights come from safetensors when present, else from a pickle (``.pt``/``.bin``) read
with ``torch.load(weights_only=True)``, which refuses anything but tensors and plain
containers: a head file can never run code. Every problem is a `ModelLoadError` that
names the file and what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pardec_cli.errors import ModelLoadError, first_line


def read_config(folder: Path, what: str) -> dict[str, Any]:
    """config.json of a head directory, as a dict (`what` names the heads in errors)."""
    if not folder.is_dir():
        raise ModelLoadError(f"{what}: no such directory: {folder}")
    file = folder / "config.json"
    if not file.is_file():
        raise ModelLoadError(f"{what}: {folder} has no config.json")
    try:
        data = json.loads(file.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{what}: cannot read {file}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{what}: {file} is not a JSON object")
    return data


def find_weights(folder: Path, names: Sequence[str], what: str) -> Path:
    """The first of `names` (file names, best first) present in `folder`."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ModelLoadError(f"{what}: no weights in {folder} (looked for {', '.join(names)})")


def load_tensors(file: Path, what: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file or a weights-only pickle, on the CPU."""
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(file), device="cpu"))
        loaded = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused, truncated file, bad header...
        first = first_line(exc)
        raise ModelLoadError(f"{what}: cannot load {file}: {first}",
                             hint="pardec loads pickled heads only as plain tensors (weights_only=True)") from None
    if isinstance(loaded, Mapping) and isinstance(loaded.get("state_dict"), Mapping):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, Mapping) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ModelLoadError(f"{what}: {file} does not hold a plain mapping of tensors")
    return {str(k): v for k, v in loaded.items()}


def save_tensors(tensors: Mapping[str, torch.Tensor], file: Path) -> None:
    """Write tensors as safetensors (contiguous CPU copies; shared storage is split)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(file))


def expect_shape(tensors: Mapping[str, torch.Tensor], name: str, shape: Sequence[int], what: str) -> torch.Tensor:
    """tensors[name], which must exist with exactly `shape`."""
    tensor = tensors.get(name)
    if tensor is None:
        raise ModelLoadError(f"{what}: tensor {name!r} is missing")
    if tuple(tensor.shape) != tuple(shape):
        raise ModelLoadError(f"{what}: tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)}")
    return tensor


def mismatch(what: str, quantity: str, heads: int, model: int, model_name: str) -> ModelLoadError:
    """The error for heads trained for another model: names the quantity that differs."""
    return ModelLoadError(
        f"{what} do not match {model_name}: {quantity} {heads} in the heads, {model} in the model",
        hint="use heads trained for this model (pardec train-heads), or pass the right directory with --heads",
    )
