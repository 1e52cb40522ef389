"""The runner's attention for 16-bit steps on a CPU ("pardec_cpu", a transformers attention).

Transformers' eager attention repeats each key-value head for its query heads
(`repeat_kv`) and multiplies with `matmul`: in a compiled step of a few query rows that
is an external `bmm` per layer and head group, on copies of the cache's key and value
windows. Written instead as broadcast products summed over the head dimension (scores)
and over the keys (output), inductor compiles both into loops that read the cache in
place, as it already does for one row. Same math, summed in another order: the logits
move in the last bits of 16-bit precision.

Measured on a 2-core EPYC (AVX512-bf16, no AMX), SmolLM2-135M bf16 int4, 300-token
context, verify step: 2 rows 8.00 -> 6.73 ms, 4 rows 9.21 -> 8.32, 8 rows 12.45 -> 12.33,
16 rows 18.8 -> 20.6 (docs/runner.md). So the products serve up to REDUCE_ROWS query rows
and `matmul` serves more; the runner gives the two kinds of step their own graphs.

Where the model's layers run on pardec's bfloat16 kernels (`pardec_cli.kernels`), the
runner picks "pardec_kernel" instead: every step of up to MAX_ROWS rows, compiled or not,
calls pardec's attention op, which computes each row alone (float32 scores and softmax,
the output rounded once). A token's attention is then the same bits in a decoding step
and in a verifying step of any size, where inductor's loops (one row) and `bmm` (9 or
more) sum in different orders: with eager's roundings kept in the compiled steps
(`runner.EXACT_ROW_OPTIONS`), bfloat16 speculation gives plain decoding's tokens.
"""

from __future__ import annotations

from typing import Any

import torch

#: The name the attention is registered under with transformers' AttentionInterface.
CPU_ATTENTION = "pardec_cpu"
#: Up to this many query rows attention runs as broadcast products (see the module doc).
REDUCE_ROWS = 8
#: pardec's attention op (the kernels' `pardec_q4::attention`), registered with transformers.
KERNEL_ATTENTION = "pardec_kernel"
#: Up to this many query rows (a decoding or verifying step) the op serves; a longer
#: prefill goes to torch's fused attention (`prefill_attention`).
MAX_ROWS = 64
#: The keyword argument the runner passes (through transformers, to these attention
#: functions) with a fresh prefill: no cached rows, a plain chain, so row i sees keys 0..i
#: and torch's fused attention may skip the blocks above the diagonal (`is_causal`)
#: instead of adding a written-out mask to every block.
CAUSAL_PREFILL = "pardec_causal_prefill"


def cpu_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
    dropout: float = 0.0, scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' attention interface: (output [B, q, H, D], weights [B, H, q, W]), as
    its eager attention, with the two extras of the decoders' eager functions: a default
    scaling (head_dim ** -0.5) and Gemma 2's `softcap`. Broadcast products only inside a
    compiled step (see `attend`)."""
    if scaling is None:
        scaling = module.head_dim**-0.5
    if query.shape[2] > MAX_ROWS and kwargs.get("softcap") is None:
        return prefill_attention(query, key, value, attention_mask, scaling, causal=bool(kwargs.get(CAUSAL_PREFILL))), None
    products = query.shape[2] <= REDUCE_ROWS and torch.compiler.is_compiling()
    return attend(query, key, value, attention_mask, scaling, products=products, softcap=kwargs.get("softcap"))


def prefill_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float, *,
    causal: bool = False,
) -> torch.Tensor:
    """A prompt's attention (more rows than any decoding step verifies): query [B, H, q, D],
    key and value [B, H_kv, W, D], an additive mask [B, 1, q, W] or None -> output [B, q, H, D].

    torch's fused attention (blocks of keys, an online softmax, key-value heads read in
    place) instead of eager's `matmul`, which wrote out every score and copied each
    key-value head per query head (docs/runner.md, session 24). Every method's reply starts
    from the same prefill, so its arithmetic need not be a decoding step's.

    `causal`: a fresh prefill (`CAUSAL_PREFILL`), row i at position i: the mask is left out
    and the attention is causal from the top left (row i sees keys 0..i; the cache's rows
    past q are never seen), so the blocks above the diagonal are skipped (docs/runner.md,
    session 27)."""
    if causal:
        mask = None
    elif mask is not None and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, is_causal=causal, enable_gqa=key.shape[1] != query.shape[1],
    )
    return output.transpose(1, 2).contiguous()


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float, *,
    products: bool, softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [B, H, q, D], key and value [B, H_kv, W, D], an additive mask [B, 1, q, W] ->
    (output [B, q, H, D], attention weights [B, H, q, W]). `products`: as broadcast
    products summed (what inductor turns into loops over the cache; run eagerly they
    materialize every product), else key-value heads repeated and `matmul`. `softcap`:
    scores become softcap * tanh(scores / softcap) before the mask (Gemma 2)."""
    b, heads, rows, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    if products:
        # [B, H_kv, G, q, 1, D] x [B, H_kv, 1, 1, W, D] summed over D -> [B, H, q, W]
        scores = (query.view(b, kv_heads, groups, rows, 1, dim) * key.view(b, kv_heads, 1, 1, width, dim)).sum(-1)
        scores = scores.view(b, heads, rows, width) * scaling
    else:
        key = key[:, :, None].expand(b, kv_heads, groups, width, dim).reshape(b, heads, width, dim)
        value = value[:, :, None].expand(b, kv_heads, groups, width, dim).reshape(b, heads, width, dim)
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if products:
        # [B, H_kv, G, q, W, 1] x [B, H_kv, 1, 1, W, D] summed over W -> [B, H, q, D]
        output = (weights.view(b, kv_heads, groups, rows, width, 1) * value.view(b, kv_heads, 1, 1, width, dim)).sum(-2)
        output = output.view(b, heads, rows, dim)
    else:
        output = torch.matmul(weights, value)
    return output.transpose(1, 2).contiguous(), weights


def kernel_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
    dropout: float = 0.0, scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface on pardec's attention op (the kernels must be
    loaded: the AVX512 library's for bfloat16, the AVX2 one's for float32 queries over a
    float32 or float16 cache): (output [B, q, H, D], no weights). Whatever the op does not
    take (more than MAX_ROWS rows, head sizes not a multiple of 16 or over 256, other
    dtypes, Gemma 2's softcap) goes to `cpu_attention`."""
    if scaling is None:
        scaling = module.head_dim**-0.5
    dim, rows, width = query.shape[-1], query.shape[2], key.shape[2]
    if attention_mask is None and rows <= MAX_ROWS:
        # A causal step given no mask (not from transformers' models, which build eager's
        # mask for these attentions: `register`): the op takes it written out.
        seen = torch.arange(width, device=query.device) <= torch.arange(width - rows, width, device=query.device)[:, None]
        attention_mask = torch.zeros(rows, width, device=query.device).masked_fill(~seen, float("-inf"))[None, None]
    if (
        rows <= MAX_ROWS and dim % 16 == 0 and dim <= 256 and attention_mask is not None
        and attention_mask.dim() == 4 and kwargs.get("softcap") is None and key.dtype == value.dtype
    ):  # fmt: skip
        if query.dtype == key.dtype == torch.bfloat16 and attention_mask.dtype in (torch.bfloat16, torch.float32):
            return torch.ops.pardec_q4.attention(query, key, value, attention_mask, scaling), None
        if query.dtype == torch.float32 and key.dtype in (torch.float32, torch.float16) and attention_mask.dtype == torch.float32:
            # the AVX2 library's, over a float32 cache or a float16 one (`runner.kv_dtype`)
            return torch.ops.pardec_avx2.attention(query, key, value, attention_mask, scaling), None
    if key.dtype != query.dtype:  # a float16 cache under float32 queries: a long prefill's rows
        key, value = key.to(query.dtype), value.to(query.dtype)
    output, _ = cpu_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    return output, None


def register(name: str = CPU_ATTENTION) -> str:
    """Register pardec's attention `name` (CPU_ATTENTION or KERNEL_ATTENTION) with
    transformers (idempotent) and return the name.

    With its mask: eager attention's (a 4-D additive mask, built for every step). An
    attention registered alone gets SDPA's, which is left out where causality alone says it
    (SDPA then runs with is_causal): a prompt's rows then saw the tokens after them in every
    eager prefill past the op's MAX_ROWS (and in any on `cpu_attention`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(name, kernel_attention if name == KERNEL_ATTENTION else cpu_attention)
    AttentionMaskInterface.register(name, eager_mask)
    return name
