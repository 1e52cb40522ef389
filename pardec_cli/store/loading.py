"""Load a model directory into a (model, tokenizer) pair, quietly and with clear errors.

Before transformers sees the directory, `check_model_files` reads config.json and the
header of every safetensors file: a missing, corrupt or truncated file becomes a
`ModelLoadError` naming it, rather than a deep traceback (or a crash) mid-load.
transformers' progress bars and warnings are silenced while loading, because pardec's
stdout and stderr belong to the generated text and pardec's own messages.
"""

from __future__ import annotations

import json
import struct
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pardec_cli.errors import ModelLoadError, first_line
from pardec_cli.hardware import canonical_dtype, torch_dtype

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header
_REDO_HINT = "the file is incomplete or damaged: download or convert the model again"


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' and huggingface_hub's logging, progress bars and warnings.

    The previous settings are restored on exit.
    """
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as tf_logging

    verbosity = tf_logging.get_verbosity()
    tf_bars = tf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    hub_utils.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_logging.set_verbosity(verbosity)
        if tf_bars:
            tf_logging.enable_progress_bar()
        if not hub_bars_off:
            hub_utils.enable_progress_bars()


# ------------------------------------------------------------------ file checks


def check_safetensors_file(file: Path) -> None:
    """Raise `ModelLoadError` unless `file` has a readable header and all its data.

    A safetensors file is an 8-byte little-endian header length, a JSON header giving
    each tensor's ``data_offsets`` into the data that follows, then the data; the file
    must be at least ``8 + header length + largest end offset`` bytes long.
    """
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ModelLoadError(f"{file} is truncated ({size} bytes)", hint=_REDO_HINT)
            header_len = struct.unpack("<Q", prefix)[0]
            if header_len > min(size - 8, _MAX_HEADER):
                raise ModelLoadError(
                    f"{file} is corrupt or truncated: its header claims {header_len} bytes, "
                    f"the file has {size}",
                    hint=_REDO_HINT,
                )
            header = json.loads(f.read(header_len))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {file}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise ModelLoadError(
            f"{file} is corrupt: its header is not valid JSON", hint=_REDO_HINT
        ) from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{file} is corrupt: its header is not a JSON object", hint=_REDO_HINT)
    data_end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise ModelLoadError(
                f"{file} is corrupt: bad offsets for tensor {name!r}", hint=_REDO_HINT
            )
        data_end = max(data_end, offsets[1])
    expected = 8 + header_len + data_end
    if size < expected:
        raise ModelLoadError(
            f"{file} is truncated: {size} bytes, its header needs {expected}", hint=_REDO_HINT
        )


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text("utf-8"))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {file}: {exc.strerror or exc}") from None
    except ValueError:
        raise ModelLoadError(f"{file} is not valid JSON", hint=_REDO_HINT) from None


def check_model_files(path: Path) -> dict[str, Any]:
    """Check a model directory's files before loading; return its config.json contents.

    Raises `ModelLoadError` for a missing directory or config.json, a shard listed in a
    ``*.safetensors.index.json`` that is missing, a damaged safetensors file, or no
    weights at all.
    """
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path} has no config.json (not a transformers model)")
    config = _read_json(config_file)
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_file} is not a JSON object", hint=_REDO_HINT)
    for index in path.glob("*.safetensors.index.json"):
        weight_map = _read_json(index).get("weight_map", {})
        for shard in sorted(set(weight_map.values())):
            if not (path / shard).is_file():
                raise ModelLoadError(
                    f"{path / shard} is missing (listed in {index.name})", hint=_REDO_HINT
                )
    safetensors = sorted(path.glob("*.safetensors"))
    for file in safetensors:
        check_safetensors_file(file)
    if not safetensors and not any(path.glob("*.bin")) and not any(path.glob("*.pt")):
        raise ModelLoadError(f"{path} holds no model weights (*.safetensors or *.bin)")
    return config


# ---------------------------------------------------------------------- loading


def _load_config(path: Path, model_type: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path))
    except OSError as exc:
        _check_still_there(path)
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {first_line(exc)}", hint=_REDO_HINT) from None
    except (ValueError, KeyError):
        raise ModelLoadError(
            f"transformers cannot load architecture {model_type!r} ({path / 'config.json'})",
            hint="upgrade transformers (pip install -U transformers); "
            "pardec never runs code shipped with a model",
        ) from None



def load_model(
    path: Path, *, dtype: str, device: str, weights: str = "full", notice: Callable[[str], None] | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` from a model directory, ready for inference.

    `dtype` is a name from `pardec_cli.hardware` ("float32", "bfloat16", "float16");
    `device` a resolved device ("cpu", "cuda", "cuda:1", "mps"). `weights` says how the
    decoder's linear layers hold their weights: "full" (dense in `dtype`), "int8",
    "int4" (`pardec_cli.quant`; on a CPU the output head's logits then go through
    int8 too), "q4q8" (int4 by int8 activations,
    `quant.Int4Records`; `notice` hears when its kernel is built first), "q8q8" (Q8_0
    by int8 activations in float32, `quant.Q8Records`; a 16-bit checkpoint is read in 16
    bits, then quantized) or "auto" (`pardec_cli.weight_modes.resolve_weights`). In bfloat16 on a CPU with AVX512-BF16,
    int4, int8 and (without AMX) full weights and their head are multiplied by pardec's own
    kernels once they are built (`_own_kernels`). A
    directory stored with a GGUF file's blocks kept (`store.quantized`) loads from
    them: exactly dequantized for "full", its 4-bit codes packed directly for "int4",
    its Q8_0 blocks as they are for "q8q8".
    On a CPU the weights a step streams end on 2 MB pages where Linux offers them
    (`hugepages.move_to_huge_pages`). The model uses SDPA
    attention (eager where the architecture lacks it) and is in eval mode. Every failure
    is a `ModelLoadError` naming the file or architecture at fault.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pardec_cli.errors import PardecUsageError
    from pardec_cli.hardware import cpu_info
    from pardec_cli.hugepages import move_to_huge_pages
    from pardec_cli.quant import (head_on_records, lookup_only_embedding, pack_linears, quantize_head, quantize_linears,
                                  share_products, use_avx2, use_records)
    from pardec_cli.weight_modes import resolve_weights
    from pardec_cli.store.inventory import checkpoint_dtype
    from pardec_cli.store.quantized import is_quantized_dir, stored_kind

    path = Path(path)
    raw_config = check_model_files(path)
    model_type = str(raw_config.get("model_type", "unknown"))
    dtype = canonical_dtype(dtype)
    stored_blocks = is_quantized_dir(path)
    # float32 dense and int8 layers (and the head) go to pardec's AVX2 kernels where they are
    # built (`_avx2_kernels` starts their build otherwise: this run keeps torch's), and auto
    # may then pick q4q8 for 4-bit blocks and q8q8 for dense layers (`auto_native`).
    float32_cpu = device == "cpu" and dtype == "float32"
    avx2_ready = float32_cpu and weights in ("auto", "full", "int8") and _avx2_kernels()
    mode = resolve_weights(weights, dtype=dtype, device=device, stored=stored_kind(path), avx2=avx2_ready)
    q4q8, q8q8 = mode == "q4q8", mode == "q8q8"
    if q4q8:  # int4 codes, on pardec's kernel with int8 activations (`_own_kernels`)
        mode = "int4"
    records = None
    ours = bf16_kernel_weights(mode)
    if q8q8:  # int8 groups by int8 activations: the AVX2 library, built now if need be
        if dtype != "float32":
            raise PardecUsageError(f"--weights q8q8 computes in float32, not {dtype}", hint="use --dtype float32 or auto")
        _avx2_now(device=device, notice=notice, weights="q8q8")
    elif q4q8 or (ours and device == "cpu" and dtype == "bfloat16"):
        records = _own_kernels(device=device, dtype=dtype, q4q8=q4q8, notice=notice)
    with quiet_transformers():
        config = _load_config(path, model_type)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except Exception as exc:
            _check_still_there(path)
            raise ModelLoadError(
                f"cannot load the tokenizer in {path}: {first_line(exc)}",
                hint="a model directory needs its tokenizer files "
                "(tokenizer.json or tokenizer.model)",
            ) from None
        # q8q8 of a dense checkpoint: read in its own 16 bits and quantized layer by layer,
        # the rest made float32 after (`_float32_but_records`): in float32 first, a 7B model
        # would take 28 GB before quantizing.
        stored16 = checkpoint_dtype(raw_config)
        read_dtype = stored16 if q8q8 and not stored_blocks and stored16 in ("bfloat16", "float16") else dtype
        kwargs: dict[str, Any] = {"config": config, "dtype": torch_dtype(read_dtype)}
        if device != "cpu":
            kwargs["device_map"] = device
        try:
            if stored_blocks:  # its blocks were written by pardec itself, tensor by tensor
                # auto on the AVX2 library: each kept layer in its own width (a Q4_K_M
                # file's Q6_K layers as Q8_0 groups, not requantized to 4 bits)
                own_widths = weights == "auto" and (q8q8 or records == "float32")
                model, info = _load_quantized(path, config, dtype, device, mode, records, own_widths), {}
            else:
                model, info = _from_pretrained(AutoModelForCausalLM, path, {**kwargs, "output_loading_info": True})
        except ModelLoadError:
            raise
        except torch.cuda.OutOfMemoryError:
            raise ModelLoadError(
                f"not enough GPU memory to load {path.name} in {dtype}",
                hint="try a smaller model, a 16-bit --dtype, or --device cpu",
            ) from None
        except MemoryError:
            raise ModelLoadError(f"not enough memory to load {path.name} in {dtype}") from None
        except ValueError as exc:
            _check_still_there(path)
            if "Unrecognized configuration class" in str(exc):
                raise ModelLoadError(
                    f"transformers cannot load architecture {model_type!r} "
                    "as a causal language model"
                ) from None
            raise ModelLoadError(f"cannot load the model in {path}: {first_line(exc)}") from None
        except Exception as exc:  # OSError, safetensors' SafetensorError, ...
            _check_still_there(path)
            raise ModelLoadError(
                f"cannot load the model in {path}: {first_line(exc)}", hint=_REDO_HINT
            ) from None
    check_loaded_weights(path, info)
    if not stored_blocks:
        quantize_linears(model, mode)
    if q8q8:
        _float32_but_records(model)
    # with q4q8 or q8q8 on the AVX2 library (loaded already), its head on int8 codes there too
    avx2 = q8q8 or (float32_cpu and (records == "float32" or (mode in ("full", "int8") and avx2_ready)))
    if mode != "full":  # quantized weights on a CPU: the head's logits on int8 too
        quantize_head(model, ours=records == "bfloat16", avx2=avx2)
    model.eval()
    if records is not None:  # layers on pardec's kernels (int4 ones not read as codes, int8, dense)
        use_records(model, records)
        if mode == "full":
            head_on_records(model)
    if mode == "full" and device == "cpu" and dtype == "bfloat16" and cpu_info().has_fast_bf16:
        pack_linears(model)  # dense layers pardec's kernel did not take: on oneDNN's packing
    if avx2:
        use_avx2(model)
    if mode in ("int4", "int8") or records is not None or avx2:  # on a CPU, q/k/v and gate/up: one call each when compiled
        share_products(model, lambda: model(input_ids=torch.zeros(1, 2, dtype=torch.long), use_cache=False))
    if device == "cpu":  # every step streams the weights: on 2 MB pages where the kernel offers them
        table = lookup_only_embedding(model)  # rows looked up: moving it would cost its first touch for nothing
        move_to_huge_pages(model, skip=[] if table is None else [table])
    return model, tokenizer


def _float32_but_records(model: Any) -> None:
    """Make every floating parameter and buffer of `model` float32 in place (tied weights stay
    one tensor), except `quant.Q8Records`' float16 scales: a q8q8 model read in 16 bits."""
    import torch

    from pardec_cli.quant import Q8Records

    model.config.dtype = torch.float32  # as a float32 load leaves it
    for module in model.modules():
        if isinstance(module, Q8Records):
            continue
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if tensor.is_floating_point() and tensor.dtype != torch.float32:
                if isinstance(tensor, torch.nn.Parameter):
                    tensor.data = tensor.data.float()
                else:
                    setattr(module, name, tensor.float())


def bf16_kernel_weights(mode: str) -> bool:
    """Whether layers held as `mode` ("full", "int8", "int4") go to pardec's bfloat16
    kernels, where the CPU runs them and they are built (`_own_kernels`): int4 and int8
    ones, and dense ones only without AMX (its tiles keep oneDNN's packing; pardec's kernel
    measured faster only without them, docs/weights.md)."""
    from pardec_cli.hardware import cpu_info

    return mode in ("int4", "int8") or (mode == "full" and not cpu_info().has_amx_bf16)


def _own_kernels(*, device: str, dtype: str, q4q8: bool, notice: Callable[[str], None] | None) -> str | None:
    """The activations layers multiply on pardec's own kernels (`pardec_cli.kernels`;
    `quant.use_records`) in this load, loading the kernels; None for torch's kernels.

    bfloat16 (int4, int8 or dense layers in bfloat16): where this CPU runs the kernel and it is built in
    the store; a first load starts its build in the background and keeps torch's kernel
    meanwhile. ``--weights q4q8`` (asked for, or auto's): in float32 "float32" on the AVX2
    library wherever it runs (the native step takes those layers), else "int8" on the
    AVX512 library where the CPU has AVX512-VNNI, else "float32"; the kernel is built now
    if need be, and a device or CPU without either is an error.
    """
    from pardec_cli import kernels
    from pardec_cli.errors import PardecUsageError
    from pardec_cli.hardware import cpu_info
    from pardec_cli.home import kernels_dir

    activations = "int8" if q4q8 else "bfloat16"
    if q4q8 and device != "cpu":
        raise PardecUsageError(f"--weights q4q8 runs on a CPU, not on {device}", hint="use --weights int4 or full")
    flags = cpu_info().flags
    if not kernels.cpu_supported(flags, activations) or (q4q8 and dtype == "float32" and kernels.avx2_runs(flags)):
        if not q4q8:
            return None
        if not kernels.avx2_runs(flags):
            raise PardecUsageError("--weights q4q8 needs a CPU with AVX512-VNNI or AVX2 (and FMA, F16C)",
                                   hint="use --weights int4")  # fmt: skip
        _build_now(kernels.build_dir(kernels_dir(), kernels.avx2_library(flags)), notice)
        return "float32"
    if not q4q8 and not kernels.enabled():
        return None
    directory = kernels.build_dir(kernels_dir())
    if not q4q8 and not kernels.ready(directory):
        return None
    _build_now(directory, notice)
    return activations


def _avx2_now(*, device: str, notice: Callable[[str], None] | None, weights: str) -> None:
    """Load pardec's AVX2 library for `weights` ("q8q8": int8 activation groups on it),
    building it first where need be; a device or CPU that cannot run it is an error."""
    from pardec_cli import kernels
    from pardec_cli.errors import PardecUsageError
    from pardec_cli.hardware import cpu_info
    from pardec_cli.home import kernels_dir

    if device != "cpu":
        raise PardecUsageError(f"--weights {weights} runs on a CPU, not on {device}", hint="use --weights int8, int4 or full")
    flags = cpu_info().flags
    if not kernels.avx2_runs(flags):
        raise PardecUsageError(f"--weights {weights} needs a CPU with AVX2, FMA and F16C", hint="use --weights int8 or int4")
    _build_now(kernels.build_dir(kernels_dir(), kernels.avx2_library(flags)), notice)


def _build_now(directory: Path, notice: Callable[[str], None] | None) -> None:
    """Load the kernel library of `directory`, building it first where it is not built."""
    from pardec_cli import kernels

    if kernels.load(directory):
        return
    if notice is not None:
        notice("building pardec's int4 kernels for this CPU (once, about 20 s)")
    try:
        kernels.build(directory)
    except Exception as exc:
        raise ModelLoadError(f"cannot build pardec's int4 kernels: {first_line(exc)}",
                             hint=f"see {directory}; or use --weights int4") from None  # fmt: skip
    if not kernels.loaded(kernels.library_of(directory)):
        raise ModelLoadError(f"pardec's int4 kernels in {directory} do not load",
                             hint="remove that folder and try again, or use --weights int4")  # fmt: skip


def auto_native(stored_blocks: bool, weights: str) -> bool:
    """Whether `--weights` `weights` of a model stored so (`stored_blocks`: a GGUF's blocks
    kept, else dense) goes to the native step's AVX2 library wherever the CPU runs it: auto's
    q4q8 for 4-bit blocks, q8q8 for Q8_0 ones; auto's q8q8 for dense layers, except on a CPU with AMX, whose bfloat16
    tiles verify 16 tokens for little more than one (dense bfloat16 stays there, not
    measured against q8q8)."""
    from pardec_cli.hardware import cpu_info

    return weights == "auto" and (stored_blocks or not cpu_info().has_amx_bf16)


#: The `--weights` asked for that the native step runs, in float32, on any model.
NATIVE_WEIGHTS = ("q4q8", "q8q8")


def native_auto(path: Path | None, weights: str = "auto", *, start: bool = False, wait_s: float = 0.0,
                notice: Callable[[str], None] | None = None) -> bool:
    """Whether `--dtype auto` loads the model in `path` in float32 for the native step
    (`hardware.resolve_dtype`'s `blocks4`): `weights` is one the native step runs
    (`NATIVE_WEIGHTS`: wherever pardec's AVX2 library runs, the load builds it now if need
    be), or auto's choice for how the model is stored runs there (`auto_native`: a GGUF's
    4-bit blocks, or q8q8 of dense layers) and pardec's AVX2 kernels are built. With
    `start`, a store without them starts their build in the background for later loads
    (this one keeps its dtype); with `wait_s`, a build already running is waited for that
    long first (saying so to `notice`)."""
    from pardec_cli import kernels
    from pardec_cli.hardware import cpu_info
    from pardec_cli.store.quantized import is_quantized_dir

    if path is None:
        return False
    # q4q8 and q8q8 asked for: 3.8x faster on the native step in float32 than in bfloat16;
    # int4, int8 and full weights are eager steps, which float32 makes 3-16x slower than
    # bfloat16 where the CPU has it (a Zen 5 EPYC, docs/weights.md).
    if weights in NATIVE_WEIGHTS:
        return kernels.avx2_runs(cpu_info().flags)
    return auto_native(is_quantized_dir(path), weights) and _avx2_kernels(start=start, wait_s=wait_s, notice=notice)


def native_stand_in(path: Path, weights: str = "auto") -> bool:
    """Whether a load of the model in `path` that did not take the native step stands in
    for the loads after it: auto's choice for how it is stored would run there
    (`auto_native`) and pardec's AVX2 kernels run on this CPU but are not built yet
    (building, or not started). Nothing is started."""
    from pardec_cli import kernels
    from pardec_cli.store.quantized import is_quantized_dir

    if not auto_native(is_quantized_dir(path), weights):
        return False
    directory = _avx2_dir()
    return directory is not None and kernels.status(directory) in ("building", "not built")


#: How long a first run that started the AVX2 build before converting the embedded model
#: waits for it to finish (`Session.load`): the build took 30 s on one core of a 2-core AVX2
#: EPYC, the conversion beside it 27 s, and the step it would run instead was 10x slower.
NATIVE_BUILD_WAIT_S = 60.0


def start_native_build() -> bool:
    """Start the detached build of pardec's AVX2 library where this CPU runs the native step
    and it is neither built nor being built; True when one was started. A first run calls
    it before converting the embedded model, so that the two share the time."""
    from pardec_cli import kernels

    directory = _avx2_dir()
    return directory is not None and kernels.build_in_background(directory)


def native_build_pending() -> bool:
    """Whether pardec's AVX2 library for the native step is being built for this CPU: a
    build running, or one started now where it is not built (`start_native_build`)."""
    from pardec_cli import kernels

    directory = _avx2_dir()
    return directory is not None and (kernels.build_in_background(directory) or kernels.status(directory) == "building")


def _avx2_dir() -> Path | None:
    """The store's build directory of pardec's AVX2 library for this CPU, where it runs
    (`kernels.avx2_runs`: float32 layers go to it) and `PARDEC_KERNELS` allows it; else
    None."""
    from pardec_cli import kernels
    from pardec_cli.hardware import cpu_info
    from pardec_cli.home import kernels_dir

    flags = cpu_info().flags
    if not kernels.enabled() or not kernels.avx2_runs(flags):
        return None
    return kernels.build_dir(kernels_dir(), kernels.avx2_library(flags))


def _avx2_kernels(*, start: bool = True, wait_s: float = 0.0, notice: Callable[[str], None] | None = None) -> bool:
    """Whether float32 layers go to pardec's AVX2 kernels in this load (`kernels.AVX2`):
    where this CPU runs them (`kernels.avx2_runs`) and they are built in the store, loaded
    then; with `start`, a first load starts their build in the background and keeps torch's
    kernels meanwhile, after waiting up to `wait_s` for one that is running (without
    `start`, nothing is loaded or started: `pardec doctor` asks)."""
    from pardec_cli import kernels

    directory = _avx2_dir()
    if directory is None:
        return False
    if not start:
        return kernels.status(directory) == "built"
    if wait_s > 0 and not kernels.load(directory):  # the caller started the build (a failed one ends the wait)
        if notice is not None:
            notice("waiting for pardec's AVX2 kernels, built once for this CPU")
        kernels.wait_for_build(directory, wait_s)
    return kernels.ready(directory)


def _check_still_there(path: Path) -> None:
    """A load that failed because the model was removed meanwhile (`pardec rm` in another
    terminal) says so, instead of transformers' guess that the path is a Hub id."""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} was removed while it was loading", hint="pull or import the model again")


def check_loaded_weights(path: Path, info: dict[str, Any]) -> None:
    """Raise `ModelLoadError` when the weights did not fill the model exactly.

    transformers fills a tensor the checkpoint lacks with random values and drops one the
    model has no place for, with only a warning (hidden here): the model would then
    generate garbage with exit status 0. `info` is from_pretrained's loading info.
    """
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ())
    if not (missing or unexpected or mismatched):
        return
    parts = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("of the wrong shape", mismatched)):
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            parts.append(f"{len(names)} {label} ({', '.join(names[:3])}{more})")
    raise ModelLoadError(
        f"the weights in {path} do not match its config.json: tensors " + "; ".join(parts),
        hint="the model's files do not belong together: download or convert it again",
    )


def _load_quantized(path: Path, config: Any, dtype: str, device: str, mode: str, records: str | None, own_widths: bool) -> Any:
    """A model stored with its GGUF blocks kept, in SDPA attention where it has it."""
    from pardec_cli.store.quantized import load_quantized_dir

    options = {"dtype": torch_dtype(dtype), "device": device, "weights": mode, "records": records, "own_widths": own_widths}
    try:
        return load_quantized_dir(path, config, **options)
    except ValueError as exc:
        if "sdpa" not in str(exc).lower():
            raise
        return load_quantized_dir(path, config, **options, attn_implementation="eager")


def _from_pretrained(auto_class: Any, path: Path, kwargs: dict[str, Any]) -> Any:
    """from_pretrained with SDPA attention, or eager where the architecture lacks SDPA."""
    try:
        return auto_class.from_pretrained(str(path), attn_implementation="sdpa", **kwargs)
    except ValueError as exc:
        if "sdpa" not in str(exc).lower():
            raise
        return auto_class.from_pretrained(str(path), attn_implementation="eager", **kwargs)
