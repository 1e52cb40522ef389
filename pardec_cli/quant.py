"""Weight-only quantized Linear layers on PyTorch's own packed int8/int4 matmuls.

A decoding step on a small batch reads every weight once, so its time is bounded by
the bytes of weights it reads: int8 halves a bf16 model's bytes, int4 quarters them.
Activations stay in the model's dtype (float32, bfloat16, float16); only the weights
are stored as integers and dequantized inside the matmul kernel.

- `Int8Linear`: per-output-channel symmetric int8, ``w[n, k] = q[n, k] * scale[n]``,
  through ``torch.ops.aten._weight_int8pack_mm`` on CPU, `dequant_int8_mm` on CUDA.
- `Int4Linear`: group-wise asymmetric 4-bit (groups of `group_size` along the input
  dimension), ``w[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n]`` with g = k //
  group_size, through ``_weight_int4pack_mm_for_cpu`` on CPU and ``_weight_int4pack_mm``
  on CUDA (which packs differently and wants bfloat16 activations).
- `Int4Records`: the same codes in pardec's own layout, multiplied by pardec's CPU
  kernels (`pardec_cli.kernels`): bfloat16 activations, or int8 ones for ``--weights
  q4q8``.
- `Int8Records`: `Int8Linear`'s codes and scales in pardec's layout, on pardec's CPU
  kernel for bfloat16 activations.
- `BF16Records`: a dense bfloat16 layer in the same layout, on pardec's CPU kernel;
  `BF16Head` the output head on it, over a copy beside the dense weight.
- `F32Linear` and `Int8F32`: a float32 layer or head, and `Int8Linear` in float32, on
  pardec's AVX2 kernels over their own weights (`use_avx2`).
- `Q8Records`: int8 codes in groups of 32 with a scale each (llama.cpp's Q8_0), by int8
  activation groups on pardec's AVX2 library (``--weights q8q8``).

Both are plain `nn.Module`s whose forward calls one aten op, so they run eagerly and
trace under ``torch.compile`` without graph breaks. `quantize_linears` swaps them into
a loaded model's decoder layers.

The output head is different (`Int8Head`, `quantize_head`): its weight stays dense for
its readers (Medusa, EAGLE, layer-skip and head training read
``get_output_embeddings().weight``, and SmolLM2-style models tie it to the embedding),
and only the model's own logits go through an int8 copy, with the activations quantized
too, so that the product is integer and every row's logits are the same whatever the
number of rows (a decode step and a verification compute one function). With pardec's
kernels loaded and bfloat16 activations it is `Int8RecordsHead` instead: the same smoothed
int8 codes in one pass of bfloat16 activations, also exact per row, and faster.

This module depends on torch only.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

DEFAULT_GROUP_SIZE = 32  # GGUF's Q4_0/Q4_1/Q8_0 block size, so imported codes pack as they are
#: From this many rows (a long prompt's prefill) a quantized layer on CPU unpacks its
#: weight and runs one dense GEMM instead of the packed kernel, which is slow at many rows
#: (int4, 1536 x 576, 2 cores: break-even ~150 rows; 300 rows 3.3 ms against 2.6 ms).
#: Decoding and verifying steps (at most 64 rows) always run the packed kernels.
DENSE_FROM_ROWS = 256


class Int8Linear(nn.Module):
    """y = x @ (q * scale[:, None]).T + bias, with q int8 [out, in] and scale [out]."""

    def __init__(self, weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8.contiguous())  # [N, K] int8
        self.register_buffer("scales", scales.contiguous())  # [N], the activation dtype
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        """Quantize a dense [out, in] weight (symmetric, one scale per output row)."""
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [N]
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scales.to(weight.dtype), None if bias is None else bias.detach())

    def dequantize(self) -> torch.Tensor:
        """The dense weight this layer multiplies by, [out, in] float32."""
        return self.weight_int8.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [..., K] -> [M, K]; the op wants 2-D activations and scales in x's dtype.
        x2d = x.reshape(-1, self.in_features)
        if x2d.device.type == "cuda":
            y = dequant_int8_mm(x2d, self.weight_int8, self.scales)
        elif x2d.shape[0] >= DENSE_FROM_ROWS:
            y = nn.functional.linear(x2d, self.weight_int8.to(self.scales.dtype) * self.scales[:, None])
        else:
            y = torch.ops.aten._weight_int8pack_mm(x2d, self.weight_int8, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def dequant_int8_mm(x2d: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x2d [M, K] @ q.T [K, N] * scales [N] with the int8 codes converted to x's dtype in
    torch ops (exact: |q| <= 127 fits bfloat16's mantissa): `Int8Linear` on CUDA. Compiled
    with coordinate descent tuning (`engine.runner.CUDA_OPTIONS`), a one-row product becomes
    one reduction reading the int8 codes (gpt-fast's form); CUDA's ``_weight_int8pack_mm``
    was 6.5x slower for one row (docs/runner.md, "On a GPU")."""
    return nn.functional.linear(x2d, q.to(x2d.dtype)) * scales


def int4_codes_from_weight(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes of a dense [N, K] weight: (q [N, K] uint8 in 0..15,
    scale [N, K/g], minimum [N, K/g]) with w ~= q * scale + minimum (GGUF Q4_1's form)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)  # [N, K/g]
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((w - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return q.reshape(n, k), scale, lo


class Int4Linear(nn.Module):
    """y = x @ W.T + bias with W stored as packed 4-bit codes plus per-group scale/zero.

    `packed` is the device-specific layout made by `pack_int4`; `scales_and_zeros` is
    [K/group_size, N, 2] in bfloat16 on CUDA, the activation dtype on CPU.
    """

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, *, in_features: int,
                 out_features: int, group_size: int, bias: torch.Tensor | None) -> None:  # fmt: skip
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        #: This layer's output columns in a product shared with layers of the same input
        #: (`share_products`); None when it multiplies alone.
        self.shared_columns: tuple[int, int] | None = None

    @classmethod
    def from_codes(cls, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, *, group_size: int,
                   dtype: torch.dtype, bias: torch.Tensor | None = None) -> Int4Linear:  # fmt: skip
        """Build from codes q [N, K] (0..15) with w = q * scale + minimum per group.

        torch's kernels compute w = (q - 8) * scale + zero, so zero = minimum + 8 * scale.
        """
        n, k = q.shape
        zero = minimum.float() + 8.0 * scale.float()
        device = q.device
        if device.type == "cuda":
            dtype = torch.bfloat16  # the CUDA kernel takes bfloat16 only
        # [N, K/g] x2 -> [K/g, N, 2]
        sz = torch.stack([scale.float(), zero], dim=-1).transpose(0, 1).contiguous().to(dtype)
        return cls(pack_int4(q), sz, in_features=k, out_features=n, group_size=group_size,
                   bias=None if bias is None else bias.detach())  # fmt: skip

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                    group_size: int = DEFAULT_GROUP_SIZE) -> Int4Linear:  # fmt: skip
        """Quantize a dense [out, in] weight group-wise (min/max per group of inputs)."""
        q, scale, lo = int4_codes_from_weight(weight, group_size)
        return cls.from_codes(q, scale, lo, group_size=group_size, dtype=weight.dtype, bias=bias)

    def dequantize(self) -> torch.Tensor:
        """The dense weight this layer multiplies by, [out, in] float32 (exactly the kernel's)."""
        eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype, device=self.packed.device)
        # x = I gives rows of W.T: [K, N] -> [N, K]
        return self._matmul(eye).float().t().contiguous()

    def _matmul(self, x2d: torch.Tensor) -> torch.Tensor:
        if self.packed.device.type == "cuda":  # the kernel takes bfloat16 activations only
            y = torch.ops.aten._weight_int4pack_mm(x2d.to(self.scales_and_zeros.dtype), self.packed, self.group_size,
                                                   self.scales_and_zeros)  # fmt: skip
            return y.to(x2d.dtype)
        if self.shared_columns is not None and torch.compiler.is_compiling():
            # The group's whole product, sliced: every member of the group makes this same
            # call, which the compiled step merges into one (`merge_shared_products`).
            lo, hi = self.shared_columns
            whole = torch.ops.aten._weight_int4pack_mm_for_cpu(x2d, self.shared_packed, self.group_size, self.shared_scales)
            return whole[:, lo:hi]
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x2d, self.packed, self.group_size, self.scales_and_zeros)

    def unpacked(self) -> torch.Tensor | None:
        """W [out, in] in the activations' dtype, unpacked from the CPU kernel's layout in a
        few tensor ops (about 1 ms for 1536 x 576); None on CUDA or an unknown layout."""
        block = cpu_pack_block() if self.packed.device.type == "cpu" else None
        if block is None or self.out_features % block:
            return None
        n, k, g = self.out_features, self.in_features, self.group_size
        return _unpack_cpu(self.packed, self.scales_and_zeros, n, k, g, block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        # Many rows (a long prompt's prefill): unpacking and one dense GEMM is faster.
        weight = self.unpacked() if x2d.shape[0] >= DENSE_FROM_ROWS else None
        y = self._matmul(x2d) if weight is None else nn.functional.linear(x2d, weight)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4 group_size={self.group_size}")  # fmt: skip


#: `Int4Records`' weight records: 16 outputs by one group of 32 inputs each, 256 bytes of
#: codes then 16 float16 scales and 16 float16 minimums (pardec_cli/data/int4_kernels.cpp).
RECORD_BLOCK, RECORD_GROUP, RECORD_BYTES = 16, 32, 320
#: Rows pardec's kernels compute per pass over a block's weights: 8 in the AVX512
#: library; in the AVX2 one (``activations="float32"``) what its build says (8 with
#: AVX512-VNNI, else 4: its int8 products by 4-bit codes measured 1.52x one row at 4 rows,
#: 2.0x at 5, on a 2-core AVX2 EPYC), 4 where it cannot say.
RECORD_ROW_TILE = 8
AVX2_RECORD_ROW_TILE = 4
_ACTIVATIONS = ("bfloat16", "int8", "float32")


class Int4Records(nn.Module):
    """y = x @ W.T + bias with W as 4-bit codes, w = q * scale + minimum in groups of 32
    inputs, multiplied by pardec's own CPU kernels (`pardec_cli.kernels`):

    - ``activations="bfloat16"``: ``pardec_q4::q4bf16_mm`` (AVX512-BF16), the arithmetic
      of `Int4Linear`'s kernel (bfloat16 activations, float32 sums), faster;
    - ``activations="int8"``: ``pardec_q4::q4q8_mm`` (AVX512-VNNI), activations in int8
      groups of 32, llama.cpp's Q4_1 x Q8_1 (``--weights q4q8``);
    - ``activations="float32"``: ``pardec_avx2::q4q8_mm``, the same arithmetic on the AVX2
      library (``--weights q4q8`` on a CPU without AVX512; "float32" names that library,
      as in `own_kernel_activations`: any float activations, quantized in the kernel).

    Either way a row's output does not depend on the other rows of the call. `blocks` is
    uint8 [N/16, K/32, 320] (`pack_records`). A prefill of `DENSE_FROM_ROWS` rows or more
    multiplies the dequantized weight instead, in the activations' dtype (on the AVX512
    library; the AVX2 one multiplies any number of rows).
    """

    def __init__(self, blocks: torch.Tensor, *, in_features: int, out_features: int, bias: torch.Tensor | None,
                 activations: str) -> None:  # fmt: skip
        super().__init__()
        if activations not in _ACTIVATIONS:
            raise ValueError(f"unknown activations {activations!r}")
        self.in_features, self.out_features, self.activations = in_features, out_features, activations
        self.register_buffer("blocks", blocks)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        #: This layer's output columns in a product shared with layers of the same input
        #: (`share_products`); None when it multiplies alone.
        self.shared_columns: tuple[int, int] | None = None

    @classmethod
    def from_codes(cls, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, *, activations: str,
                   bias: torch.Tensor | None = None) -> Int4Records | None:  # fmt: skip
        """From codes q [N, K] (0..15) with w = q * scale + minimum per group of 32 (GGUF
        Q4_1's form; its float16 scales and minimums are kept exactly); None where the
        kernels cannot take the shape or float16 cannot hold the scales."""
        n, k = q.shape
        if q.device.type != "cpu" or n % RECORD_BLOCK or k % RECORD_GROUP:
            return None
        if not (_fits_f16(scale.float()) and _fits_f16(minimum.float())):
            return None
        return cls(pack_records(q, scale, minimum), in_features=k, out_features=n, bias=bias, activations=activations)

    @classmethod
    def from_int4(cls, layer: Int4Linear, activations: str) -> Int4Records | None:
        """The same codes from a CPU `Int4Linear`, with its scales and minimums in float16;
        None where the kernels cannot take it (CUDA packing, groups other than 32, outputs
        not whole blocks of 16, or of `cpu_pack_block` to unpack) or float16 cannot hold
        its scales (beyond 65504, or small enough to lose precision as subnormals)."""
        block = cpu_pack_block()
        n, k = layer.out_features, layer.in_features
        if (layer.packed.device.type != "cpu" or block is None or n % RECORD_BLOCK or layer.group_size != RECORD_GROUP
                or layer.shared_columns is not None):  # fmt: skip
            return None
        # Outputs short of a whole packing block (k/v of a small model with AVX512's 64) are
        # laid out otherwise: read back through the kernel itself.
        q = _cpu_codes(layer.packed, n, k, block) if n % block == 0 else _codes_by_kernel(layer)
        sz = layer.scales_and_zeros.float().transpose(0, 1)  # [N, K/g, 2]
        bias = None if layer.bias is None else layer.bias.detach()
        return cls.from_codes(q, sz[..., 0], sz[..., 1] - 8.0 * sz[..., 0], activations=activations, bias=bias)

    def codes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [N, K] uint8, scale [N, K/32], minimum [N, K/32]) float32 (`unpack_records`)."""
        return unpack_records(self.blocks, self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """The dense weight W [out, in] float32 (w = q * scale + minimum)."""
        q, scale, minimum = self.codes()
        n, k = q.shape
        w = q.float().view(n, k // RECORD_GROUP, RECORD_GROUP) * scale[..., None] + minimum[..., None]
        return w.view(n, k)

    def _product(self, x2d: torch.Tensor, blocks: torch.Tensor, n: int) -> torch.Tensor:
        if self.activations == "int8":
            return torch.ops.pardec_q4.q4q8_mm(x2d, blocks, n)
        if self.activations == "float32":
            return torch.ops.pardec_avx2.q4q8_mm(x2d, blocks, n)
        return torch.ops.pardec_q4.q4bf16_mm(x2d, blocks, n)

    def _matmul(self, x2d: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if self.shared_columns is not None and torch.compiler.is_compiling():
            # The group's whole product, sliced; the compiled step merges the members'
            # identical calls into one (`merge_shared_products`).
            lo, hi = self.shared_columns
            return self._product(x2d, self.shared_blocks, self.shared_blocks.shape[0] * RECORD_BLOCK)[:, lo:hi]
        return self._product(x2d, self.blocks, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        # A long prompt's prefill, or activations the bfloat16 kernel does not take (a
        # model cast after loading): one dense GEMM on the same weight. Not on the AVX2
        # library: its products beat dequantizing plus MKL's float32 GEMM at every prompt
        # length measured (a SmolLM2-135M layer: 2.8x at 256 rows, 1.8x at 660 and 1500).
        long = x2d.shape[0] >= DENSE_FROM_ROWS and self.activations != "float32"
        if long or (self.activations == "bfloat16" and x2d.dtype != torch.bfloat16):
            y = nn.functional.linear(x2d, self.dequantize().to(x.dtype))
        else:
            y = self._matmul(x2d).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int4 group_size=32, "
                f"{self.activations} activations")  # fmt: skip


class _PairRecords(nn.Module):
    """A linear layer whose weight is pardec's pair layout, [N/16, K/2, 16, 2] (`pack_pairs`),
    multiplied by one of pardec's CPU kernels for bfloat16 activations, each row computed
    alone (a row's output does not depend on the rows beside it). A prefill of
    `DENSE_FROM_ROWS` rows or more, or other activations, multiplies the dense weight."""

    def __init__(self, blocks: torch.Tensor, *, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("blocks", blocks)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        #: As `Int4Records.shared_columns` (`share_products`).
        self.shared_columns: tuple[int, int] | None = None

    @staticmethod
    def takes(weight: torch.Tensor) -> bool:
        """Whether the kernels take a [N, K] CPU weight: outputs in blocks of 16, inputs in 4s."""
        n, k = weight.shape
        return weight.device.type == "cpu" and n % RECORD_BLOCK == 0 and k % 4 == 0

    def weight_rows(self) -> torch.Tensor:
        """The weight as stored, [N, K] (int8 codes or bfloat16)."""
        return self.blocks.permute(0, 2, 1, 3).reshape(self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """The dense weight [out, in]."""
        raise NotImplementedError

    def _product(self, x2d: torch.Tensor, shared: bool) -> torch.Tensor:
        """x2d [M, K] times this layer's weight (`shared`: its group's whole weight)."""
        raise NotImplementedError

    def _matmul(self, x2d: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if self.shared_columns is not None and torch.compiler.is_compiling():
            lo, hi = self.shared_columns  # the group's product, sliced (as `Int4Records`)
            return self._product(x2d, shared=True)[:, lo:hi]
        return self._product(x2d, shared=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        if x2d.shape[0] >= DENSE_FROM_ROWS or x2d.dtype != torch.bfloat16:
            y = nn.functional.linear(x2d, self.dequantize().to(x.dtype))
        else:
            y = self._matmul(x2d)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


class Int8Records(_PairRecords):
    """`Int8Linear` on pardec's CPU kernel ``pardec_q4::q8bf16_mm`` (AVX512-BF16): the
    same codes q [N, K] and scales (as float32), y = (x @ q.T) * scale + bias with
    bfloat16 activations and float32 sums (`_PairRecords`)."""

    def __init__(self, blocks: torch.Tensor, scales: torch.Tensor, *, in_features: int, out_features: int,
                 bias: torch.Tensor | None) -> None:  # fmt: skip
        super().__init__(blocks, in_features=in_features, out_features=out_features, bias=bias)
        self.register_buffer("scales", scales)  # [N] float32

    @classmethod
    def from_int8(cls, layer: Int8Linear) -> Int8Records | None:
        """The same codes and scales from a CPU `Int8Linear`; None where the kernel cannot take it."""
        if not cls.takes(layer.weight_int8):
            return None
        bias = None if layer.bias is None else layer.bias.detach()
        return cls(pack_pairs(layer.weight_int8), layer.scales.float().contiguous(), in_features=layer.in_features,
                   out_features=layer.out_features, bias=bias)  # fmt: skip

    def codes(self) -> torch.Tensor:
        """q [N, K] int8."""
        return self.weight_rows()

    def dequantize(self) -> torch.Tensor:
        """The dense weight [out, in] float32."""
        return self.codes().float() * self.scales[:, None]

    def _product(self, x2d: torch.Tensor, shared: bool) -> torch.Tensor:
        if shared:
            return torch.ops.pardec_q4.q8bf16_mm(x2d, self.shared_blocks, self.shared_scales, self.shared_blocks.shape[0] * RECORD_BLOCK)
        return torch.ops.pardec_q4.q8bf16_mm(x2d, self.blocks, self.scales, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel, pardec's kernel"


class BF16Records(_PairRecords):
    """A dense bfloat16 linear layer on pardec's CPU kernel ``pardec_q4::bf16_mm``
    (AVX512-BF16): y = x @ W.T + bias, float32 sums (`_PairRecords`); `blocks` is the only
    copy of the weight."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> BF16Records | None:
        """The layer's bfloat16 CPU weight in records; None where the kernel cannot take it."""
        weight = linear.weight.detach()
        if weight.dtype != torch.bfloat16 or not cls.takes(weight):
            return None
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(pack_pairs(weight), in_features=linear.in_features, out_features=linear.out_features, bias=bias)

    def dequantize(self) -> torch.Tensor:
        """The dense weight [out, in], bfloat16."""
        return self.weight_rows()

    def _product(self, x2d: torch.Tensor, shared: bool) -> torch.Tensor:
        blocks = self.shared_blocks if shared else self.blocks
        return torch.ops.pardec_q4.bf16_mm(x2d, blocks, blocks.shape[0] * RECORD_BLOCK)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16, pardec's kernel"


class RecordsHead(nn.Module):
    """An output head on one of pardec's CPU kernels over a copy of its weight in pardec's
    layout, each row's logits computed alone. `weight` and `bias` stay the dense tensors
    (shared, not copied) for readers of ``get_output_embeddings()`` and for prefills of
    `DENSE_FROM_ROWS` rows or more, or other activations."""

    #: The activations the kernel takes.
    activations = torch.bfloat16

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.weight = dense.weight  # [V, K], the tied embedding for SmolLM2-style models
        self.bias = dense.bias

    def _product(self, x2d: torch.Tensor) -> torch.Tensor:
        """x2d [M, K] in `activations` -> logits [M, V] on the kernel."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        if x2d.shape[0] >= DENSE_FROM_ROWS or x2d.dtype != self.activations:
            y = nn.functional.linear(x2d, self.weight.to(x.dtype))
        else:
            y = self._product(x2d)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


class BF16Head(RecordsHead):
    """A dense bfloat16 output head on ``pardec_q4::bf16_mm`` (`RecordsHead`): the step's
    largest product read at the kernel's rate rather than aten ``mm``'s. The records copy
    costs the weight's bytes once more in memory (a tied head's embedding keeps its own)."""

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__(dense)
        self.register_buffer("blocks", pack_pairs(dense.weight.detach()), persistent=False)  # [V/16, K/2, 16, 2]

    @staticmethod
    def fits(head: nn.Module) -> bool:
        """Whether `head` is a bfloat16 nn.Linear the kernel takes (`_PairRecords.takes`)."""
        return isinstance(head, nn.Linear) and head.weight.dtype == torch.bfloat16 and _PairRecords.takes(head.weight)

    def _product(self, x2d: torch.Tensor) -> torch.Tensor:
        return torch.ops.pardec_q4.bf16_mm(x2d, self.blocks, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16, pardec's kernel"


def head_on_records(model: nn.Module) -> bool:
    """Route the model's logits through `BF16Head`, in place (the caller has loaded
    `pardec_cli.kernels`); False (nothing changed) where the head does not fit."""
    head = _output_head(model)
    if head is None or not BF16Head.fits(head):
        return False
    model.set_output_embeddings(BF16Head(head))
    return True


def pack_pairs(q: torch.Tensor) -> torch.Tensor:
    """`Int8Records`' and `BF16Records`' layout [N/16, K/2, 16, 2] from a weight q [N, K]
    (int8 codes or bfloat16): per block of 16 outputs and pair of inputs, the 16 outputs'
    two weights side by side."""
    n, k = q.shape
    return q.reshape(n // RECORD_BLOCK, RECORD_BLOCK, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def _fits_f16(t: torch.Tensor) -> bool:
    magnitude = t.abs()
    tiny = torch.finfo(torch.float16).tiny
    return bool((magnitude < 65504).all() and ((magnitude == 0) | (magnitude >= tiny)).all())


def pack_records(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """`Int4Records`' records uint8 [N/16, K/32, 320] from codes q [N, K] (0..15) and
    scale, minimum [N, K/32]: byte 64p + 4i + b of a record's codes holds output i's code
    8p + b in its low nibble and 8p + 4 + b in its high one (one VNNI dot product takes 4
    consecutive codes of 16 outputs)."""
    n, k = q.shape
    g = k // RECORD_GROUP
    c = q.to(torch.uint8).view(n // RECORD_BLOCK, RECORD_BLOCK, g, 4, 2, 4)  # [nb, i, g, p, half, b]
    codes = (c[..., 0, :] | (c[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(n // RECORD_BLOCK, g, 256)

    def f16(t: torch.Tensor) -> torch.Tensor:  # [N, G] -> bytes [nb, G, 32]
        return t.to(torch.float16).view(n // RECORD_BLOCK, RECORD_BLOCK, g).transpose(1, 2).contiguous().view(torch.uint8)

    return torch.cat([codes, f16(scale), f16(minimum)], dim=-1).contiguous()


def unpack_records(blocks: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of `pack_records`: (q [N, K] uint8, scale [N, K/32], minimum [N, K/32] float32)."""
    g = k // RECORD_GROUP
    codes = blocks[..., :256].reshape(n // RECORD_BLOCK, g, 4, RECORD_BLOCK, 4)  # [nb, g, p, i, b]
    q = torch.stack([codes & 15, codes >> 4], dim=3).permute(0, 4, 1, 2, 3, 5).reshape(n, k)

    def f32(t: torch.Tensor) -> torch.Tensor:  # bytes [nb, G, 32] -> [N, G]
        return t.contiguous().view(torch.float16).transpose(1, 2).reshape(n, g).float()

    return q, f32(blocks[..., 256:288]), f32(blocks[..., 288:320])


def _needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether a product of `tensors` must be differentiable (pardec's ops have no backward)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class F32Linear(nn.Linear):
    """A float32 nn.Linear (a decoder layer or the output head) on pardec's AVX2 kernel
    ``pardec_avx2::f32_mm`` over its own weight, shared, not copied: y = x @ W.T + bias,
    each row computed alone (a row's output does not depend on the rows beside it). A
    prefill of `DENSE_FROM_ROWS` rows or more, other activations, or activations that need
    a gradient take ``nn.functional.linear``. Still an nn.Linear for its readers (heads,
    layer-skip)."""

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__(dense.in_features, dense.out_features, bias=False, device="meta")
        self.weight = dense.weight  # [N, K] float32
        self.bias = dense.bias
        #: As `Int4Records.shared_columns` (`share_products`).
        self.shared_columns: tuple[int, int] | None = None

    @staticmethod
    def takes(linear: nn.Module) -> bool:
        """Whether the kernel takes the layer: a dense float32 CPU nn.Linear with a
        contiguous weight and inputs in 8s."""
        return (type(linear) is nn.Linear and linear.weight.dtype == torch.float32 and linear.weight.device.type == "cpu"
                and linear.weight.is_contiguous() and linear.in_features % 8 == 0)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        if x2d.shape[0] >= DENSE_FROM_ROWS or x2d.dtype != torch.float32 or _needs_grad(x2d, self.weight):
            return nn.functional.linear(x, self.weight, self.bias)
        if self.shared_columns is not None and torch.compiler.is_compiling():
            lo, hi = self.shared_columns  # the group's product, sliced (as `Int4Records`)
            y = torch.ops.pardec_avx2.f32_mm(x2d, self.shared_weight)[:, lo:hi]
        else:
            y = torch.ops.pardec_avx2.f32_mm(x2d, self.weight)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", float32, pardec's AVX2 kernel"


class Int8F32(Int8Linear):
    """`Int8Linear` with float32 activations on pardec's AVX2 kernel
    ``pardec_avx2::q8f32_mm``, over the same codes and scales (not copied): float32 sums,
    each row computed alone. torch's ``_weight_int8pack_mm`` works row by row on such CPUs
    (16 rows cost 14 one; docs/runner.md)."""

    #: As `F32Linear.shared_columns` (`share_products` sets it on the instance).
    shared_columns: tuple[int, int] | None = None

    @classmethod
    def from_int8(cls, layer: Int8Linear) -> Int8F32 | None:
        """The same layer on the kernel; None where it cannot take it."""
        if layer.scales.dtype != torch.float32 or layer.weight_int8.device.type != "cpu" or layer.in_features % 8:
            return None
        return cls(layer.weight_int8, layer.scales, None if layer.bias is None else layer.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        if x2d.shape[0] >= DENSE_FROM_ROWS or x2d.dtype != torch.float32 or _needs_grad(x2d):
            return super().forward(x)
        if self.shared_columns is not None and torch.compiler.is_compiling():
            lo, hi = self.shared_columns
            y = torch.ops.pardec_avx2.q8f32_mm(x2d, self.shared_weight_int8, self.shared_scales)[:, lo:hi]
        else:
            y = torch.ops.pardec_avx2.q8f32_mm(x2d, self.weight_int8, self.scales)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", float32, pardec's AVX2 kernel"


class Q8Records(nn.Module):
    """y = x @ W.T + bias with W as int8 codes in groups of 32 inputs, one scale per (output,
    group): w = q * d, llama.cpp's Q8_0. Multiplied by pardec's AVX2 library
    (``pardec_avx2::q8q8_blocks_mm``) with the activations quantized to int8 in the same
    groups (Q8_0 by Q8_0; ``--weights q8q8``), each row computed alone. `blocks` int8
    [N/16, K/32, 512] (`pack_head`'s layout), `scales` float16 [N/16, K/32, 16] (`q8_blocks`,
    or a GGUF's Q8_0 blocks as they are: `from_codes`). About 1.06 bytes a weight, half of
    bfloat16; the native step (`engine.native`) runs a Llama decoder of these in one call.
    """

    def __init__(self, blocks: torch.Tensor, scales: torch.Tensor, *, in_features: int, out_features: int,
                 bias: torch.Tensor | None) -> None:  # fmt: skip
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("blocks", blocks)
        self.register_buffer("scales", scales)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        #: As `Int4Records.shared_columns` (`share_products`).
        self.shared_columns: tuple[int, int] | None = None

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Q8Records | None:
        """Quantize a dense [out, in] CPU weight (`q8_blocks`); None where the kernel cannot
        take its shape (outputs not whole blocks of 16, inputs not whole groups of 32)."""
        n, k = weight.shape
        if weight.device.type != "cpu" or n % RECORD_BLOCK or k % RECORD_GROUP:
            return None
        codes, scales = q8_blocks(weight)
        return cls.from_codes(codes, scales, bias=None if bias is None else bias.detach())

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, *, bias: torch.Tensor | None = None) -> Q8Records | None:
        """From Q8_0 codes int8 [N, K] and float16 scales [N, K/32] (w = q * d), kept exactly;
        None where the kernel cannot take the shape."""
        n, k = codes.shape
        if codes.device.type != "cpu" or n % RECORD_BLOCK or k % RECORD_GROUP:
            return None
        # [N, G] -> [N/16, G, 16]: a block's 16 outputs side by side, group after group
        packed = scales.to(torch.float16).view(n // RECORD_BLOCK, RECORD_BLOCK, k // RECORD_GROUP).transpose(1, 2).contiguous()
        return cls(pack_head(codes), packed, in_features=k, out_features=n, bias=bias)

    def dequantize(self) -> torch.Tensor:
        """The dense weight W [out, in] float32 (w = q * d)."""
        n, k = self.out_features, self.in_features
        # blocks [NB, G, 8 (p), 16 (i), 4 (j)] -> q [NB, 16, G, 32]; scales [NB, G, 16] -> [NB, 16, G, 1]
        q = self.blocks.view(n // 16, k // 32, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(n // 16, 16, k // 32, 32)
        d = self.scales.float().transpose(1, 2).unsqueeze(-1)
        return (q.float() * d).reshape(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        if _needs_grad(x2d):
            y = nn.functional.linear(x2d, self.dequantize().to(x.dtype))
        else:
            y = torch.ops.pardec_avx2.q8q8_blocks_mm(x2d, self.blocks, self.scales).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 groups of 32 by int8 "
                "activation groups, pardec's AVX2 kernel")  # fmt: skip


def q8_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense [N, K] weight (K a multiple of 32) as llama.cpp's Q8_0: codes int8 [N, K] in
    -127..127 and one float16 scale per (output, group of 32 inputs), [N, K/32], d = max |w| /
    127 rounded to float16, each code round(w / d) with that rounded d."""
    n, k = weight.shape
    groups = weight.detach().float().reshape(n, k // RECORD_GROUP, RECORD_GROUP)
    top = torch.finfo(torch.float16).max
    scales = (groups.abs().amax(dim=-1) / 127.0).clamp(max=top).to(torch.float16)  # [N, G]
    d = scales.float().clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(-1)
    codes = torch.round(groups / d).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return codes, scales


def use_avx2(model: nn.Module) -> int:
    """Put the model's float32 dense layers and output head (`F32Linear`) and its float32
    `Int8Linear` layers (`Int8F32`) on pardec's AVX2 kernels, in place (the caller has
    loaded the `kernels.AVX2` library); returns how many."""
    swapped = 0
    head = _output_head(model)
    for name, layer in list(model.named_modules()):
        new: nn.Module | None = None
        if F32Linear.takes(layer):
            new = F32Linear(layer)
        elif type(layer) is Int8Linear:
            new = Int8F32.from_int8(layer)
        if new is not None:
            if layer is head:
                model.set_output_embeddings(new)
            else:
                _replace(model, name, new)
            swapped += 1
    return swapped


def use_records(model: nn.Module, activations: str) -> int:
    """Swap the model's CPU `Int4Linear` layers for `Int4Records` multiplying `activations`
    ("bfloat16", "int8" or "float32": `Int4Records`' kernels), and with "bfloat16" its `Int8Linear` ones for `Int8Records`
    and its decoder's dense bfloat16 nn.Linear ones for `BF16Records`, where the kernels
    take them, in place (the caller has loaded `pardec_cli.kernels`); returns how many."""
    swapped = 0
    dense = {name for name, _ in decoder_linears(model)} if activations == "bfloat16" else set()
    for name, layer in list(model.named_modules()):
        new: nn.Module | None = None
        if isinstance(layer, Int4Linear):
            new = Int4Records.from_int4(layer, activations)
        elif isinstance(layer, Int8Linear) and activations == "bfloat16":
            new = Int8Records.from_int8(layer)
        elif name in dense and isinstance(layer, nn.Linear):
            new = BF16Records.from_linear(layer)
        if new is not None:
            _replace(model, name, new)
            swapped += 1
    return swapped


@functools.cache
def cpu_pack_block() -> int | None:
    """The output-channel block B of torch's CPU int4 packing: bytes laid out [N/B, K, B/2],
    channel d of a block in the low nibble and d + B/2 in the high one (B = 64 with
    AVX512). Found by packing random codes once; None when no such B reproduces them."""
    codes = torch.randint(0, 16, (256, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = pack_int4(codes)
    ones = torch.ones(1, 256, 2)
    ones[..., 1] = 8.0  # scale 1, zero 8: w = q exactly
    for block in (64, 32, 16, 128, 256):
        if torch.equal(_unpack_cpu(packed, ones.expand(2, 256, 2), 256, 64, 32, block), codes.float()):
            return block
    return None


def _cpu_codes(packed: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    """The codes q [n, k] (uint8, 0..15) of CPU-packed bytes [N/B, K, B/2]."""
    blocks = packed.view(n // block, k, block // 2)
    return torch.cat([blocks & 15, blocks >> 4], dim=2).transpose(1, 2).reshape(n, k)


def _codes_by_kernel(layer: Int4Linear) -> torch.Tensor:
    """The codes q [n, k] (uint8) of a CPU `Int4Linear`, by its own kernel: with scale 1 and
    zero 8 each weight (q - 8) * 1 + 8 is its code, exact in any float dtype."""
    k, n, dtype = layer.in_features, layer.out_features, layer.scales_and_zeros.dtype
    unit = torch.empty(k // layer.group_size, n, 2, dtype=dtype)
    unit[..., 0], unit[..., 1] = 1.0, 8.0
    eye = torch.eye(k, dtype=dtype)
    w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, layer.packed, layer.group_size, unit)  # [k, n]
    return w_t.t().round().to(torch.uint8).contiguous()


def _unpack_cpu(packed: torch.Tensor, scales_and_zeros: torch.Tensor, n: int, k: int, group: int, block: int) -> torch.Tensor:
    """W [n, k] = (q - 8) * scale + zero from CPU-packed codes [N/B, K, B/2] and [K/g, N, 2]."""
    q = _cpu_codes(packed, n, k, block).view(n, k // group, group)
    sz = scales_and_zeros.transpose(0, 1)  # [N, K/g, 2]
    return ((q.to(sz.dtype) - 8) * sz[..., :1] + sz[..., 1:]).reshape(n, k)


def pack_int4(q: torch.Tensor, inner_k_tiles: int = 8) -> torch.Tensor:
    """Pack 4-bit codes q [N, K] (values 0..15) into the layout of q's device's kernel.

    CPU: ``_convert_weight_to_int4pack_for_cpu`` takes int32 codes [N, K] and returns
    uint8 [N, K/2]. CUDA: ``_convert_weight_to_int4pack`` takes uint8 [N, K/2] with two
    codes per byte (the even column in the high nibble) and returns its tiled int32
    layout; it needs N % 8 == 0 and K % (inner_k_tiles * 16) == 0.
    """
    if q.device.type == "cuda":
        q = q.to(torch.uint8)
        pairs = (q[:, ::2] << 4) | q[:, 1::2]  # [N, K/2]
        return torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), inner_k_tiles)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)


def int4_fits(n: int, k: int, group_size: int, device_type: str) -> bool:
    """Whether `device_type`'s int4 kernel takes a [n, k] weight: inputs in whole groups;
    CUDA also needs the tile multiples of `pack_int4` (SmolLM2's 576-wide inputs miss them)."""
    if k % group_size:
        return False
    if device_type == "cuda":
        return n % 8 == 0 and k % 128 == 0
    return k % 2 == 0


def can_int4(linear: nn.Linear, group_size: int) -> bool:
    """Whether the int4 kernel of the layer's device takes its shape (`int4_fits`)."""
    n, k = linear.weight.shape
    return int4_fits(n, k, group_size, linear.weight.device.type)


def _output_head(model: nn.Module) -> nn.Module | None:
    return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None


def lookup_only_embedding(model: nn.Module) -> torch.Tensor | None:
    """The input embedding table where no decoding step reads it whole: a step looks up a
    few of its rows, and the output head does not multiply through it (untied; or a head
    that holds its own copy, `Int8Head`, `RecordsHead`, or no dense weight at all). None
    when the head multiplies the tied table itself, or the model has no such accessors."""
    try:
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        head = _output_head(model)
    except (NotImplementedError, AttributeError):
        return None
    table = getattr(embedding, "weight", None)
    if table is None:
        return None
    weight = None if isinstance(head, (Int8Head, RecordsHead)) else getattr(head, "weight", None)
    return None if weight is not None and weight.data_ptr() == table.data_ptr() else table


def decoder_linears(model: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """Every nn.Linear of the model except its output head (kept dense, see the module doc)."""
    head = _output_head(model)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module is not head:
            yield name, module


def quantize_linears(model: nn.Module, mode: str, *, group_size: int = DEFAULT_GROUP_SIZE,
                     prepared: dict[str, nn.Module] | None = None) -> int:  # fmt: skip
    """Replace the decoder's nn.Linear layers with `Int8Linear` ("int8"), `Int4Linear`
    ("int4") or `Q8Records` ("q8q8": pardec's AVX2 library loaded) in place; return how
    many were replaced ("full" replaces none).

    `prepared` maps module names to ready quantized modules (for example built straight
    from a GGUF file's 4-bit codes); those are used instead of quantizing the dense weight.
    A layer the int4 or q8q8 kernel cannot take keeps its dense weight.
    """
    if mode == "full":
        return 0
    if mode not in ("int8", "int4", "q8q8"):
        raise ValueError(f"unknown weight mode {mode!r}")
    prepared = prepared or {}
    replaced = 0
    for name, linear in list(decoder_linears(model)):
        new = prepared.get(name)
        if new is None:
            if mode == "int8":
                new = Int8Linear.from_weight(linear.weight, linear.bias)
            elif mode == "q8q8":
                new = Q8Records.from_weight(linear.weight, linear.bias)
                if new is None:
                    continue
            elif can_int4(linear, group_size):
                new = Int4Linear.from_weight(linear.weight, linear.bias, group_size=group_size)
            else:
                continue
        _replace(model, name, new)
        replaced += 1
    return replaced


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` where the submodule `name` of `model` is."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


class PackedLinear(nn.Module):
    """A dense bfloat16 linear layer on oneDNN's prepacked copy of its weight: for the
    few rows of a decoding step it reads the weight faster than ``nn.functional.linear``
    (the compiled step's ``mm``), with the same products (checked when packed;
    docs/weights.md has the measurements). The packed copy replaces the dense weight."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, *, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed)  # opaque oneDNN tensor, [N, K] bfloat16
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear | None:
        """The packed layer, or None where this torch or CPU cannot pack it or its products
        differ from ``nn.functional.linear``'s (probed on 1 and 5 rows)."""
        weight = linear.weight.detach()
        if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
            return None
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
            bias = None if linear.bias is None else linear.bias.detach()
            for rows in (1, 5):
                probe = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows)).to(weight.dtype)
                got = onednn_linear(probe, packed, bias)
                if not torch.equal(got, nn.functional.linear(probe, weight, bias)):
                    return None
        except (RuntimeError, AttributeError, NotImplementedError):
            return None
        return cls(packed, bias, in_features=weight.shape[1], out_features=weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = onednn_linear(x.reshape(-1, self.in_features), self.packed, self.bias)  # [rows, N]
        return out.reshape(*x.shape[:-1], self.out_features)


@torch.library.custom_op("pardec::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` for `x` [M, K] and `packed`, oneDNN's prepacked W [N, K]
    (`PackedLinear`). An opaque op for the reason `onednn_int8_mm` is one: inductor's own
    lowering of ``mkldnn._linear_pointwise`` wants the packed weight as a frozen constant."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@onednn_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], packed.shape[0]))


def pack_linears(model: nn.Module) -> int:
    """Put the decoder's dense bfloat16 nn.Linear layers on CPU on oneDNN's prepacked
    weights (`PackedLinear`) in place, where their products stay the same; return how many."""
    packed = 0
    for name, linear in list(decoder_linears(model)):
        new = PackedLinear.from_linear(linear)
        if new is not None:
            _replace(model, name, new)
            packed += 1
    return packed


class Int8Head(nn.Module):
    """The output head's logits on int8 x int8 products, exact per row.

    The weight is int8 with one scale per vocabulary row, after each input column j is
    divided by ``c[j] = sqrt(max |W[:, j]|)`` (and the activations multiplied by it:
    SmoothQuant's alpha 0.5, taken from the weight alone), which evens out the columns
    that set a row's scale. Each activation row is split into two int8 passes,
    ``x ~ q1 * s1 + q2 * s2`` (the second quantizes the first's error, ~14 bits in all),
    and both go through one integer matmul, [2M, K] x [K, V] -> int32. Integer
    accumulation is exact, so a row's logits do not depend on how many rows share the
    step, which a dense 16-bit GEMM does not promise. `weight` and `bias` stay the dense
    tensors (shared, not copied) for readers of ``get_output_embeddings()``.

    The product runs on oneDNN's int8 matmul over a copy of the codes prepacked once
    (``torch._int_mm`` reorders the codes at every call), with the activations as signed
    int8 (`packed`) or shifted by 128 into uint8 (`packed_u8`: VNNI's native u8 x s8, with
    zero point 128), whichever is fastest here, where this torch and CPU have it and it
    reproduces ``_int_mm``; otherwise on ``_int_mm`` (`weight_int8`). docs/weights.md has
    the measurements.
    """

    def __init__(self, dense: nn.Linear, *, prepack: bool | None = None) -> None:
        """`prepack`: True takes oneDNN's prepacked kernel wherever it computes the same
        products, False never, None (default) only where it is also faster here."""
        super().__init__()
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.weight = dense.weight  # [V, K], the tied embedding for SmolLM2-style models
        self.bias = dense.bias
        codes, scales, smooth = smoothed_int8(dense.weight)  # [V, K] int8, [V], [K]
        self.register_buffer("scales", scales)  # [V] float32
        self.register_buffer("smooth", smooth)  # [K] float32
        found = None if prepack is False else onednn_int8_packed(codes, scales, timed=prepack is None)
        if found is None:
            self.register_buffer("weight_int8", codes)
        else:  # not persistent: an opaque oneDNN tensor, rebuilt from `weight` at load
            packed, x_zero_point = found
            self.register_buffer("packed_u8" if x_zero_point else "packed", packed, persistent=False)
            self.register_buffer("zeros", torch.zeros((), dtype=torch.long), persistent=False)  # symmetric codes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features).float() * self.smooth  # [M, K]
        q1, s1 = _int8_rows(x2d)
        q2, s2 = _int8_rows(x2d - q1.float() * s1)
        both = torch.cat([q1, q2])  # [2M, K] int8
        if hasattr(self, "packed_u8"):
            shifted = _as_uint8(both)
            scaled = torch.ops.pardec.onednn_int8_mm(shifted, self.packed_u8, self.scales, self.zeros, 128)  # [2M, V]
        elif hasattr(self, "packed"):
            scaled = torch.ops.pardec.onednn_int8_mm(both, self.packed, self.scales, self.zeros, 0)  # [2M, V]
        else:
            scaled = int_mm_scaled(both, self.weight_int8, self.scales)
        m = x2d.shape[0]
        y = scaled[:m] * s1 + scaled[m:] * s2
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    @property
    def kernel(self) -> str:
        """The product's kernel: "oneDNN prepacked, u8", "oneDNN prepacked, s8" or "_int_mm"."""
        if hasattr(self, "packed_u8"):
            return "oneDNN prepacked, u8"
        return "oneDNN prepacked, s8" if hasattr(self, "packed") else "_int_mm"

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 x two int8 passes ({self.kernel})"


class Int8RecordsHead(RecordsHead):
    """The output head's logits on pardec's int8 kernel (``pardec_q4::q8bf16_mm``,
    `RecordsHead`): `Int8Head`'s smoothed int8 codes (`smoothed_int8`), bfloat16
    activations, float32 sums. One pass over the codes where `Int8Head` makes two int8
    passes through oneDNN: 0.51 against 0.82 ms for SmolLM2's 49152 x 576 head at one row
    (docs/weights.md)."""

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__(dense)
        codes, scales, smooth = smoothed_int8(dense.weight)
        self.register_buffer("smooth", smooth)  # [K] float32
        self.register_buffer("blocks", pack_pairs(codes))  # [V/16, K/2, 16, 2] int8
        self.register_buffer("scales", scales)  # [V] float32

    @staticmethod
    def fits(head: nn.Module) -> bool:
        """Whether `head` is a CPU nn.Linear the kernel takes (`_PairRecords.takes`)."""
        return isinstance(head, nn.Linear) and _PairRecords.takes(head.weight)

    def _product(self, x2d: torch.Tensor) -> torch.Tensor:
        smoothed = (x2d.float() * self.smooth).to(x2d.dtype)
        return torch.ops.pardec_q4.q8bf16_mm(smoothed, self.blocks, self.scales, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row, pardec's kernel"


class Int8F32Head(RecordsHead):
    """The output head's logits on pardec's AVX2 kernels (`RecordsHead`): `Int8Head`'s
    smoothed int8 codes by float32 activations, each row alone. Where the inputs come in
    groups of 32, ``pardec_avx2::q8q8_mm`` quantizes each group of a row to int8 (llama.cpp's
    Q8_0 by Q8_0: a third less time than float products, far less per extra row); else
    ``pardec_avx2::q8f32_mm`` multiplies the float32 activations. Without VNNI, `Int8Head`'s
    int8 x int8 products (``_int_mm``) cost about one row's time per row (docs/runner.md,
    "float32 on AVX2")."""

    activations = torch.float32

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__(dense)
        codes, scales, smooth = smoothed_int8(dense.weight)
        self.register_buffer("smooth", smooth)  # [K] float32
        # Inputs in 32s: records of 16 outputs by 32 inputs (`pack_head`) for q8q8_mm; else [V, K].
        self.register_buffer("codes", pack_head(codes) if self.in_features % 32 == 0 else codes)
        self.register_buffer("scales", scales)  # [V] float32

    @staticmethod
    def fits(head: nn.Module) -> bool:
        """Whether `head` is a CPU nn.Linear of inputs in 8s."""
        return isinstance(head, nn.Linear) and head.weight.device.type == "cpu" and head.in_features % 8 == 0

    def _product(self, x2d: torch.Tensor) -> torch.Tensor:
        # The native step (engine/native.py) multiplies as this does: the same bits.
        op = torch.ops.pardec_avx2.q8q8_mm if self.in_features % 32 == 0 else torch.ops.pardec_avx2.q8f32_mm
        return op(x2d * self.smooth, self.codes, self.scales)

    def extra_repr(self) -> str:
        by = "int8 activations in groups of 32" if self.in_features % 32 == 0 else "float32 activations"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row by {by}, pardec's AVX2 kernel"


def pack_head(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes [N, K] (K a multiple of 32) as ``pardec_avx2::q8q8_mm`` takes them:
    [ceil(N/16), K/32, 512], record (b, g) holding outputs 16b..16b+15 by inputs 32g..32g+31
    with byte 64 p + 4 i + j = q[16b + i, 32g + 4p + j] (one register: 16 outputs' next 4
    codes). A short last block is padded with zero codes."""
    n, k = codes.shape
    padded = torch.zeros(-(-n // 16) * 16, k, dtype=torch.int8)
    padded[:n] = codes
    # [NB, 16 (i), G, 8 (p), 4 (j)] -> [NB, G, p, i, j]
    return padded.view(-1, 16, k // 32, 8, 4).permute(0, 2, 3, 1, 4).reshape(-1, k // 32, 512).contiguous()


def smoothed_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A head's int8 codes as `Int8Head` and `Int8RecordsHead` hold them: each input column
    j divided by ``c[j] = sqrt(max |W[:, j]|)`` (SmoothQuant's alpha 0.5, from the weight
    alone; the activations are multiplied by it), then one symmetric scale per row. Returns
    (codes int8 [V, K], scales float32 [V], c float32 [K]).

    In slices of `SMOOTH_ROWS` rows, each row's arithmetic `Int8Linear.from_weight`'s: a
    whole head's float32 temporaries (113 MB each for a 49k x 576 head) are fresh pages the
    kernel zeroes, and made a load wait 0.45 s here, 0.15-0.2 s in slices (docs/runner.md)."""
    w = weight.detach()  # [V, K]
    smooth = torch.zeros(w.shape[1], device=w.device)
    for first in range(0, w.shape[0], SMOOTH_ROWS):
        torch.maximum(smooth, w[first : first + SMOOTH_ROWS].float().abs().amax(dim=0), out=smooth)
    smooth = smooth.clamp(min=1e-12).sqrt()  # [K]
    codes = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scales = torch.empty(w.shape[0], device=w.device)
    for first in range(0, w.shape[0], SMOOTH_ROWS):
        part = w[first : first + SMOOTH_ROWS].float() / smooth
        rows = Int8Linear.from_weight(part)
        codes[first : first + SMOOTH_ROWS] = rows.weight_int8
        scales[first : first + SMOOTH_ROWS] = rows.scales
    return codes, scales, smooth


#: Rows `smoothed_int8` quantizes at a time (4.5 MB of float32 for 576 inputs).
SMOOTH_ROWS = 2048


@torch.library.custom_op("pardec::onednn_int8_mm", mutates_args=())
def onednn_int8_mm(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, x_zero_point: int
) -> torch.Tensor:
    """``((x - x_zero_point) @ codes.T) * scales`` in float32 for `x` [M, K] (int8 with zero
    point 0, or uint8 with 128) and `packed`, oneDNN's prepacked int8 codes [N, K]
    (`onednn_int8_packed`); integer accumulation, exact.

    An opaque op so that inductor calls the kernel as it is: its own lowering of
    ``onednn.qlinear_pointwise`` wants the packed weight as a frozen constant, and the
    runner passes weights as inputs (one saved step serves every checkpoint).
    """
    return torch.ops.onednn.qlinear_pointwise(
        x, 1.0, x_zero_point, packed, scales, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


@onednn_int8_mm.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, x_zero_point: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], scales.shape[0]), dtype=torch.float32)


def int_mm_scaled(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``(x @ codes.T) * scales`` in float32 on ``torch._int_mm``: int8 `x` [M, K], int8
    `codes` [N, K], float32 `scales` [N]. What `onednn_int8_mm` must reproduce bit for bit."""
    # The transposed view of the [N, K] codes is _int_mm's fast layout at few rows.
    return torch._int_mm(x, codes.t()).float() * scales


def _as_uint8(x: torch.Tensor) -> torch.Tensor:
    """int8 `x` as uint8 ``x + 128`` (the sign bit flipped)."""
    return torch.bitwise_xor(x.view(torch.uint8), 128)


def onednn_int8_packed(codes: torch.Tensor, scales: torch.Tensor, *, timed: bool = True) -> tuple[torch.Tensor, int] | None:
    """oneDNN's prepacked copy of int8 `codes` [N, K] (float32 `scales` [N]) and the zero
    point its activations take (0: signed int8; 128: uint8), or None where this torch or CPU
    cannot multiply by it, it is slower than ``torch._int_mm`` here, or its products differ
    from ``_int_mm``'s (checked once on 8 rows; every int8 kernel must agree exactly).
    `timed`: choose by timing (`_fastest_int8_kernel`); else uint8, VNNI's native form."""
    if codes.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    zeros = torch.zeros((), dtype=torch.long)
    try:
        packed = torch.ops.onednn.qlinear_prepack(codes, None)
        x_zero_point = _fastest_int8_kernel(codes, packed, scales, zeros) if timed else 128
        if x_zero_point is None:
            return None
        probe = torch.randint(
            -127, 128, (8, codes.shape[1]), dtype=torch.int8, generator=torch.Generator().manual_seed(0)
        )
        got = onednn_int8_mm(_as_uint8(probe) if x_zero_point else probe, packed, scales, zeros, x_zero_point)
        want = int_mm_scaled(probe, codes, scales)
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return (packed, x_zero_point) if torch.equal(got, want) else None


#: Rows of the codes on which a kernel is first screened: a kernel over 4x slower than
#: the fastest there (oneDNN's reference fallback) is not timed on the whole matrix.
SCREEN_ROWS = 2048


def _fastest_int8_kernel(codes: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> int | None:
    """The activations' zero point of oneDNN's fastest prepacked product here (0: signed
    int8, 128: uint8), or None where ``_int_mm`` is fastest: timed at a one-token step's two
    rows, fastest of 3 calls each, on the whole `codes` (``_int_mm``'s cost is reordering
    them, which a slice that stays in cache would hide) after a screen on a slice. On an AMD
    EPYC with AVX512-VNNI and no AMX: signed ~80x slower than ``_int_mm``, uint8 3x faster."""
    x = torch.randint(-127, 128, (2, codes.shape[1]), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    x_u8 = _as_uint8(x)
    part, part_scales = codes[:SCREEN_ROWS].contiguous(), scales[:SCREEN_ROWS].contiguous()
    part_packed = torch.ops.onednn.qlinear_prepack(part, None)

    def fastest(run: Callable[..., torch.Tensor], *args: torch.Tensor) -> float:
        run(*args)  # warm-up: first-call dispatch and kernel generation
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run(*args)
            times.append(time.perf_counter() - start)
        return min(times)

    kernels: dict[int | None, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
        None: lambda codes_, packed_, scales_: int_mm_scaled(x, codes_, scales_),
        128: lambda codes_, packed_, scales_: onednn_int8_mm(x_u8, packed_, scales_, zeros, 128),
        0: lambda codes_, packed_, scales_: onednn_int8_mm(x, packed_, scales_, zeros, 0),
    }
    screened = {key: fastest(run, part, part_packed, part_scales) for key, run in kernels.items()}
    best = min(screened.values())
    timed = {
        key: fastest(run, codes, packed, scales)
        for key, run in kernels.items()
        if screened[key] <= 4 * best
    }
    return min(timed, key=lambda key: timed[key])


def _int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 codes of each row of `x` [M, K] and their scales [M, 1]."""
    scale = (x.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-30)
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def quantize_head(model: nn.Module, *, ours: bool = False, avx2: bool = False) -> bool:
    """Route the model's logits through `Int8Head`, or with `ours` (pardec's kernels
    loaded, bfloat16 activations) `Int8RecordsHead`, or with `avx2` (pardec's AVX2 kernels
    loaded, float32 activations) `Int8F32Head`, where it fits, in place; False (nothing
    changed) when the model has no nn.Linear output head or it is not on a CPU (``_int_mm``
    on CUDA wants more than 16 rows)."""
    head = _output_head(model)
    if not isinstance(head, nn.Linear) or head.weight.device.type != "cpu":
        return False
    if ours and Int8RecordsHead.fits(head):
        model.set_output_embeddings(Int8RecordsHead(head))
    elif avx2 and Int8F32Head.fits(head):
        model.set_output_embeddings(Int8F32Head(head))
    else:
        model.set_output_embeddings(Int8Head(head))
    return True


#: torch's CPU int4 kernel (tinygemm) multiplies rows in tiles of 4: a step of 4 rows
#: costs 1.7x one row, 5 rows 2.7x, as many as 8 (1536 x 576 layer, bf16, 2 cores). The
#: whole compiled step follows it: 11.4, 15.6, 20.7 and 21.8 ms for 1, 4, 5 and 8 rows.
CPU_INT4_ROW_TILE = 4


def share_products(model: nn.Module, probe: Callable[[], object]) -> int:
    """Let the CPU int4 layers that multiply the same input (a decoder layer's q, k and v
    projections; its gate and up ones) share one packed weight, so that a compiled step
    makes one kernel call per group instead of one per layer: the int4 kernel costs about
    13 us per call beyond its bytes on 2 cores, and SmolLM2's 210 calls per token become 120.

    Which layers share an input is observed, not assumed: `probe()` runs one forward of
    the model while hooks note every int4 layer's input tensors; layers whose inputs were
    the very same tensors, with the same input width and groups, form a group. Each member
    keeps its own output: eagerly it multiplies its own rows (the same bits as before),
    compiled it slices the group's product (`Int4Linear._matmul`). Its codes become a view
    into the group's; its scales are kept twice, its own and the group's ([K/g, N, 2]: a
    member's columns of the group's are strided, which the kernel cannot read, and copying
    them per eager call cost 4% of an eager step): a quarter of the grouped layers' code
    bytes more (about 9 MB on SmolLM2-135M). The kernel's packing is in blocks of
    `cpu_pack_block()` output rows, so only layers with whole blocks join.
    `Int4Records` layers share the same way, without the second copy of scales (a record
    holds its block's). Returns how many groups were formed (0 when `probe` fails)."""
    layers = [m for m in model.modules() if _share_key(m) is not None]
    if not layers:  # nothing could join (CUDA's packing, other widths): no probe forward
        return 0
    seen: dict[nn.Module, list[torch.Tensor]] = {m: [] for m in layers}
    hooks = [m.register_forward_pre_hook(lambda m, args: seen[m].append(args[0])) for m in layers]
    try:
        with torch.no_grad():
            probe()
    except Exception:  # an architecture the probe cannot run: the layers stay as they are
        return 0
    finally:
        for hook in hooks:
            hook.remove()
    _one_kind_per_input(model, seen)
    groups: dict[tuple[object, ...], list[nn.Module]] = {}
    for m, inputs in seen.items():
        if inputs:  # ids are safe to compare: `seen` holds every input until the end
            groups.setdefault((*map(id, inputs), _share_key(m)), []).append(m)
    shared = 0
    for members in groups.values():
        if len(members) > 1:
            _share(members)
            shared += 1
    return shared


def _one_kind_per_input(model: nn.Module, seen: dict[nn.Module, list[torch.Tensor]]) -> None:
    """Give layers of one input on the AVX2 library one kind, so that they can share a
    product: where a GGUF file's model mixes q4q8 records and Q8_0 groups over one input (a
    Q4_K_M file's Q6_K v projection beside Q4_K q and k), the kind holding most of their
    weights takes the others, requantized from their dense weights (in `model` and `seen`)."""
    names = {m: name for name, m in model.named_modules()}
    by_input: dict[tuple[object, ...], list[nn.Module]] = {}
    for m, inputs in seen.items():
        if inputs and avx2_records(m) and m.shared_columns is None:
            by_input.setdefault((*map(id, inputs), m.in_features), []).append(m)
    for members in by_input.values():
        weights: dict[type, int] = {}
        for m in members:
            weights[type(m)] = weights.get(type(m), 0) + m.in_features * m.out_features
        if len(weights) < 2:
            continue
        kind = max(weights, key=lambda k: (weights[k], k is Q8Records))  # a tie: the wider
        for m in members:
            if type(m) is kind:
                continue
            bias = None if m.bias is None else m.bias.detach()
            new: nn.Module | None
            if kind is Q8Records:
                new = Q8Records.from_weight(m.dequantize(), bias)
            else:
                new = Int4Records.from_codes(*int4_codes_from_weight(m.dequantize(), RECORD_GROUP), activations="float32", bias=bias)
            if new is not None:
                _replace(model, names[m], new)
                seen[new] = seen.pop(m)


def avx2_records(m: nn.Module) -> bool:
    """Whether `m` multiplies on the AVX2 library's q4q8 kernel (`Int4Records` with float32
    activations) or its q8q8 one (`Q8Records`): the products the native step takes."""
    return type(m) is Q8Records or (type(m) is Int4Records and m.activations == "float32")


def _share_key(m: nn.Module) -> tuple[object, ...] | None:
    """What layers of one input must also have in common to share a product; None for a
    layer that cannot join (CPU int4 layers only, in whole blocks of their packing)."""
    if isinstance(m, Int4Records) and m.shared_columns is None:
        return (Int4Records, m.in_features, m.activations)
    if isinstance(m, (_PairRecords, Q8Records)) and m.shared_columns is None:
        return (type(m), m.in_features)
    if isinstance(m, (F32Linear, Int8F32)) and m.shared_columns is None:
        return (type(m), m.in_features)
    if isinstance(m, Int4Linear) and m.packed.device.type == "cpu" and m.shared_columns is None:
        block = cpu_pack_block()
        if block is not None and m.out_features % block == 0:
            return (Int4Linear, m.in_features, m.group_size, m.scales_and_zeros.dtype)
    return None


def _share(members: list[nn.Module]) -> None:
    """Concatenate a group's weight (`Int4Linear`'s packed rows, `Int4Records`',
    `Int8Records`' and `BF16Records`' records of 16 outputs) and make each member's a view of it;
    `Int4Linear` members also get the group's scales beside their own (see
    `share_products`), `Int8Records` members the group's [N_total] scales."""
    records = isinstance(members[0], (Int4Records, _PairRecords, Q8Records))
    name, rows = ("blocks", RECORD_BLOCK) if records else ("packed", 1)
    if isinstance(members[0], (F32Linear, Int8F32)):  # their own [N, K] rows
        name = "weight" if isinstance(members[0], F32Linear) else "weight_int8"
    whole = torch.cat([getattr(m, name).detach() for m in members])  # [N_total / rows, ...]
    scales = None
    if isinstance(members[0], Int4Linear):
        scales = torch.cat([m.scales_and_zeros for m in members], dim=1)  # [K/g, N_total, 2]
    elif isinstance(members[0], (Int8Records, Int8F32, Q8Records)):
        scales = torch.cat([m.scales for m in members])  # [N_total], or Q8Records' [N_total / 16, G, 16]
    lo = 0
    for m in members:
        hi = lo + m.out_features
        part = whole[lo // rows:hi // rows]
        setattr(m, name, nn.Parameter(part, requires_grad=False) if name == "weight" else part)
        m.register_buffer(f"shared_{name}", whole)
        if scales is not None:
            m.register_buffer("shared_scales", scales)
        if isinstance(m, (Int8Records, Int8F32)) and scales is not None:
            m.scales = scales[lo:hi]  # a view: one copy of the scales
        elif isinstance(m, Q8Records) and scales is not None:
            m.scales = scales[lo // rows:hi // rows]
        m.shared_columns = (lo, hi)
        lo = hi


#: What identifies `merge_shared_products`'s pass to inductor's caches and to saved steps.
MERGE_SHARED_PRODUCTS = "pardec.quant.merge_shared_products.2"
#: The ops it merges. A pre-pass sees the graph functional (inductor re-inplaces ops
#: later), so equal calls of these pure ops on equal arguments are equal values.
_MERGED = ("aten._weight_int4pack_mm_for_cpu.default", "pardec_q4.q4bf16_mm.default", "pardec_q4.q4q8_mm.default",
           "pardec_q4.q8bf16_mm.default", "pardec_q4.bf16_mm.default", "pardec_avx2.f32_mm.default",
           "pardec_avx2.q8f32_mm.default", "pardec_avx2.q4q8_mm.default",
           "aten.reshape.default", "aten.view.default", "aten._unsafe_view.default")  # fmt: skip


def merge_identical_products(graph: torch.fx.Graph) -> None:
    """Make identical calls of the CPU int4 kernel, and the identical reshapes feeding
    them, one node: the members of a `share_products` group each call the kernel on the
    group's weight with the same input, and one call serves them all."""
    seen: dict[tuple[object, ...], torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or str(node.target) not in _MERGED:
            continue
        key = (node.target, _hashable(node.args), _hashable(node.kwargs))
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)


@functools.cache
def merge_shared_products() -> object:
    """`merge_identical_products` as an inductor ``post_grad_custom_pre_pass`` (with a
    uuid, so compiled graphs stay cacheable). Built on first use: importing inductor's
    pass class costs most of a second, which an eager run need not pay."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class MergeSharedProducts(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            merge_identical_products(graph)

        def uuid(self) -> str:
            return MERGE_SHARED_PRODUCTS

    return MergeSharedProducts()


def _hashable(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def row_tile(model: nn.Module) -> int:
    """Rows the model's matmuls compute together: a step of n * tile + 1 rows pays for a
    whole extra tile (`CPU_INT4_ROW_TILE` with torch's int4 kernel on a CPU,
    `RECORD_ROW_TILE` with pardec's AVX512 library, its AVX2 library's own with that
    one; 1 otherwise)."""
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return 1
    modules = list(model.modules())
    if any(isinstance(m, Int4Linear) for m in modules):
        return CPU_INT4_ROW_TILE
    records = [m for m in modules if isinstance(m, (Int4Records, _PairRecords, Q8Records))]
    if not records:
        return 1
    return min(_avx2_row_tile() if own_kernel_activations(m) == "float32" else RECORD_ROW_TILE for m in records)


def _avx2_row_tile() -> int:
    """Rows the loaded AVX2 library's q4q8 products take per pass (its build's own answer;
    its q8q8 ones take as many)."""
    ops = torch.ops.pardec_avx2
    return int(ops.q4q8_row_tile()) if hasattr(ops, "q4q8_row_tile") else AVX2_RECORD_ROW_TILE


def weights_label(model: nn.Module) -> str:
    """What the model's decoder layers hold: "int8", "int4" (whichever kernel), "q4q8"
    (int4 by int8 activations, where any layer is), "q8q8" (`Q8Records`), "q4q8+q8q8" (a
    GGUF file's layers each in its own width: `store.quantized.load_quantized_dir`), or
    "full" (dense)."""
    modules = list(model.modules())
    q4q8 = any(isinstance(m, Int4Records) and m.activations in ("int8", "float32") for m in modules)
    q8q8 = any(isinstance(m, Q8Records) for m in modules)
    if q4q8 or q8q8:
        return "q4q8+q8q8" if q4q8 and q8q8 else "q4q8" if q4q8 else "q8q8"
    if any(isinstance(m, (Int4Linear, Int4Records)) for m in modules):
        return "int4"
    if any(isinstance(m, (Int8Linear, Int8Records)) for m in modules):
        return "int8"
    return "full"


def own_kernel_activations(module: nn.Module) -> str | None:
    """The activations `module` multiplies on pardec's own kernels ("bfloat16" or "int8"
    on the AVX512 library, "float32" on the AVX2 one), None for a module that calls none."""
    if isinstance(module, Int4Records):
        return module.activations
    if isinstance(module, (F32Linear, Int8F32, Int8F32Head, Q8Records)):
        return "float32"
    return "bfloat16" if isinstance(module, (_PairRecords, RecordsHead)) else None


def on_own_bf16_kernels(model: nn.Module) -> bool:
    """Whether any of the model's int4, int8 or dense layers (or its head) multiply on
    pardec's bfloat16 kernels: then the kernels are loaded and this CPU runs them."""
    return any(own_kernel_activations(m) == "bfloat16" for m in model.modules())


def on_own_f32_kernels(model: nn.Module) -> bool:
    """Whether any of the model's layers (or its head) multiply on pardec's AVX2 kernels
    (float32 activations): then that library is loaded."""
    return any(own_kernel_activations(m) == "float32" for m in model.modules())


def kernel_suffix(model: nn.Module) -> str:
    """"+pardec" where layers run pardec's bfloat16 or float32 kernels, else "": a step's
    cost depends on the kernel, so what auto learns about steps keeps them apart."""
    ours = {own_kernel_activations(m) for m in model.modules()}
    return "+pardec" if ours & {"bfloat16", "float32"} else ""
