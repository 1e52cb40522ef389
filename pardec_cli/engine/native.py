"""The native step: a Llama decoder's whole decoding step as one call into pardec's AVX2 library.

The compiled step (`engine.runner`) spends most of its own time in the Python wrapper that
inductor generates between kernels: per layer five custom-op calls, ~15 views and ~13
allocations, about 2.5 ms of a 9 ms one-token step of SmolLM2-135M (docs/runner.md). Where a
model is exactly what ``pardec_avx2::llama_step`` computes, the runner hands it the step
instead: embeddings, every decoder layer (norms, q4q8 products, RoPE, the cache write,
attention, residuals, SiLU), the final norm and the int8 head in one C++ call, with no
graph to compile.

What qualifies (`native_reason` says why not): float32 on a CPU with the AVX2 library loaded;
transformers' Llama decoder layers (the class is the definition of the arithmetic the op
reproduces; another architecture, even one laid out alike, keeps the compiled graphs); every
product on `quant.Int4Records` with float32 activations (``--weights q4q8``) or on
`quant.Q8Records` (``--weights q8q8``; a GGUF file's model may mix the two, product by
product), q/k/v and gate/up each sharing one product of one kind (`quant.share_products`),
no biases; SiLU; the output head on the
AVX2 library (`quant.Int8F32Head`, as loads leave it, or `quant.F32Linear`). The rotary embedding is the model's own module: its cosines and sines
for every position of the cache are computed once per capacity, whatever the RoPE scaling.

Every row of a step is computed by the same instructions whatever the other rows, so a
verifying step's rows equal one-token steps bit for bit and greedy speculation reproduces
plain decoding on this runner. Its logits differ from the eager step's in the last bits
(another summation order); the runner checks the first native step against the eager one.
"""

from __future__ import annotations

from typing import Any

import torch

from pardec_cli import kernels
from pardec_cli.quant import RECORD_BLOCK, F32Linear, Int8F32Head, Q8Records, avx2_records


def native_reason(model: Any) -> str | None:
    """Why `model`'s steps cannot run as one ``llama_step`` call; None when they can."""
    if not kernels.loaded(kernels.AVX2) or not hasattr(torch.ops.pardec_avx2, "llama_step"):
        return "pardec's AVX2 library is not loaded"
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32:
        return "not float32 on a CPU"
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

    decoder: Any = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None or not len(layers) or not all(type(layer) is LlamaDecoderLayer for layer in layers):
        return "not a Llama decoder"
    if str(getattr(model.config, "hidden_act", "")) not in ("silu", "swish"):
        return f"activation {model.config.hidden_act!r}, not SiLU"
    norms = [decoder.norm, *(n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm))]
    if not all(type(n) is LlamaRMSNorm for n in norms) or len({float(n.variance_epsilon) for n in norms}) != 1:
        return "its norms differ"
    if not isinstance(decoder.embed_tokens, torch.nn.Embedding) or decoder.embed_tokens.weight.dtype != torch.float32:
        return "its embeddings are not a float32 table"
    head = model.get_output_embeddings()
    if not isinstance(head, (Int8F32Head, F32Linear)) or getattr(head, "bias", None) is not None:
        return "its output head is not on the AVX2 library"
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not _shared(attn.q_proj, attn.k_proj, attn.v_proj) or not _shared(mlp.gate_proj, mlp.up_proj):
            return "its products are not q4q8 or q8q8 records shared per input"
        if not all(_records(m) for m in (attn.o_proj, mlp.down_proj)):
            return "its products are not all q4q8 or q8q8 records"
    return None


def _records(m: Any) -> bool:
    """Whether `m` is a product the op takes: q4q8 records with float32 activations, or q8q8 ones, no bias."""
    return avx2_records(m) and m.bias is None


def _shared(*members: Any) -> bool:
    """Whether `members` are records of one kind sharing one product, in this order and nothing else."""
    if not all(_records(m) and type(m) is type(members[0]) and m.shared_columns is not None for m in members):
        return False
    whole = members[0].shared_blocks
    lo = 0
    for m in members:
        if m.shared_blocks is not whole or m.shared_columns != (lo, lo + m.out_features):
            return False
        lo += m.out_features
    return lo == whole.shape[0] * RECORD_BLOCK


def _scales(m: Any, shared: bool = False) -> torch.Tensor:
    """A q8q8 product's float16 scales (its group's where `shared`), empty for q4q8 records."""
    if not isinstance(m, Q8Records):
        return torch.empty(0)
    return m.shared_scales if shared else m.scales


#: `NativeStep`'s `logit_rows` for a step without its head: the final-normed rows come back.
NO_HEAD = -1


def weight_args(model: Any) -> tuple[Any, ...]:
    """``LlamaWeights``' constructor arguments for `model` (check `native_reason` first):
    the layers' norms and products, their q8q8 scales, the embeddings, the final norm, the
    head, the layers' cache slots, the shapes, the norms' epsilon and attention's scaling."""
    decoder = model.model
    tensors: list[torch.Tensor] = []
    # Per product (q/k/v, o, gate/up, down) a q8q8 one's scales, or nothing for q4q8
    # records (which hold their own): a GGUF file may mix the two kinds.
    scales: list[torch.Tensor] = []
    none = torch.empty(0)
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        tensors += [layer.input_layernorm.weight.detach(), attn.q_proj.shared_blocks, attn.o_proj.blocks,
                    layer.post_attention_layernorm.weight.detach(), mlp.gate_proj.shared_blocks, mlp.down_proj.blocks]
        scales += [_scales(attn.q_proj, shared=True), _scales(attn.o_proj), _scales(mlp.gate_proj, shared=True), _scales(mlp.down_proj)]
    if not any(t.numel() for t in scales):  # all q4q8: no scales at all
        scales = []
    first = decoder.layers[0]
    attn = first.self_attn
    head_dim = int(attn.head_dim)
    heads = attn.q_proj.out_features // head_dim
    kv_heads = attn.k_proj.out_features // head_dim
    head = model.get_output_embeddings()
    # The head: int8 codes with their scales and smoothing (`quant.smoothed_int8`), or float32 rows.
    smooth, codes, head_scales = (head.smooth, head.codes, head.scales) if isinstance(head, Int8F32Head) else (none, head.weight.detach(), none)
    return (
        [t.contiguous() for t in tensors], [t.contiguous() for t in scales], decoder.embed_tokens.weight.detach().contiguous(),
        decoder.norm.weight.detach().contiguous(), smooth, codes.contiguous(), head_scales, [int(layer.self_attn.layer_idx) for layer in decoder.layers],
        [heads, kv_heads, head_dim, int(first.mlp.down_proj.in_features)], float(first.input_layernorm.variance_epsilon),
        float(attn.scaling),
    )


class NativeStep:
    """`model`'s steps through ``pardec_avx2::llama_step`` (check `native_reason` first)."""

    def __init__(self, model: Any) -> None:
        decoder = model.model
        self.weights = torch.classes.pardec_avx2.LlamaWeights(*weight_args(model))
        self.layers = len(decoder.layers)
        self.hidden_size = int(decoder.embed_tokens.weight.shape[1])
        self._rotary = decoder.rotary_emb
        head_dim = int(decoder.layers[0].self_attn.head_dim)
        self._tables: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0, head_dim), torch.empty(0, head_dim))
        self._cache: list[torch.Tensor] = []  # the keys of the cache the op holds (`set_cache`), per layer
        # A chain's positions and mask: none (the op makes them; see __call__).
        self._no_positions, self._no_mask = torch.empty(0, dtype=torch.long), torch.empty(0)

    def rope_tables(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [P, D] for positions 0..P-1 with P >= `positions` (the model's own rotary module)."""
        if self._tables[0].shape[0] < positions:
            count = max(positions, 2 * self._tables[0].shape[0])
            ids = torch.arange(count).view(1, count)
            cos, sin = self._rotary(torch.empty(1, dtype=torch.float32), ids)
            self._tables = (cos[0].float().contiguous(), sin[0].float().contiguous())
        return self._tables

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None, start: int,
        buffers: list[tuple[torch.Tensor, torch.Tensor]], hidden: bool, logit_rows: int = 0, window: int = 0,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """One step: input ids and positions [1, R], mask [1, 1, R, W] (`runner.step_mask`),
        rows written at start..start+R-1 of the cache `buffers`; positions and mask None for a
        chain (each row after the cached rows and the new rows before it) over the first
        `window` cache rows, which the op builds as `step_mask` would. Returns (logits [1, R, V],
        or [1, logit_rows, V] of the last rows where `logit_rows` > 0, or where it is `NO_HEAD`
        the final-normed rows [1, R, E] for `head`; transformers' hidden states, each
        [1, R, E], with `hidden`, else None)."""
        ids = input_ids.view(-1)
        pos = self._no_positions if positions is None else positions.view(-1)
        if mask is None:
            mask = self._no_mask
        cos, sin = self.rope_tables(start + ids.shape[0])  # a row's position is at most start + its index
        # Another cache, or this one grown (new buffers): hand it over.
        if len(buffers) != len(self._cache) or any(k is not held for (k, _), held in zip(buffers, self._cache)):
            self.weights.set_cache([k for k, _ in buffers], [v for _, v in buffers])
            self._cache = [k for k, _ in buffers]
        states = torch.empty(self.layers + 1, ids.shape[0], self.hidden_size) if hidden else None
        logits = torch.ops.pardec_avx2.llama_step(self.weights, ids, cos, sin, pos, mask, start, states, logit_rows, window)
        return logits.unsqueeze(0), (None if states is None else tuple(s.unsqueeze(0) for s in states))

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        """The head's logits [n, V] of final-normed rows [n, E] (a `NO_HEAD` step's): the
        same bits as the step's own logits of those rows."""
        return torch.ops.pardec_avx2.llama_head(self.weights, normed)
