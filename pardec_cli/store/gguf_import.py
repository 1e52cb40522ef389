"""GGUF -> safetensors: import a llama.cpp model file into pardec's model store.

Q4_0/Q4_1/Q8_0 blocks are kept as they are (`store.quantized`: packed codes plus float16
scales, about the GGUF file's size) for architectures whose tensors transformers only
renames or row-permutes (llama and friends); other files go through transformers' GGUF
reader, which dequantizes every tensor, and are saved as an ordinary checkpoint. Either
way the result lives under ``models_dir()/<name>/`` so that later loads take a second,
not a conversion. The embedded SmolLM2 model goes through this same code path.

Only the file's header is read here (in pure Python, `gguf_architecture`) to give a
clear error early; torch and transformers are imported when the conversion starts. The
conversion lists the file's tensors with the same header reader (`read_gguf_tensors`),
skipping the metadata values gguf's own reader would parse one by one.
"""

from __future__ import annotations

import contextlib
import io
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from pardec_cli.errors import ModelLoadError, ModelNotFoundError, PardecError, first_line
from pardec_cli.hardware import canonical_dtype
from pardec_cli.home import models_dir
from pardec_cli.store.layout import check_model_name, is_complete, staged_model_dir, write_marker

if TYPE_CHECKING:  # pragma: no cover
    from pardec_cli.progress import StageReport

GGUF_MAGIC = b"GGUF"

# GGUF metadata value types -> struct format of one scalar (8 = string, 9 = array).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_UINT32 = 4
_ARCHITECTURE, _ALIGNMENT = b"general.architecture", b"general.alignment"


class _BadGGUF(Exception):
    """The header does not parse."""


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _BadGGUF("file ends inside the header")
    return data


def _u64(f: BinaryIO) -> int:
    return struct.unpack("<Q", _read(f, 8))[0]


def _string(f: BinaryIO) -> bytes:
    length = _u64(f)
    if length > 1 << 24:
        raise _BadGGUF("implausible string length")
    return _read(f, length)


def _skip_value(f: BinaryIO, vtype: int) -> None:
    if vtype in _SCALARS:
        _read(f, struct.calcsize(_SCALARS[vtype]))
    elif vtype == _STRING:
        _string(f)
    elif vtype == _ARRAY:
        item_type = struct.unpack("<I", _read(f, 4))[0]
        count = _u64(f)
        if item_type in _SCALARS:  # fixed size: seek over the whole array at once
            f.seek(count * struct.calcsize(_SCALARS[item_type]), 1)
        else:
            for _ in range(count):
                _skip_value(f, item_type)
    else:
        raise _BadGGUF(f"unknown metadata type {vtype}")


def _counts(f: BinaryIO, path: Path) -> tuple[int, int]:
    """(tensor count, metadata count) of the GGUF file open at its start as `f`, past its
    magic and version: a file that is no GGUF is a `ModelLoadError`, one too old or written
    for the other byte order a `_BadGGUF`."""
    if f.read(4) != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (it does not start with 'GGUF')",
                             hint="pass a .gguf file as written by llama.cpp")  # fmt: skip
    version = struct.unpack("<I", _read(f, 4))[0]
    if version & 0xFFFF == 0:  # a small version number read in the other byte order
        raise _BadGGUF("it was written for big-endian machines; pardec reads little-endian ones (llama.cpp's default)")
    if version < 2:
        raise _BadGGUF(f"GGUF version {version} is too old")
    return _u64(f), _u64(f)


def _metadata(f: BinaryIO, kv_count: int, wanted: dict[bytes, int], *, all_entries: bool) -> dict[bytes, str | int]:
    """The `wanted` keys' values (key -> its GGUF type: a string or a uint32; one of another
    type is skipped like the rest) among the `kv_count` metadata entries at `f`. With
    `all_entries`, `f` is left past the metadata (at the tensor infos); without, it returns as
    soon as every wanted key is read (``general.architecture`` usually comes first)."""
    found: dict[bytes, str | int] = {}
    for _ in range(kv_count):
        key = _string(f)
        vtype = struct.unpack("<I", _read(f, 4))[0]
        if wanted.get(key) != vtype:
            _skip_value(f, vtype)
        elif vtype == _STRING:
            found[key] = _string(f).decode("utf-8", errors="replace")
        else:
            found[key] = struct.unpack(_SCALARS[vtype], _read(f, struct.calcsize(_SCALARS[vtype])))[0]
        if not all_entries and len(found) == len(wanted):
            break
    return found


def _architecture(found: dict[bytes, str | int], path: Path) -> str:
    """``general.architecture`` among the metadata `_metadata` found in the file at `path`."""
    if _ARCHITECTURE not in found:
        raise ModelLoadError(f"{path} has no general.architecture in its GGUF header")
    return str(found[_ARCHITECTURE])


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` from a GGUF file's header (for example "llama").

    Raises `ModelLoadError` when the file is not a readable GGUF file.
    """
    try:
        with open(path, "rb") as f:
            _, kv_count = _counts(f, path)
            found = _metadata(f, kv_count, {_ARCHITECTURE: _STRING}, all_entries=False)
    except _BadGGUF as exc:
        raise ModelLoadError(f"{path} is not a valid GGUF file: {exc}") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    return _architecture(found, path)


@dataclass(frozen=True)
class GGUFTensor:
    """A tensor of a GGUF file as gguf's ``GGUFReader`` lists it: `data` a read-only numpy
    view of the file, [rows, ..., columns] for dense types (float32, float16, ...) and uint8
    [rows, ..., bytes per row] for quantized ones."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: Any  # numpy.ndarray


def read_gguf_tensors(path: Path) -> tuple[str, list[GGUFTensor]]:
    """(``general.architecture``, every tensor) of a (little-endian) GGUF file, the metadata
    skipped rather than parsed: gguf's ``GGUFReader`` makes a numpy view of every value
    (4.2-4.5 s for the embedded model's 49,152-token vocabulary and merges), and a
    conversion reads the vocabulary twice through transformers already."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    dense = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
             GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
             GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
             GGMLQuantizationType.I64: np.int64}  # fmt: skip
    infos = []
    try:
        with open(path, "rb") as f:
            tensor_count, kv_count = _counts(f, path)
            found = _metadata(f, kv_count, {_ARCHITECTURE: _STRING, _ALIGNMENT: _UINT32}, all_entries=True)
            for _ in range(tensor_count):
                name = _string(f).decode("utf-8")
                n_dims = struct.unpack("<I", _read(f, 4))[0]
                dims = struct.unpack(f"<{n_dims}Q", _read(f, 8 * n_dims))
                kind, offset = struct.unpack("<I", _read(f, 4))[0], _u64(f)
                infos.append((name, dims, kind, offset))
            start = f.tell()
    except _BadGGUF as exc:
        raise ModelLoadError(f"{path} is not a valid GGUF file: {exc}") from None
    architecture, alignment = _architecture(found, path), int(found.get(_ALIGNMENT, 32))
    if alignment == 0 or alignment & (alignment - 1):
        raise ModelLoadError(f"{path} is not a valid GGUF file: alignment {alignment} is no power of two")
    start += -start % alignment
    data = np.memmap(path, mode="r")
    tensors = []
    for name, dims, raw_kind, offset in infos:
        kind = GGMLQuantizationType(raw_kind)
        elements = math.prod(dims)
        shape = tuple(reversed(dims))  # GGUF lists dimensions innermost first
        dtype = dense.get(kind)
        if dtype is None:
            block, size = GGML_QUANT_SIZES[kind]
            dtype, nbytes, shape = np.uint8, elements * size // block, quant_shape_to_byte_shape(shape, kind)
        else:
            nbytes = elements * np.dtype(dtype).itemsize
        begin = start + offset
        if begin + nbytes > data.shape[0]:
            raise ModelLoadError(f"{path} is not a valid GGUF file: tensor {name} ends past the file's end")
        tensors.append(GGUFTensor(name, kind, data[begin:begin + nbytes].view(dtype).reshape(shape)))
    return architecture, tensors


def _check_gguf_path(path: Path) -> None:
    if not path.exists():
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    if not path.is_file():
        raise PardecError(f"{path} is not a file", hint="pass the path of a .gguf file")


def _convert_keeping_blocks(gguf_path: Path, out_dir: Path, *, source_repo: str | None, architecture: str,
                            report: StageReport | None = None) -> bool:
    """Store the file with its quantized blocks kept (`store.quantized`); False when its
    architecture needs the dense conversion instead."""
    from pardec_cli.store.loading import quiet_transformers
    from pardec_cli.store.quantized import convert_gguf_quantized

    try:
        with quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
            return convert_gguf_quantized(gguf_path, out_dir, source_repo=source_repo, report=report)
    except OSError as exc:
        raise PardecError(
            f"cannot write the converted model to {out_dir.parent}: {exc.strerror or exc}",
            hint="check the free disk space (about the GGUF file's size)",
        ) from None
    except Exception as exc:
        raise _conversion_error(exc, gguf_path, architecture) from None


def _conversion_error(exc: Exception, gguf_path: Path, architecture: str) -> ModelLoadError:
    """The one-line error for a GGUF file that transformers cannot read or convert."""
    first = first_line(exc)
    if "architecture" in first.lower() or "not supported" in first.lower():
        return ModelLoadError(
            f"transformers cannot load GGUF architecture {architecture!r} ({gguf_path.name}): {first}",
            hint="only GGUF files of architectures that transformers supports (llama, "
            "mistral, qwen2, qwen3, phi3, gemma2/3, ...) can be imported",
        )
    return ModelLoadError(
        f"cannot convert {gguf_path.name} (GGUF architecture {architecture!r}): {first}",
        hint="the file may be damaged, or use a quantization transformers cannot "
        "dequantize (Q4_0/Q4_1/Q5/Q8_0/K-quants work)",
    )


def _convert(gguf_path: Path, out_dir: Path, *, dtype: str, source_repo: str | None, architecture: str,
             report: StageReport | None = None) -> bool:
    """Convert `gguf_path` into `out_dir`: blocks kept where the architecture allows it
    (True), else dequantized into a `dtype` checkpoint (False)."""
    if _convert_keeping_blocks(gguf_path, out_dir, source_repo=source_repo, architecture=architecture, report=report):
        return True
    _convert_dense(gguf_path, out_dir, dtype=dtype, source_repo=source_repo, architecture=architecture, report=report)
    return False


def _convert_dense(gguf_path: Path, out_dir: Path, *, dtype: str, source_repo: str | None,
                   architecture: str, report: StageReport | None = None) -> None:  # fmt: skip
    """Dequantize `gguf_path` with transformers and save a checkpoint into `out_dir`."""
    if report is not None:  # transformers reads and dequantizes in one call: no count to show
        report(f"reading and dequantizing {gguf_path.name} (transformers)", 0, None)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pardec_cli.hardware import torch_dtype
    from pardec_cli.store.loading import quiet_transformers

    where = {"gguf_file": gguf_path.name}
    # transformers' GGUF reader draws a raw tqdm bar that ignores its progress-bar
    # switch; it goes to sys.stderr, so a redirect keeps pardec's stderr clean.
    try:
        with quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), **where, dtype=torch_dtype(dtype)
            )
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **where)
    except Exception as exc:
        raise _conversion_error(exc, gguf_path, architecture) from None
    # The dequantized weights are plain tensors: drop the GGUF "quantization" so that
    # save_pretrained writes an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = source_repo or gguf_path.stem
    if report is not None:
        report("writing the model", 0, None)
    try:
        with quiet_transformers():
            model.save_pretrained(str(out_dir))
            tokenizer.save_pretrained(str(out_dir))
    except OSError as exc:
        raise PardecError(
            f"cannot write the converted model to {out_dir.parent}: {exc.strerror or exc}",
            hint="check the free disk space (a float32 copy takes 4 bytes per parameter)",
        ) from None


def import_gguf(
    gguf_path: Path,
    name: str,
    *,
    overwrite: bool = False,
    source_repo: str | None = None,
    dtype: str = "float32",
    report: StageReport | None = None,
) -> Path:
    """Convert a GGUF file into ``models_dir()/name`` and return that directory.

    `source_repo` is the Hub id the GGUF was made from (recorded in config.json and the
    marker). `dtype` is the dtype the weights are saved in: float32 keeps greedy decoding
    bit-exact; bfloat16 halves the size (lower precision is chosen at load time anyway).
    `report` hears the conversion's stages (`pardec_cli.progress.StageReport`).
    Raises `ModelNotFoundError` for a missing file, `ModelLoadError` for a file that is
    not GGUF or that transformers cannot load, and `PardecError` when `name` exists and
    not `overwrite`.
    """
    path = Path(gguf_path).expanduser()
    _check_gguf_path(path)
    check_model_name(name)
    dtype = canonical_dtype(dtype)
    target = models_dir() / name
    if is_complete(target) and not overwrite:
        raise PardecError(
            f"a model named {name!r} already exists in {models_dir()}",
            hint="choose another name, or overwrite it",
        )
    architecture = gguf_architecture(path)
    with staged_model_dir(name, overwrite=overwrite) as tmp:
        kept = bool(_convert(path, tmp, dtype=dtype, source_repo=source_repo, architecture=architecture, report=report))
        write_marker(
            tmp,
            source="gguf",
            gguf=str(path.resolve()),
            gguf_size=path.stat().st_size,
            source_repo=source_repo,
            architecture=architecture,
            dtype="float32" if kept else dtype,
            stored="gguf-blocks" if kept else "dense",
        )
    return target
