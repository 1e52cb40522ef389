"""A GGUF file's 4/8-bit blocks kept as they are in pardec's store, and loaded from there.

Layout of a model directory stored this way: the usual config.json, generation config
and tokenizer files, plus ``pardec-quant.safetensors`` and ``pardec-quant.json`` (not
``model.safetensors``: a pardec or transformers that does not know this layout finds no
weights and says so, rather than filling the missing tensors at random). For each
tensor that was Q4_0, Q4_1, Q4_K or Q8_0 in the GGUF file the safetensors file holds, under
the Hugging Face parameter name, in blocks of 32 along the input dimension:

- Q4 (Q4_0, Q4_1, Q4_K): ``<name>.q4_records`` uint8 [N/16, K/32, 320], the codes with
  their float16 scales and minimums already in the layout pardec's 4-bit kernels read
  (`quant.pack_records`; a load used to pack them, 0.3-0.5 s for the embedded model), where
  the kernels take the shape (N a multiple of 16, float16 scales that are no subnormals);
  otherwise ``<name>.q4_codes`` uint8 [N, K/2], two 4-bit codes a byte (column 2i in the low
  nibble, 2i+1 in the high), ``<name>.q4_scale`` and ``<name>.q4_min`` float16 [N, K/32].
  Either way w = q * scale + min (Q4_0's w = (q - 8) * d is min = -8 d, exact in float16;
  Q4_K's scales and mins are rounded to float16: `_q4_k_blocks`). Format 1 (before
  2026-11-29) stored codes only; it loads as before.
- Q8_0: ``<name>.q8_codes`` int8 [N, K], ``<name>.q8_scale`` float16 [N, K/32]; w = q * scale.

A tensor of another quantized type (Q5_0, Q5_K, Q6_K, Q2_K, ...: no kernel of pardec's
multiplies it) keeps the file's own blocks, ``<name>.gguf_blocks`` uint8 [N, bytes per
row], kind ``"gguf:TYPE"``, and is dequantized by gguf at load (exactly as a dense
conversion would have, into float32). Every other tensor (F32, F16, BF16) is stored dense
(float32) under its own name. ``pardec-quant.json`` lists the kept tensors:
``{"format": 2, "block": 32, "tensors": {name: "q4"|"q8"|"gguf:TYPE"}}``. The stored model
takes about the GGUF file's size instead of 4 bytes per parameter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pardec_cli.errors import ModelLoadError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from pardec_cli.progress import StageReport
    import torch
    from torch import nn

QUANT_FILE = "pardec-quant.json"
WEIGHTS_FILE = "pardec-quant.safetensors"
BLOCK = 32
RECORD_BLOCK = 16  # outputs per 4-bit record (`quant.RECORD_BLOCK`; quant imports torch)
#: The kind of a tensor kept in the file's own blocks: "gguf:" and ggml's type name.
GGUF_KIND = "gguf:"
# Architectures whose transformers tensor processor only permutes rows of a weight
# (llama's rotary un-permutation) or leaves it alone: their blocks can be kept as they are.
_ROW_SAFE_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor")


def is_quantized_dir(path: Path) -> bool:
    """Whether `path` holds a model stored with its GGUF blocks kept (`pardec-quant.json`)."""
    return (Path(path) / QUANT_FILE).is_file()


def stored_kind(path: Path) -> str | None:
    """How the model in `path` is stored, as `weight_modes.resolve_weights` weighs it: "q4"
    where 4-bit codes hold most of its kept weights, else "q8" where it keeps Q8_0 blocks,
    None for dense weights or only blocks dequantized at load (a layout that cannot be read:
    "q4", and loading says what is wrong with it).

    By weights, not by tensors: llama.cpp's Q4_K_M of a model whose width is no multiple of
    256 is mostly Q5_0 (its fallback) with Q4_K in a few ffn_down tensors, and running it
    all on 4 bits would requantize the Q5_0 majority; a 7B Q4_K_M is mostly Q4_K."""
    if not is_quantized_dir(path):
        return None
    try:
        counts = _kept_weights(Path(path))
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return "q4"
    if counts.get("q4", 0) * 2 > sum(counts.values()):
        return "q4"
    return "q8" if "q8" in counts else None


def _kept_weights(path: Path) -> dict[str, int]:
    """Weights kept per kind of block ("q4", "q8", "gguf:TYPE") in the model stored in `path`
    (from the safetensors header: nothing is read but the shapes)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from safetensors import safe_open

    layout = json.loads((path / QUANT_FILE).read_text("utf-8"))["tensors"]
    counts: dict[str, int] = {}
    with safe_open(str(path / WEIGHTS_FILE), framework="pt") as stored:
        for name, kind in layout.items():
            if kind.startswith(GGUF_KIND):
                rows, row_bytes = stored.get_slice(f"{name}.gguf_blocks").get_shape()
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind.removeprefix(GGUF_KIND)]]
                weights = rows * row_bytes // size * block
            elif f"{name}.q4_records" in stored.keys():
                blocks, groups, _ = stored.get_slice(f"{name}.q4_records").get_shape()
                weights = blocks * RECORD_BLOCK * groups * BLOCK
            else:
                rows, columns = stored.get_slice(f"{name}.{kind}_codes").get_shape()
                weights = rows * columns * (2 if kind == "q4" else 1)
            counts[kind] = counts.get(kind, 0) + weights
    return counts


# -------------------------------------------------------------------- GGUF blocks


def _gguf_blocks(tensor: Any) -> tuple[str, dict[str, np.ndarray]] | None:
    """What the store keeps of a quantized 2-D GGUF tensor (numpy): a Q4_0/Q4_1/Q4_K/Q8_0
    one split into codes and scales, another type's blocks as they are ("gguf:TYPE"); None
    for a dense (F32, F16, BF16) or other-shaped one, which is stored dense.

    ``tensor.data`` is uint8 [N, K/32 * bytes per block] (Q4_K: [N, K/256 * 144]). Q4_1
    block (20 bytes): d f16, m f16, 16 bytes whose low nibbles are elements 0..15 and high
    nibbles 16..31; Q4_0 (18 bytes) has no m (w = (q - 8) d); Q8_0 (34 bytes): d f16, 32 x
    int8; Q4_K: `_q4_k_blocks`.
    """
    import numpy as np
    from gguf import GGMLQuantizationType as T

    kind = tensor.tensor_type
    if kind in (T.F32, T.F16, T.BF16) or len(tensor.data.shape) != 2:
        return None
    if kind not in (T.Q4_0, T.Q4_1, T.Q4_K, T.Q8_0):  # no kernel of pardec's: dequantized at load
        return f"{GGUF_KIND}{kind.name}", {"gguf_blocks": tensor.data}
    n = tensor.data.shape[0]
    if kind == T.Q4_K:
        q, d, m = _q4_k_blocks(np.ascontiguousarray(tensor.data).reshape(n, -1, 144))
    else:
        size = {T.Q4_0: 18, T.Q4_1: 20, T.Q8_0: 34}[kind]
        blocks = np.ascontiguousarray(tensor.data).reshape(n, -1, size)  # [N, K/32, bytes]
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0]  # [N, K/32]
        if kind == T.Q8_0:
            codes = blocks[..., 2:].copy().view(np.int8).reshape(n, -1)  # [N, K]
            return "q8", {"q8_codes": codes, "q8_scale": d}
        if kind == T.Q4_1:
            m, qs = blocks[..., 2:4].copy().view(np.float16)[..., 0], blocks[..., 4:]
        else:
            m, qs = (d * np.float16(-8)).astype(np.float16), blocks[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)  # [N, K], 0..15
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)  # [N, K/2]
    return "q4", {"q4_codes": packed, "q4_scale": d, "q4_min": m}


def _q4_k_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K super-blocks uint8 [N, S, 144] -> codes [N, 256 S] (0..15), scale and min
    float16 [N, 8 S]: w = q * scale + min, per 32 inputs, as Q4_1 stores them.

    A super-block (ggml's ``block_q4_K``): d and dmin f16, 12 bytes of eight 6-bit scales
    and mins, 128 bytes of codes: chunk c (32 bytes) holds inputs 64c..64c+31 in its low
    nibbles and the next 32 in its high ones. ggml dequantizes sub-block j as
    d * sc_j * q - dmin * m_j: the codes are kept as they are, each sub-block's scale
    d * sc_j and min -dmin * m_j (computed in float32, as ggml does) rounded to float16,
    pardec's q4 layout (a relative change of at most 2^-11, against a 4-bit code's 1/15).
    """
    import numpy as np

    n = blocks.shape[0]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, S]
    dmin = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = blocks[..., 4:16]  # ggml's get_scale_min_k4: sub-blocks 0-3 in 6 bits, 4-7 split
    low, mid, high = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([low & 63, (high & 0x0F) | ((low >> 6) << 4)], axis=-1).astype(np.float32)  # [N, S, 8]
    mins = np.concatenate([mid & 63, (high >> 4) | ((mid >> 6) << 4)], axis=-1).astype(np.float32)
    scale = (d[..., None] * sc).astype(np.float16).reshape(n, -1)  # [N, 8 S]
    minimum = (-(dmin[..., None] * mins)).astype(np.float16).reshape(n, -1)
    qs = blocks[..., 16:].reshape(n, -1, 4, 32)  # [N, S, chunk, 32]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)  # [N, 256 S]
    return q, scale, minimum


def convert_gguf_quantized(gguf_path: Path, out_dir: Path, *, source_repo: str | None,
                           report: StageReport | None = None) -> bool:
    """Write `gguf_path` into `out_dir` with its quantized blocks kept; False when the file's
    architecture needs transformers' dense conversion instead (nothing is written then).

    Config and tokenizer come from transformers' GGUF reader (metadata only), the tensors
    from `gguf_import.read_gguf_tensors`; tensor names from transformers' GGUF -> Hugging
    Face name map; the rows of attention weights are
    un-permuted by transformers' own tensor processor, applied to codes and scales.
    `report` hears the stages: reading the file, converting tensors (counted), writing.
    """
    import numpy as np
    import torch
    from gguf import dequantize
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    from pardec_cli.store.gguf_import import read_gguf_tensors

    report = report or _no_report
    report(f"reading {gguf_path.name}", 0, None)
    architecture, gguf_tensors = read_gguf_tensors(gguf_path)
    processor_class = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    if processor_class.__name__ not in _ROW_SAFE_PROCESSORS:
        return False
    where = {"gguf_file": gguf_path.name}
    report("reading its config and tokenizer (transformers)", 0, None)
    config = AutoConfig.from_pretrained(str(gguf_path.parent), **where)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **where)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    processor = processor_class(config=config.to_dict())
    names = gguf_hf_names(skeleton, architecture, config.num_hidden_layers)
    wanted = set(skeleton.state_dict())

    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, str] = {}
    for done, tensor in enumerate(gguf_tensors, start=1):
        report("converting tensors", done - 1, len(gguf_tensors))
        hf_name = names.get(tensor.name)
        if hf_name is None or hf_name not in wanted:
            continue  # e.g. rope_freqs: computed by the model itself
        split = _gguf_blocks(tensor)
        if split is None:
            weights = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name).weights
            tensors[hf_name] = torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float32))
            continue
        kind, parts = split
        layout[hf_name] = kind
        # Row un-permutation of q/k weights: the same for codes and their scales.
        stored = {suffix: torch.from_numpy(np.ascontiguousarray(processor.process(weights=array, name=tensor.name).weights))
                  for suffix, array in parts.items()}  # fmt: skip
        if kind == "q4":
            stored = _as_records(stored)
        tensors.update({f"{hf_name}.{suffix}": t for suffix, t in stored.items()})
    report("writing the model", 0, None)
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / QUANT_FILE).write_text(json.dumps({"format": 2, "block": BLOCK, "tensors": layout}, indent=1))
    config._name_or_path = source_repo or gguf_path.stem
    config.dtype = "float32"
    config.save_pretrained(str(out_dir))
    GenerationConfig.from_model_config(config).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return True


def _as_records(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stored Q4 parts (codes, scale, min) as ``q4_records`` where pardec's 4-bit kernels
    take the shape (`quant.Int4Records.from_codes`), else as they are."""
    layer = _q4_records(parts, "float32")
    return parts if layer is None else {"q4_records": layer.blocks}


def q4_codes(parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K] 0..15, scale [N, K/32], minimum [N, K/32]) of a stored Q4 weight,
    from its records or its codes (the scales float16 or their exact float32)."""
    if "q4_records" in parts:
        from pardec_cli.quant import unpack_records

        blocks, groups, _ = parts["q4_records"].shape
        return unpack_records(parts["q4_records"], blocks * RECORD_BLOCK, groups * BLOCK)
    return unpack_q4(parts["q4_codes"]), parts["q4_scale"], parts["q4_min"]


def gguf_hf_names(skeleton: nn.Module, architecture: str, layers: int) -> dict[str, str]:
    """GGUF tensor name -> Hugging Face parameter name of `skeleton`, for a file of `architecture`.

    What transformers' ``get_gguf_hf_weights_map`` returns for the row-safe processors (they
    rename nothing and have no fallback): the module's own names first, then each child's
    under its prefix where the GGUF name is still free. It builds gguf's name table once;
    transformers builds it again for every module (397 times, 5 s, for SmolLM2-135M).
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ModelLoadError(f"gguf does not know the tensor names of architecture {architecture!r}",
                             hint="upgrade gguf (pip install -U gguf)")
    table = get_tensor_name_map(arch, layers)

    def walk(module: nn.Module, prefix: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for hf_name in module.state_dict():
            stem, dot, suffix = hf_name.rpartition(".")
            stem, suffix = (stem, dot + suffix) if suffix in ("weight", "bias") else (hf_name, "")
            gguf_name = table.get_name(stem)
            if gguf_name is not None:
                found[gguf_name + suffix] = prefix + hf_name
        for child_name, child in module.named_children():
            for key, value in walk(child, f"{prefix}{child_name}.").items():
                found.setdefault(key, value)
        return found

    return walk(skeleton, "")


def _no_report(stage: str, done: int, total: int | None) -> None:
    pass


# ---------------------------------------------------------------------- loading


def unpack_q4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] two codes a byte -> uint8 [N, K] (column 2i from the low nibble)."""
    import torch

    n, half = packed.shape
    codes = torch.empty(n, 2 * half, dtype=torch.uint8, device=packed.device)
    torch.bitwise_and(packed, 0x0F, out=codes[:, 0::2])
    torch.bitwise_right_shift(packed, 4, out=codes[:, 1::2])
    return codes


def _repeat_blocks(x: torch.Tensor) -> torch.Tensor:
    """[N, K/32] -> [N, K] float32: one value per block spread over its 32 columns."""
    return x.float().repeat_interleave(BLOCK, dim=1)


def dequantize_stored(kind: str, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """The exact float32 weight [N, K] of stored blocks (as GGUF's own dequantization:
    float16 scale and min widened to float32, then q * d + m in float32; other types by
    gguf's own dequantization)."""
    if kind.startswith(GGUF_KIND):
        import torch
        from gguf import GGMLQuantizationType, dequantize

        try:
            kind_type = GGMLQuantizationType[kind.removeprefix(GGUF_KIND)]
        except KeyError:
            raise ModelLoadError(f"this gguf cannot read {kind.removeprefix(GGUF_KIND)} blocks",
                                 hint="upgrade gguf (pip install -U gguf)") from None
        return torch.from_numpy(dequantize(parts["gguf_blocks"].numpy(), kind_type))
    if kind == "q8":
        return parts["q8_codes"].float() * _repeat_blocks(parts["q8_scale"])
    codes, scale, minimum = q4_codes(parts)
    return codes.float() * _repeat_blocks(scale) + _repeat_blocks(minimum)


def _q4_records(parts: dict[str, torch.Tensor], activations: str) -> nn.Module | None:
    """A stored Q4 weight as `quant.Int4Records` multiplying `activations`: its stored
    records as they are, or packed from its codes; None where the kernels cannot take it."""
    from pardec_cli.quant import Int4Records

    if "q4_records" not in parts:
        return Int4Records.from_codes(*q4_codes(parts), activations=activations)
    blocks, groups, _ = parts["q4_records"].shape
    return Int4Records(parts["q4_records"], in_features=groups * BLOCK, out_features=blocks * RECORD_BLOCK, bias=None,
                       activations=activations)  # fmt: skip


def _own_width(kind: str, parts: dict[str, torch.Tensor]) -> nn.Module | None:
    """A kept layer on pardec's AVX2 library in its own width: 4-bit codes as q4q8 records,
    Q8_0 blocks as they are, any other type in Q8_0 groups; None where the kernels cannot
    take its shape."""
    from pardec_cli.quant import Q8Records

    if kind == "q4":
        return _q4_records(parts, "float32")
    if kind == "q8":
        return Q8Records.from_codes(parts["q8_codes"], parts["q8_scale"])
    return Q8Records.from_weight(dequantize_stored(kind, parts))


def load_quantized_dir(path: Path, config: Any, *, dtype: torch.dtype, device: str, weights: str,
                       records: str | None = None, own_widths: bool = False,
                       attn_implementation: str = "sdpa") -> nn.Module:  # fmt: skip
    """Build the model of a directory stored by `convert_gguf_quantized`.

    `weights` is "full" (every block dequantized exactly, then cast to `dtype`), "int8"
    (requantized per channel by `quantize_linears`), "int4" (Q4 codes packed straight
    into `Int4Linear`, without a round trip through float weights; with `records` set,
    into `Int4Records` multiplying those activations, with the GGUF's float16 scales and
    minimums exactly, where its kernels take the layer) or "q8q8" (Q8_0 codes and scales
    straight into `Q8Records`; other blocks dequantized, then in Q8_0 groups).

    `own_widths` (float32 on pardec's AVX2 library, "int4" with float32 `records` or
    "q8q8"): every decoder layer kept in blocks multiplies in its own width, whatever
    `weights` says of the rest: 4-bit codes as q4q8 `Int4Records`, Q8_0 blocks as
    `Q8Records`, and other types (Q5_0, Q6_K, ...) dequantized into Q8_0 groups rather than
    down to 4 bits. `quant.share_products` then gives layers of one input one kind.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pardec_cli.quant import Int4Linear, Q8Records, decoder_linears, int4_fits, quantize_linears

    try:
        layout = json.loads((Path(path) / QUANT_FILE).read_text("utf-8"))["tensors"]
        stored = load_file(str(Path(path) / WEIGHTS_FILE))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read the quantized model in {path}: {exc}",
                             hint="import the GGUF file again") from None  # fmt: skip
    from accelerate import init_empty_weights

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights

    # Parameters on the meta device, not initialized (they are all assigned below; on meta
    # tensors transformers' init still costs 0.4 s of Python for SmolLM2-135M); buffers
    # such as rotary frequencies are built for real.
    with init_empty_weights(include_buffers=False), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    state: dict[str, torch.Tensor] = {}
    prepared: dict[str, nn.Module] = {}
    linears = {name for name, _ in decoder_linears(model)}  # not the embedding, nor the head
    device_type = torch.device(device).type
    # The stored tensors by the weight they belong to: "a.b.weight.q4_codes" -> "a.b.weight".
    by_weight: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in stored.items():
        owner, _, part = key.rpartition(".")
        by_weight.setdefault(owner, {})[part] = t
    for name, kind in layout.items():
        parts = by_weight.get(name, {})
        module_name = name.removesuffix(".weight")
        if own_widths and module_name in linears:
            layer = _own_width(kind, parts)
            if layer is not None:
                prepared[module_name] = layer
                continue
        if weights == "int4" and kind == "q4" and module_name != "lm_head":
            layer = None if records is None or device_type != "cpu" else _q4_records(parts, records)
            if layer is None:
                codes, scale, minimum = q4_codes(parts)
                if int4_fits(codes.shape[0], codes.shape[1], BLOCK, device_type):
                    layer = Int4Linear.from_codes(codes.to(device), scale.to(device), minimum.to(device),
                                                  group_size=BLOCK, dtype=dtype)  # fmt: skip
            if layer is not None:
                prepared[module_name] = layer
                continue
            # else dequantized below: `quantize_linears` keeps it dense (as any layer the kernel cannot take)
        if weights == "q8q8" and kind == "q8" and module_name in linears:
            q8 = Q8Records.from_codes(parts["q8_codes"], parts["q8_scale"])
            if q8 is not None:
                prepared[module_name] = q8
                continue
        # On the device already: `quantize_linears` then quantizes (or keeps) each layer by
        # the rules of the device's kernels, not the CPU's
        state[name] = dequantize_stored(kind, parts).to(device=device, dtype=dtype)
    for name, tensor in stored.items():
        if name.rsplit(".", 1)[0] not in layout:
            state[name] = tensor.to(device=device, dtype=dtype)
    # Parameters not in `state` (prepared linears, a tied head) stay on the meta device
    # until tie_weights and quantize_linears fill them.
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    quantize_linears(model, weights if weights in ("int8", "int4", "q8q8") else "full", prepared=prepared)
    leftover = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if leftover:
        raise ModelLoadError(f"the quantized model in {path} lacks {leftover[0]}", hint="import the GGUF file again")
    return model.to(device)
