"""pardec's own kernels (`pardec_cli.kernels`) and the layers on them: int4
(`quant.Int4Records`) by bfloat16 activations (AVX512-BF16) and by int8 ones (``--weights
q4q8``, AVX512-VNNI); int8 (`quant.Int8Records`) and bfloat16 (`quant.BF16Records`) by
bfloat16 activations.

The kernels' tests build them once for the run (about 10-20 s) and are skipped on a CPU
without the instructions; the layout, the loading choices and the faults run everywhere.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pardec_cli import kernels, quant
from pardec_cli.errors import PardecUsageError
from pardec_cli.hardware import cpu_info
from pardec_cli.quant import (BF16Records, Int4Linear, Int4Records, Int8Linear, Int8Records, pack_pairs, pack_records,
                              share_products, unpack_records, use_records)
from tests.cli_helpers import invoke
from tests.test_exactness import random_prompt
from tests.test_quant import quantize_linears_on, tiny_gguf  # noqa: F401 (a fixture)
from tests.tiny_models import peaked, tiny_llama

BF16 = kernels.cpu_supported(cpu_info().flags, "bfloat16")
INT8 = kernels.cpu_supported(cpu_info().flags, "int8")
needs_bf16 = pytest.mark.skipif(not BF16, reason="this CPU lacks AVX512-BF16 (or torch runs below AVX512)")
needs_vnni = pytest.mark.skipif(not INT8, reason="this CPU lacks AVX512-VNNI (or torch runs below AVX512)")
KINDS = [pytest.param("bfloat16", marks=needs_bf16), pytest.param("int8", marks=needs_vnni)]
AMX = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


@pytest.fixture(scope="session")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kernels, built once for the test run and loaded into this process."""
    if not (BF16 or INT8):
        pytest.skip("this CPU lacks AVX512-BF16 and AVX512-VNNI")
    directory = kernels.build_dir(tmp_path_factory.mktemp("kernels"))
    kernels.build(directory)
    assert kernels.load(directory) and kernels.loaded()
    return directory


def codes(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3
    minimum = -8 * scale + torch.randn(n, k // 32, generator=g) * 1e-3
    return q, scale.half().float(), minimum.half().float()  # float16-exact, as the records keep them


def reference_q8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """q4q8's arithmetic in float64: x [M, K] to int8 per group of 32 (max-abs / 127,
    rounded half to even), integer dot products with the codes, then the scales."""
    m, k = x.shape
    xg = x.double().view(m, k // 32, 32)
    d = xg.abs().amax(-1) / 127  # [M, G]
    qx = torch.round(xg / torch.where(d > 0, d, 1)[..., None]).clamp(-128, 127)
    dots = torch.einsum("mgk,ngk->mng", qx, q.double().view(q.shape[0], k // 32, 32))  # [M, N, G]
    return (dots * d[:, None, :] * scale.double()[None] + minimum.double()[None] * xg.sum(-1)[:, None, :]).sum(-1)


# -------------------------------------------------------------- the layout


def test_records_pack_and_unpack_codes_scales_and_minimums() -> None:
    q, scale, minimum = codes(48, 96)
    blocks = pack_records(q, scale, minimum)
    assert blocks.shape == (3, 3, 320) and blocks.dtype == torch.uint8
    back = unpack_records(blocks, 48, 96)
    assert torch.equal(back[0], q) and torch.equal(back[1], scale) and torch.equal(back[2], minimum)
    # Byte 4i + b of a record's first chunk: output i's codes b (low nibble) and 4 + b (high).
    assert int(blocks[0, 0, 4 * 5 + 2]) == int(q[5, 2]) | int(q[5, 6]) << 4


def test_an_int4_layer_becomes_records_of_the_same_codes() -> None:
    weight = torch.randn(64, 96) * 0.05
    int4 = Int4Linear.from_weight(weight.bfloat16())
    layer = Int4Records.from_int4(int4, "bfloat16")
    assert layer is not None
    # The same weight, up to the float16 rounding of the minimum (int4 keeps scale and
    # zero in bfloat16; its dequantize also rounds to bfloat16).
    assert torch.allclose(layer.dequantize(), int4.dequantize(), atol=1e-3)
    step = layer.codes()[1].repeat_interleave(32, dim=1)  # [N, K]: each group's scale
    assert (weight - layer.dequantize()).abs().le(step / 2 + 2e-3).all()  # rounding to the nearest code


def test_layers_the_kernels_cannot_take_stay_on_torch_s() -> None:
    # groups of 64: not the records' 32 (torch packs whole blocks of 16 outputs, as records)
    assert Int4Records.from_int4(Int4Linear.from_weight(torch.randn(64, 128), group_size=64), "bfloat16") is None
    # 48 outputs: whole records, though not whole blocks of torch's packing (64 with AVX512):
    # their codes are read back through torch's kernel, the same codes either way.
    odd = Int4Linear.from_weight(torch.randn(48, 64).bfloat16())
    records = Int4Records.from_int4(odd, "bfloat16")
    assert records is not None and torch.equal(records.codes()[0], quant._codes_by_kernel(odd))
    assert torch.allclose(records.dequantize().float(), odd.dequantize().float(), atol=1e-2)  # up to bfloat16's rounding
    whole = Int4Linear.from_weight(torch.randn(128, 64))  # the kernel reads what the unpacking reads
    assert torch.equal(quant._codes_by_kernel(whole), quant._cpu_codes(whole.packed, 128, 64, quant.cpu_pack_block()))
    huge = Int4Linear.from_weight(torch.randn(64, 64) * 1e6)  # scales beyond float16
    assert Int4Records.from_int4(huge, "bfloat16") is None
    model = quantize_linears_on(tiny_llama(0, layers=1, hidden=32), "int4")
    # Every layer of whole records of 16 outputs goes to records, k/v (16 outputs) too.
    assert use_records(model, "int8") == 7 and quant.weights_label(model) == "q4q8"
    assert not any(isinstance(m, Int4Linear) for m in model.modules())
    assert quant.row_tile(model) == quant.RECORD_ROW_TILE  # no layer left on torch's tiles of 4
    with pytest.raises(ValueError, match="activations"):
        Int4Records(torch.zeros(1, 1, 320, dtype=torch.uint8), in_features=32, out_features=16, bias=None, activations="fp8")


# -------------------------------------------------------------- the kernel


@needs_vnni
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
def test_q4q8_computes_q4_1_by_q8_products(kernel_dir: Path, rows: int) -> None:
    q, scale, minimum = codes(64, 128, seed=rows)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    got = torch.ops.pardec_q4.q4q8_mm(x, pack_records(q, scale, minimum), 64)
    assert got.dtype == torch.float32 and got.shape == (rows, 64)
    assert torch.allclose(got.double(), reference_q8(x, q, scale, minimum), rtol=1e-5, atol=1e-5)
    half = torch.ops.pardec_q4.q4q8_mm(x.bfloat16(), pack_records(q, scale, minimum), 64)
    assert half.dtype == torch.bfloat16
    assert torch.allclose(half.float(), reference_q8(x.bfloat16().float(), q, scale, minimum).float(), rtol=1e-2, atol=1e-2)


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 6, 7, 20])
def test_q4bf16_multiplies_bfloat16_activations_by_the_dequantized_weight(kernel_dir: Path, rows: int) -> None:
    q, scale, minimum = codes(64, 128, seed=rows)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows)).bfloat16()
    got = torch.ops.pardec_q4.q4bf16_mm(x, pack_records(q, scale, minimum), 64)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 64)
    weight = (q.double().view(64, 4, 32) * scale.double()[..., None] + minimum.double()[..., None]).view(64, 128)
    exact = x.double() @ weight.t()
    # float32 sums, one bfloat16 rounding of the result: within half a bfloat16 step
    assert torch.allclose(got.double(), exact, rtol=2 ** -8, atol=1e-4)
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.pardec_q4.q4bf16_mm(x.float(), pack_records(q, scale, minimum), 64)
    # The layer, handed float32 (a model cast after loading), multiplies the dense weight.
    layer = Int4Records(pack_records(q, scale, minimum), in_features=128, out_features=64, bias=None, activations="bfloat16")
    assert torch.allclose(layer(x.float()).double(), exact, rtol=1e-5, atol=1e-5)


@needs_bf16
def test_q4bf16_gives_what_torch_s_int4_kernel_gives(kernel_dir: Path) -> None:
    int4 = Int4Linear.from_weight(torch.randn(192, 576).bfloat16() * 0.05)
    records = Int4Records.from_int4(int4, "bfloat16")
    x = torch.randn(5, 576).bfloat16()
    ours, theirs = records(x).float(), int4(x).float()
    assert (ours - theirs).norm() < 5e-3 * theirs.norm()  # bfloat16 roundings apart


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
def test_q8bf16_multiplies_bfloat16_activations_by_int8_codes_and_scales(kernel_dir: Path, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    q = torch.randint(-127, 128, (64, 96), generator=g, dtype=torch.int8)
    scales = torch.rand(64, generator=g) * 0.01 + 1e-3
    x = torch.randn(rows, 96, generator=g).bfloat16()
    got = torch.ops.pardec_q4.q8bf16_mm(x, pack_pairs(q), scales, 64)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 64)
    exact = (x.double() @ q.double().t()) * scales.double()
    # float32 sums, one bfloat16 rounding of the result
    assert torch.allclose(got.double(), exact, rtol=2 ** -8, atol=1e-4)
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.pardec_q4.q8bf16_mm(x.float(), pack_pairs(q), scales, 64)


@needs_bf16
def test_an_int8_layer_on_pardec_s_kernel_gives_what_torch_s_gives(kernel_dir: Path) -> None:
    torch_s = Int8Linear.from_weight(torch.randn(192, 576).bfloat16() * 0.05, torch.randn(192).bfloat16())
    ours = Int8Records.from_int8(torch_s)
    assert ours is not None and torch.equal(ours.codes(), torch_s.weight_int8)
    assert torch.equal(ours.dequantize(), torch_s.dequantize())
    for rows in (1, 5, 300):  # 300: a prefill's dense product
        x = torch.randn(rows, 576).bfloat16()
        assert (ours(x).float() - torch_s(x).float()).norm() < 5e-3 * torch_s(x).float().norm()  # bfloat16 roundings apart
    # Shapes the kernel cannot take stay on torch's: outputs in blocks of 16, inputs in 4s.
    assert Int8Records.from_int8(Int8Linear.from_weight(torch.randn(40, 64))) is None
    assert Int8Records.from_int8(Int8Linear.from_weight(torch.randn(32, 66))) is None


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
def test_bf16_mm_multiplies_bfloat16_weights_and_activations(kernel_dir: Path, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(64, 96, generator=g).bfloat16()
    x = torch.randn(rows, 96, generator=g).bfloat16()
    got = torch.ops.pardec_q4.bf16_mm(x, pack_pairs(weight), 64)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 64)
    assert torch.allclose(got.double(), x.double() @ weight.double().t(), rtol=2 ** -8, atol=1e-4)


@needs_bf16
def test_a_dense_layer_on_pardec_s_kernel_keeps_its_weight_and_bias(kernel_dir: Path) -> None:
    linear = torch.nn.Linear(576, 192).bfloat16()
    ours = BF16Records.from_linear(linear)
    assert ours is not None and torch.equal(ours.dequantize(), linear.weight)
    for rows in (1, 5, 300):  # 300: a prefill's dense product
        x = torch.randn(rows, 576).bfloat16()
        assert (ours(x).float() - linear(x).float()).norm() < 5e-3 * linear(x).float().norm()  # bfloat16 roundings apart
    together = ours(x[:9])
    assert all(torch.equal(ours(x[i : i + 1]), together[i : i + 1]) for i in range(9))  # each row alone
    assert BF16Records.from_linear(torch.nn.Linear(64, 40).bfloat16()) is None  # outputs in blocks of 16
    assert BF16Records.from_linear(torch.nn.Linear(64, 32)) is None  # float32 stays dense


@needs_bf16
def test_a_bfloat16_head_on_pardec_s_kernel_keeps_the_dense_weight_for_its_readers(kernel_dir: Path) -> None:
    model = tiny_llama(0, vocab=96, layers=1, hidden=32).bfloat16()
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's
    dense = model.lm_head
    assert quant.head_on_records(model)
    head = model.get_output_embeddings()
    assert isinstance(head, quant.BF16Head) and head.weight is dense.weight  # shared, not copied
    x = torch.randn(9, 32).bfloat16()
    together = head(x)
    assert (together.float() - dense(x).float()).norm() < 5e-3 * dense(x).float().norm()
    assert all(torch.equal(head(x[i : i + 1]), together[i : i + 1]) for i in range(9))  # each row's logits alone
    long = torch.randn(300, 32).bfloat16()  # a long prefill multiplies the dense weight
    assert torch.equal(head(long), dense(long))
    odd = tiny_llama(0, vocab=90, layers=1, hidden=32).bfloat16()  # 90 outputs: not whole blocks of 16
    assert not quant.head_on_records(odd) and isinstance(odd.get_output_embeddings(), torch.nn.Linear)
    assert not quant.head_on_records(tiny_llama(0, vocab=96, layers=1, hidden=32))  # float32


@needs_bf16
def test_an_int8_head_on_pardec_s_kernel_computes_each_row_s_logits_alone(kernel_dir: Path) -> None:
    model = tiny_llama(0, vocab=96, layers=1, hidden=32).bfloat16()
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's
    dense = model.lm_head
    assert quant.quantize_head(model, ours=True)
    head = model.get_output_embeddings()
    assert isinstance(head, quant.Int8RecordsHead) and head.weight is dense.weight  # shared, not copied
    x = torch.randn(9, 32).bfloat16()
    together = head(x)
    assert (together.float() - dense(x).float()).norm() < 0.02 * dense(x).float().norm()  # int8 weights
    assert all(torch.equal(head(x[i : i + 1]), together[i : i + 1]) for i in range(9))
    long = torch.randn(300, 32).bfloat16()  # a long prefill multiplies the dense weight
    assert torch.equal(head(long), dense(long))
    # Where the kernel cannot take the head (90 outputs), or without `ours`: Int8Head.
    odd = tiny_llama(0, vocab=90, layers=1, hidden=32).bfloat16()
    assert quant.quantize_head(odd, ours=True) and isinstance(odd.get_output_embeddings(), quant.Int8Head)
    plain = tiny_llama(0, vocab=96, layers=1, hidden=32).bfloat16()
    assert quant.quantize_head(plain) and isinstance(plain.get_output_embeddings(), quant.Int8Head)


@needs_bf16
def test_an_int8_row_s_product_does_not_depend_on_the_rows_beside_it(kernel_dir: Path) -> None:
    layer = Int8Records.from_int8(Int8Linear.from_weight(torch.randn(128, 64).bfloat16()))
    assert layer is not None
    x = torch.randn(21, 64).bfloat16()
    together = layer(x)
    for i in (0, 5, 7, 8, 20):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])


@pytest.mark.parametrize("activations", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_row_s_product_does_not_depend_on_the_rows_beside_it(kernel_dir: Path, activations: str, dtype: torch.dtype) -> None:
    if activations == "bfloat16" and dtype != torch.bfloat16:
        pytest.skip("q4bf16 takes bfloat16 activations")
    layer = Int4Records.from_int4(Int4Linear.from_weight(torch.randn(128, 64).to(dtype)), activations)
    x = torch.randn(21, 64).to(dtype)
    together = layer(x)
    for i in (0, 5, 6, 7, 8, 20):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])


def test_the_ops_split_their_work_over_torch_s_threads_with_the_same_result(kernel_dir: Path) -> None:
    # at::parallel_for is a header template: built without OpenMP it is a serial loop,
    # and the ops ran on one core (the library then calls no GOMP_parallel).
    assert b"GOMP_parallel" in (kernel_dir / f"{kernels.LIBRARY}.so").read_bytes()
    layer = Int4Records.from_int4(Int4Linear.from_weight(torch.randn(256, 64).bfloat16()), "bfloat16" if BF16 else "int8")
    x = torch.randn(3, 64).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = layer(x)
        torch.set_num_threads(2)
        assert torch.equal(layer(x), alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("op", [pytest.param("q4q8_mm", marks=needs_vnni), pytest.param("q4bf16_mm", marks=needs_bf16)])
def test_bad_shapes_are_errors_not_crashes(kernel_dir: Path, op: str) -> None:
    multiply = getattr(torch.ops.pardec_q4, op)
    blocks = pack_records(*codes(32, 64))
    with pytest.raises(RuntimeError, match="shapes do not match"):
        multiply(torch.randn(2, 96).bfloat16(), blocks, 32)
    with pytest.raises(RuntimeError, match="uint8"):
        multiply(torch.randn(2, 64).bfloat16(), blocks.float(), 32)
    assert multiply(torch.randn(0, 64).bfloat16(), blocks, 32).shape == (0, 32)


@needs_bf16
def test_bad_int8_shapes_are_errors_not_crashes(kernel_dir: Path) -> None:
    blocks, scales = pack_pairs(torch.zeros(32, 64, dtype=torch.int8)), torch.ones(32)
    multiply = torch.ops.pardec_q4.q8bf16_mm
    with pytest.raises(RuntimeError, match="shapes do not match"):
        multiply(torch.randn(2, 96).bfloat16(), blocks, scales, 32)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        multiply(torch.randn(2, 64).bfloat16(), blocks, torch.ones(16), 32)
    with pytest.raises(RuntimeError, match="int8"):
        multiply(torch.randn(2, 64).bfloat16(), blocks.float(), scales, 32)
    with pytest.raises(RuntimeError, match="float32"):
        multiply(torch.randn(2, 64).bfloat16(), blocks, scales.bfloat16(), 32)
    assert multiply(torch.randn(0, 64).bfloat16(), blocks, scales, 32).shape == (0, 32)


def records_model(activations: str, seed: int = 0, weights: str = "int4") -> torch.nn.Module:
    dtype = torch.bfloat16 if activations == "bfloat16" else torch.float32
    model = peaked(tiny_llama(seed, layers=2, hidden=128)).to(dtype)
    if weights != "full":  # as loading: full weights keep a dense head
        model = quantize_linears_on(model, weights)
    assert use_records(model, activations) == 2 * 7
    return model


RECORD_KINDS = [pytest.param("int4", "bfloat16", "q4bf16_mm", marks=needs_bf16),
                pytest.param("int4", "int8", "q4q8_mm", marks=needs_vnni),
                pytest.param("int8", "bfloat16", "q8bf16_mm", marks=needs_bf16),
                pytest.param("full", "bfloat16", "bf16_mm", marks=needs_bf16)]  # fmt: skip


def compiled_product_calls(model: torch.nn.Module, ids: torch.Tensor, op: object) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """Compile `model` (fullgraph) and run it on `ids`: per graph, the calls of `op` before
    and after `quant.merge_identical_products`, and the logits."""
    calls: list[tuple[int, int]] = []

    def counting(graph: torch.fx.Graph) -> None:
        count = lambda: sum(n.target is op for n in graph.nodes)  # noqa: E731
        before = count()
        quant.merge_identical_products(graph)
        calls.append((before, count()))

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, options={"post_grad_custom_pre_pass": counting})
    try:
        with torch.no_grad():
            return calls, compiled(ids).logits
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize(("weights", "activations", "op_name"), RECORD_KINDS)
def test_layers_of_one_input_share_records_and_compile_to_one_call_per_group(
    kernel_dir: Path, weights: str, activations: str, op_name: str
) -> None:
    model = records_model(activations, weights=weights)
    assert quant.kernel_suffix(model) == ("+pardec" if activations == "bfloat16" else "")  # learned step costs apart
    assert quant.weights_label(model) == (weights if activations == "bfloat16" else "q4q8")
    assert quant.row_tile(model) == quant.RECORD_ROW_TILE
    op = getattr(torch.ops.pardec_q4, op_name).default
    ids = torch.tensor([random_prompt(1, 12)])
    with torch.no_grad():
        before = model(ids).logits
        assert share_products(model, lambda: model(ids[:, :2], use_cache=False)) == 4
        after = model(ids).logits
    assert torch.equal(before, after)
    attention = model.model.layers[0].self_attn
    members = [attention.q_proj, attention.k_proj, attention.v_proj]
    assert [m.shared_columns for m in members] == [(0, 128), (128, 192), (192, 256)]
    assert all(m.blocks.untyped_storage().data_ptr() == members[0].shared_blocks.data_ptr() for m in members)
    if weights == "int8":  # the scales too: views of the group's, one copy
        assert all(m.scales.untyped_storage().data_ptr() == members[0].shared_scales.data_ptr() for m in members)
    calls, traced = compiled_product_calls(model, ids, op)
    assert calls == [(2 * 7, 2 * 4)]
    # Within 16-bit roundings; for int8 activations also: inductor's fused kernels round
    # differently in the last bits, and an activation on the edge between two int8 codes
    # then takes the other one.
    assert (traced.float() - after.float()).norm() < 0.02 * after.float().norm()



# ---------------------------------------------------------------- attention


def reference_attention(query, key, value, mask, scaling):
    """[B, H, R, D] queries over [B, H_kv, W, D] keys and values with an additive mask, in
    float64 -> [B, R, H, D]."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.double().repeat_interleave(groups, 1), value.double().repeat_interleave(groups, 1)
    weights = (query.double() @ key.transpose(2, 3) * scaling + mask.double()).softmax(-1)
    return (weights @ value).transpose(1, 2)


def attention_inputs(rows: int, heads: int, kv_heads: int, dim: int, width: int, seed: int = 0):
    """Queries of `rows` new tokens (the last rows of a `width`-key window, causal) over a
    cache 8 keys longer than the window (what the runner's windows look like)."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, rows, heads, dim, generator=g).bfloat16().transpose(1, 2)  # a transposed view, as in a model
    cache_k = torch.randn(1, kv_heads, width + 8, dim, generator=g).bfloat16()
    cache_v = torch.randn(1, kv_heads, width + 8, dim, generator=g).bfloat16()
    mask = torch.zeros(1, 1, rows, width)
    for r in range(rows):
        mask[0, 0, r, width - rows + r + 1 :] = torch.finfo(torch.float32).min
    return query, cache_k, cache_v, mask


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 9, 33])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 16), (2, 1, 48)])
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_attention_op_computes_softmax_attention(kernel_dir: Path, rows: int, heads: int, kv_heads: int, dim: int, mask_dtype) -> None:
    query, cache_k, cache_v, mask = attention_inputs(rows, heads, kv_heads, dim, width=70)
    key, value = cache_k[:, :, :70], cache_v[:, :, :70]  # windows of the cache: strided views
    got = torch.ops.pardec_q4.attention(query, key, value, mask.to(mask_dtype), dim**-0.5)
    expected = reference_attention(query, key, value, mask, dim**-0.5)
    assert got.shape == (1, rows, heads, dim) and got.dtype == torch.bfloat16
    assert (got.double() - expected).abs().max() < 0.01  # one bfloat16 rounding of values below 1


@needs_bf16
def test_an_attention_row_is_the_same_bits_alone_beside_other_rows_and_in_any_window(kernel_dir: Path) -> None:
    """What makes bfloat16 speculation exact: a token's attention output does not depend on
    the rows verified beside it nor on how far past its own keys the window reaches."""
    query, cache_k, cache_v, mask = attention_inputs(12, 9, 3, 64, width=100)
    together = torch.ops.pardec_q4.attention(query, cache_k[:, :, :100], cache_v[:, :, :100], mask, 0.125)
    for r in (0, 5, 11):
        seen = 100 - 12 + r + 1  # keys this row sees
        for width in sorted({seen, min(seen + 3, 108), min(seen + 16, 108), 108}):  # the cache holds 108 keys
            alone_mask = torch.full((1, 1, 1, width), torch.finfo(torch.float32).min)
            alone_mask[..., :seen] = 0
            alone = torch.ops.pardec_q4.attention(query[:, :, r : r + 1], cache_k[:, :, :width], cache_v[:, :, :width], alone_mask, 0.125)
            assert torch.equal(alone[0, 0], together[0, r]), (r, width)



@needs_bf16
def test_an_attention_row_is_the_same_bits_wherever_its_keys_sit_in_the_window(kernel_dir: Path) -> None:
    """A tree's row sees the cache and its ancestors, which sit at other slots than the same
    tokens of a chain (siblings between them, masked): the same keys in the same order give
    the same bits."""
    query, cache_k, cache_v, _ = attention_inputs(1, 9, 3, 64, width=60)
    sources = [*range(50), 56, 57, 58, 59]  # what the row sees: 50 cached keys, then 4 of its own
    chain = torch.ops.pardec_q4.attention(query, cache_k[:, :, sources], cache_v[:, :, sources], torch.zeros(1, 1, 1, 54), 0.125)
    # The same keys in a 64-key window: the last 4 at slots 50, 53, 57 and 58, the rest masked.
    tree_k, tree_v = torch.zeros(1, 3, 64, 64).bfloat16(), torch.zeros(1, 3, 64, 64).bfloat16()
    mask = torch.full((1, 1, 1, 64), torch.finfo(torch.float32).min)
    for slot, source in zip([*range(50), 50, 53, 57, 58], sources):
        tree_k[:, :, slot], tree_v[:, :, slot], mask[..., slot] = cache_k[:, :, source], cache_v[:, :, source], 0
    tree = torch.ops.pardec_q4.attention(query, tree_k, tree_v, mask, 0.125)
    assert torch.equal(tree, chain)

@needs_bf16
def test_bad_attention_inputs_are_errors_not_crashes(kernel_dir: Path) -> None:
    query, cache_k, cache_v, mask = attention_inputs(2, 4, 2, 32, width=20)
    key, value = cache_k[:, :, :20], cache_v[:, :, :20]
    attention = torch.ops.pardec_q4.attention
    with pytest.raises(RuntimeError, match="bfloat16"):
        attention(query.float(), key, value, mask, 0.1)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        attention(query, cache_k[:, :1, :20], value, mask, 0.1)  # 4 heads over 1 key head but 2 value heads
    with pytest.raises(RuntimeError, match="mask"):
        attention(query, key, value, mask[..., :19], 0.1)
    with pytest.raises(RuntimeError, match="mask"):
        attention(query, key, value, mask.double(), 0.1)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        attention(query[..., :24], key[..., :24], value[..., :24], mask, 0.1)  # head size not a multiple of 16


@needs_bf16
def test_kernel_attention_leaves_what_the_op_does_not_take_to_cpu_attention(kernel_dir: Path) -> None:
    from pardec_cli.engine.attention import MAX_ROWS, cpu_attention, kernel_attention

    class Module:
        head_dim, num_key_value_groups, training = 32, 2, False

    module = Module()
    query, cache_k, cache_v, mask = attention_inputs(MAX_ROWS + 1, 4, 2, 32, width=80)
    key, value = cache_k[:, :, :80], cache_v[:, :, :80]
    for args, kwargs in [((query, key, value, mask.bfloat16()), {}),  # a prefill longer than MAX_ROWS
                         ((query[:, :, :3], key, value, mask[:, :, :3]), {"softcap": 30.0})]:  # fmt: skip
        got, weights = kernel_attention(module, *args, **kwargs)
        assert torch.equal(got, cpu_attention(module, *args, **kwargs)[0]) and weights is None
    # No mask (transformers' causal skip): the rows are the window's last, causal.
    got, _ = kernel_attention(module, query[:, :, -3:], key, value, None)
    assert torch.equal(got, torch.ops.pardec_q4.attention(query[:, :, -3:], key, value, mask[:, :, -3:], 32**-0.5))
    got, _ = kernel_attention(module, query[:, :, -3:], key, value, mask[:, :, -3:])
    assert torch.equal(got, torch.ops.pardec_q4.attention(query[:, :, -3:], key, value, mask[:, :, -3:], 32**-0.5))


@needs_bf16
@pytest.mark.skipif(AMX, reason="with AMX the runner keeps transformers' attention (its bmm measured faster there)")
def test_a_bfloat16_model_on_pardec_s_kernels_gets_the_same_logits_in_every_compiled_step(kernel_dir: Path, tmp_path: Path) -> None:
    """On pardec's kernels (products, head and attention each computing a row alone) and
    with eager's roundings kept in the compiled steps, a token's logits are the same bits
    in the one-token step, a few rows' verify step and the wide one: bfloat16 speculation
    gives plain decoding's tokens, near-ties included (a flat random model has many)."""
    from pardec_cli.engine.attention import KERNEL_ATTENTION
    from pardec_cli.engine.cache import rollback_to
    from pardec_cli.engine.runner import DECODE, VERIFY, VERIFY_WIDE, CompiledLanguageModel, step_fingerprint
    from tests.test_runner import run_on

    model = tiny_llama(5, vocab=96, layers=2, hidden=64).bfloat16()
    plain_fingerprint = step_fingerprint(model)
    assert use_records(model, "bfloat16") == 2 * 7 and quant.head_on_records(model)
    runner = CompiledLanguageModel(model, step_dir=tmp_path)
    assert model.config._attn_implementation == KERNEL_ATTENTION and step_fingerprint(model) != plain_fingerprint
    prompt, tokens = random_prompt(5), random_prompt(6)[:12]
    with torch.inference_mode():
        cache = runner.new_cache(len(prompt) + 2 * len(tokens))
        runner.forward(prompt, cache, last_only=True)
        alone = torch.stack([runner.forward([token], cache)[-1] for token in tokens])
        for rows in (2, 8, 12):  # the verify graph, then the wide one
            rollback_to(cache, len(prompt))
            together = runner.forward(tokens[:rows], cache, parents=tuple(range(-1, rows - 2)))
            assert torch.equal(together, alone[:rows]), rows
    assert {kind for kind, state in runner.graph_states().items() if state.compile_seconds} == {DECODE, VERIFY, VERIFY_WIDE}
    plain, _ = run_on(runner, "vanilla", {}, prompt, max_new_tokens=48)
    for method, options in (("pld", {}), ("suffix+recycling", {}), ("suffix", {"max_nodes": 24})):
        tokens_, _ = run_on(runner, method, options, prompt, max_new_tokens=48)
        assert tokens_ == plain, method

# -------------------------------------------------------------- loading and building


@needs_bf16
def test_int4_in_bfloat16_takes_pardec_s_kernel_once_built_in_the_store(
    kernel_dir: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from pardec_cli.home import kernels_dir
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    path = import_gguf(tiny_gguf, "tiny-q")
    started: list[Path] = []
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: started.append(directory) or True)
    model, _ = load_model(path, dtype="bfloat16", device="cpu", weights="auto")
    # Not built in this store: torch's kernel now, and a build starts for the next run.
    assert isinstance(model.model.layers[0].self_attn.q_proj, Int4Linear)
    assert started == [kernels.build_dir(kernels_dir())]
    started[0].mkdir(parents=True)
    (started[0] / f"{kernels.LIBRARY}.so").symlink_to(kernel_dir / f"{kernels.LIBRARY}.so")
    for weights in ("auto", "int4"):
        model, _ = load_model(path, dtype="bfloat16", device="cpu", weights=weights)
        layer = model.model.layers[0].self_attn.q_proj
        assert isinstance(layer, Int4Records) and layer.activations == "bfloat16"
        assert isinstance(model.get_output_embeddings(), quant.Int8RecordsHead)
        assert quant.weights_label(model) == "int4"
    # int8 weights in bfloat16 too, their layers of one input sharing a call.
    model, _ = load_model(path, dtype="bfloat16", device="cpu", weights="int8")
    layer = model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, Int8Records) and layer.shared_columns is not None
    assert (quant.weights_label(model), quant.kernel_suffix(model)) == ("int8", "+pardec")
    # Full weights in bfloat16: dense layers on pardec's kernel where no AMX is, on oneDNN's packing where it is.
    model, _ = load_model(path, dtype="bfloat16", device="cpu", weights="full")
    layer = model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, BF16Records) and layer.shared_columns is not None
    assert isinstance(model.get_output_embeddings(), quant.BF16Head)
    assert (quant.weights_label(model), quant.kernel_suffix(model)) == ("full", "+pardec")
    monkeypatch.setattr(type(cpu_info()), "has_amx_bf16", property(lambda self: True))
    model, _ = load_model(path, dtype="bfloat16", device="cpu", weights="full")
    assert not any(isinstance(m, BF16Records) for m in model.modules())
    monkeypatch.undo()
    monkeypatch.setenv("PARDEC_KERNELS", "1")
    # float32 activations, or PARDEC_KERNELS=0: torch's kernels.
    for weights, torch_s in (("int4", Int4Linear), ("int8", Int8Linear)):
        float32, _ = load_model(path, dtype="float32", device="cpu", weights=weights)
        assert isinstance(float32.model.layers[0].self_attn.q_proj, torch_s)
    monkeypatch.setenv("PARDEC_KERNELS", "0")
    for weights, torch_s in (("int4", Int4Linear), ("int8", Int8Linear)):
        model, _ = load_model(path, dtype="bfloat16", device="cpu", weights=weights)
        assert isinstance(model.model.layers[0].self_attn.q_proj, torch_s)


@needs_vnni
def test_q4q8_is_asked_for_never_chosen_by_auto(kernel_dir: Path, tiny_gguf: Path) -> None:  # noqa: F811
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    path = import_gguf(tiny_gguf, "tiny-q")
    notices: list[str] = []
    model, _ = load_model(path, dtype="bfloat16", device="cpu", weights="q4q8", notice=notices.append)
    assert quant.weights_label(model) == "q4q8"
    layer = model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, Int4Records) and layer.activations == "int8"
    assert notices and "building pardec's int4 kernels" in notices[0]  # this store had not built them
    assert quant.weights_label(load_model(path, dtype="bfloat16", device="cpu", weights="auto")[0]) == "int4"


@needs_vnni
def test_asked_for_q4q8_loads_it_in_any_dtype(kernel_dir: Path, tiny_gguf: Path) -> None:  # noqa: F811
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    path = import_gguf(tiny_gguf, "tiny-q")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="q4q8")
    layer = model.model.layers[0].mlp.down_proj
    assert isinstance(layer, Int4Records)
    # Built from the GGUF's codes with its float16 scales and minimums: exactly its weight
    # (torch's kernel holds them rounded to the activations' dtype).
    full, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    assert torch.equal(layer.dequantize(), full.model.layers[0].mlp.down_proj.weight)


def without_q4q8_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU with neither AVX512-VNNI nor AVX2 (an old x86, or an ARM one)."""
    from pardec_cli import hardware

    monkeypatch.setattr(hardware, "cpu_info", lambda: hardware.CpuInfo("old", 2, frozenset({"sse4_2"})))


def test_q4q8_on_a_cpu_without_vnni_or_avx2_is_a_usage_error(tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    without_q4q8_instructions(monkeypatch)
    path = import_gguf(tiny_gguf, "tiny-q")
    with pytest.raises(PardecUsageError, match="AVX512-VNNI or AVX2"):
        load_model(path, dtype="bfloat16", device="cpu", weights="q4q8")


def test_the_weights_flag_takes_q4q8_and_says_why_it_cannot(tiny_cli_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_q4q8_instructions(monkeypatch)
    result = invoke(["gen", "-m", str(tiny_cli_model), "--weights", "q4q8", "-n", "2", "hi"])
    assert result.exit_code != 0
    assert "AVX512-VNNI or AVX2" in result.stderr and "Traceback" not in result.stderr


def test_a_build_that_waited_for_another_process_s_loads_its_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.cpp_extension as cpp

    def compiling(**kwargs: object) -> None:
        raise AssertionError("compiled again what another process had built")

    loads: list[Path] = []
    monkeypatch.setattr(kernels, "loaded", lambda library=None: False)
    monkeypatch.setattr(kernels, "load", lambda directory: loads.append(directory) or True)
    monkeypatch.setattr(cpp, "load", compiling)
    directory = kernels.build_dir(tmp_path)
    kernels.build(directory)  # the library there, built while this one waited for the lock
    assert loads == [directory]


def test_a_failed_build_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.cpp_extension as cpp

    def broken(**kwargs: object) -> None:
        raise RuntimeError("Error building extension 'pardec_q4q8': g++: not found")

    monkeypatch.setattr(kernels, "loaded", lambda library=None: False)
    monkeypatch.setattr(cpp, "load", broken)
    directory = kernels.build_dir(tmp_path)
    assert kernels.status(directory) == "not built"
    with pytest.raises(RuntimeError, match="g\\+\\+"):
        kernels.build(directory)
    assert kernels.status(directory).startswith("failed: RuntimeError: Error building extension")
    assert not kernels.load(directory)
    monkeypatch.setenv("PARDEC_KERNELS", "1")
    assert kernels.build_in_background(directory) is False  # not again in the background
    (directory / f"{kernels.LIBRARY}.so").write_bytes(b"")  # a later build that worked
    (directory / kernels.FAILED).unlink()
    assert kernels.status(directory) == "built"


def test_a_background_build_starts_once_and_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    started: list[list[str]] = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, **kwargs: started.append(args))
    directory = kernels.build_dir(tmp_path)
    monkeypatch.setenv("PARDEC_KERNELS", "0")
    assert kernels.build_in_background(directory) is False and started == []
    monkeypatch.setenv("PARDEC_KERNELS", "1")
    assert kernels.build_in_background(directory) is True
    assert started[0][1:] == ["-m", "pardec_cli.kernels", str(directory)]
    (directory / f"{kernels.LIBRARY}.so").write_bytes(b"")
    assert kernels.build_in_background(directory) is False and kernels.status(directory) == "built"
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert kernels.build_in_background(blocked / "int4-x") is False  # a store it cannot write: no build, no error


def test_a_library_that_does_not_load_is_removed_to_be_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "loaded", lambda library=None: False)
    directory = kernels.build_dir(tmp_path)
    directory.mkdir(parents=True)
    (directory / f"{kernels.LIBRARY}.so").write_bytes(b"not a shared library")
    assert kernels.status(directory) == "built"
    assert kernels.load(directory) is False
    assert kernels.status(directory) == "not built"


def test_the_build_directory_follows_the_source_and_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kernels.build_dir(tmp_path)
    assert kernels.torch_version() == torch.__version__
    monkeypatch.setattr(kernels, "torch_version", lambda: "0.0.0+other")
    assert kernels.build_dir(tmp_path) != first and kernels.build_dir(tmp_path).parent == tmp_path


def test_a_cpu_capped_below_avx512_does_not_run_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    flags = frozenset({*kernels.BASE_FLAGS, "avx512_bf16", "avx512_vnni"})
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert kernels.cpu_supported(flags, "bfloat16") and kernels.cpu_supported(flags, "int8")
    assert not kernels.cpu_supported(flags - {"avx512_bf16"}, "bfloat16")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert not kernels.cpu_supported(flags, "bfloat16")


def test_doctor_says_which_int4_kernels_run_and_why() -> None:
    from pardec_cli.cli.doctor import _kernels_lines

    def line(**k: object) -> str:
        return _kernels_lines({"dir": "/home/k/int4-abc", "enabled": True, "bfloat16": True, "int8": True,
                               "float32": False, **k})[0]  # fmt: skip

    assert line(status="built").startswith("pardec's, built in /home/k/int4-abc")
    assert "in the background" in line(status="not built")
    assert "failed: RuntimeError: g++" in line(status="failed: RuntimeError: g++")
    assert "PARDEC_KERNELS=0" in line(enabled=False, status="built")
    assert "lacks AVX2" in line(bfloat16=False, int8=False, status="not built")
    assert line(bfloat16=False, status="built").endswith(": --weights q4q8 in bfloat16")


def test_the_detached_build_runs_at_the_lowest_priority(tmp_path: Path) -> None:
    # In a child process of its own session, as `build_in_background` starts it: lowering a
    # priority cannot be undone, and Linux weighs a session's processes as one group.
    autogroup = Path("/proc/self/autogroup")  # Linux's, where it has them
    ours = autogroup.read_text() if autogroup.exists() else None
    code = ("import os, sys, pardec_cli.kernels as k\n"
            "from pathlib import Path\n"
            "group = Path('/proc/self/autogroup')\n"
            "k.build = lambda d: print(os.nice(0), group.read_text().split()[-1] if group.exists() else '-', d)\n"
            "k.background_main(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                          start_new_session=True)
    assert done.stdout.split() == ["19", "-" if ours is None else "19", str(tmp_path)]
    assert (autogroup.read_text() if ours is not None else None) == ours  # the tests' own session keeps its weight


def test_waiting_for_a_build_ends_when_it_is_built_failed_or_too_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library counts as built once its file is there and the builder let go of its lock
    (the linker writes the file first); a failed build ends the wait at once."""
    from filelock import FileLock

    directory = kernels.build_dir(tmp_path)
    directory.mkdir(parents=True)
    assert kernels.wait_for_build(directory, 0.3, poll_s=0.05) is False  # nothing comes: the wait ends
    library = directory / f"{kernels.LIBRARY}.so"
    with FileLock(str(directory / ".build.lock")):
        library.write_bytes(b"")  # the linker's half-written file
        assert kernels.wait_for_build(directory, 0.2, poll_s=0.05) is False
    assert kernels.wait_for_build(directory, 0.2, poll_s=0.05) is True
    library.unlink()
    (directory / kernels.FAILED).write_text("RuntimeError: g++: not found\n")
    sleeps: list[float] = []
    monkeypatch.setattr(kernels.time, "sleep", sleeps.append)
    assert kernels.wait_for_build(directory, 60.0) is False and sleeps == []
