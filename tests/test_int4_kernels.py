"""pardec's own kernels (`pardec_cli.kernels`) and the layers on them: int4
(`quant.Int4Records`) by bfloat16 activations (AVX512-BF16) and by int8 ones (``--weights
q4q8``, AVX512-VNNI); int8 (`quant.Int8Records`) and bfloat16 (`quant.BF16Records`) by
bfloat16 activations.

The kernels' tests build them once for the run (about 10-20 s) and are skipped on a CPU
without the instructions; the layout, the loading choices and the faults run everywhere.
"""

from __future__ import annotations

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
    # 48 outputs: whole records of 16, but not whole blocks of torch's int4 packing to unpack
    assert Int4Records.from_int4(Int4Linear.from_weight(torch.randn(48, 64)), "bfloat16") is None
    assert Int4Records.from_int4(Int4Linear.from_weight(torch.randn(64, 128), group_size=64), "bfloat16") is None
    huge = Int4Linear.from_weight(torch.randn(64, 64) * 1e6)  # scales beyond float16
    assert Int4Records.from_int4(huge, "bfloat16") is None
    model = quantize_linears_on(tiny_llama(0, layers=1, hidden=32), "int4")
    assert use_records(model, "int8") == 2 and quant.weights_label(model) == "q4q8"  # gate/up: 64 outputs
    assert isinstance(model.model.layers[0].self_attn.k_proj, Int4Linear)
    assert quant.row_tile(model) == quant.CPU_INT4_ROW_TILE  # the slowest layer's tiles count
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
            traced = compiled(ids).logits
    finally:
        torch._dynamo.reset()
    assert calls == [(2 * 7, 2 * 4)]
    # Within 16-bit roundings; for int8 activations also: inductor's fused kernels round
    # differently in the last bits, and an activation on the edge between two int8 codes
    # then takes the other one.
    assert (traced.float() - after.float()).norm() < 0.02 * after.float().norm()


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


def test_q4q8_on_a_cpu_without_vnni_is_a_usage_error(tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    monkeypatch.setattr(kernels, "cpu_supported", lambda flags, activations: False)
    path = import_gguf(tiny_gguf, "tiny-q")
    with pytest.raises(PardecUsageError, match="AVX512-VNNI"):
        load_model(path, dtype="bfloat16", device="cpu", weights="q4q8")


def test_the_weights_flag_takes_q4q8_and_says_why_it_cannot(tiny_cli_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "cpu_supported", lambda flags, activations: False)
    result = invoke(["gen", "-m", str(tiny_cli_model), "--weights", "q4q8", "-n", "2", "hi"])
    assert result.exit_code != 0
    assert "AVX512-VNNI" in result.stderr and "Traceback" not in result.stderr


def test_a_build_that_waited_for_another_process_s_loads_its_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.cpp_extension as cpp

    def compiling(**kwargs: object) -> None:
        raise AssertionError("compiled again what another process had built")

    loads: list[Path] = []
    monkeypatch.setattr(kernels, "loaded", lambda: False)
    monkeypatch.setattr(kernels, "load", lambda directory: loads.append(directory) or True)
    monkeypatch.setattr(cpp, "load", compiling)
    directory = kernels.build_dir(tmp_path)
    kernels.build(directory)  # the library there, built while this one waited for the lock
    assert loads == [directory]


def test_a_failed_build_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.cpp_extension as cpp

    def broken(**kwargs: object) -> None:
        raise RuntimeError("Error building extension 'pardec_q4q8': g++: not found")

    monkeypatch.setattr(kernels, "loaded", lambda: False)
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
    monkeypatch.setattr(kernels, "loaded", lambda: False)
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
    from pardec_cli.cli.doctor import _kernels_line

    base = {"dir": "/home/k/int4-abc", "enabled": True, "bfloat16": True, "int8": True}
    assert _kernels_line({**base, "status": "built"}).startswith("pardec's, built in /home/k/int4-abc")
    assert "in the background" in _kernels_line({**base, "status": "not built"})
    assert "failed: RuntimeError: g++" in _kernels_line({**base, "status": "failed: RuntimeError: g++"})
    assert "PARDEC_KERNELS=0" in _kernels_line({**base, "enabled": False, "status": "built"})
    assert "lacks AVX512-BF16" in _kernels_line({**base, "bfloat16": False, "int8": False, "status": "not built"})
    assert _kernels_line({**base, "bfloat16": False, "status": "built"}).endswith(": --weights q4q8")
