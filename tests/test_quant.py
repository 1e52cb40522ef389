"""Quantized weights: int8/int4 Linear layers, `--weights`, and GGUF blocks kept in the store.

- A quantized Linear multiplies by exactly the weight it reports (`dequantize`), and
  that weight is close to the dense one it came from.
- The quantized model runs eagerly and under torch.compile with the same logits.
- On the same quantized weights in float32, every method's greedy output equals
  vanilla's, token for token.
- `pardec import` keeps a Q4_1/Q8_0 GGUF quantized (small on disk) and loads it to
  exactly the values GGUF's own dequantization gives.
- `--weights` reaches the model, shows in --stats, and a bad value is one clear line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pardec_cli import quant
from pardec_cli.errors import ModelLoadError, PardecUsageError
from pardec_cli.hardware import cpu_info
from pardec_cli.quant import (
    DENSE_FROM_ROWS, Int4Linear, Int8Head, Int8Linear, cpu_pack_block, merge_identical_products, quantize_head,
    quantize_linears, share_products, weights_label,
)
from pardec_cli.weight_modes import resolve_weights
from tests.cli_helpers import invoke
from tests.test_exactness import random_prompt, run
from tests.tiny_models import peaked, tiny_llama

DTYPES = [torch.float32, torch.bfloat16]


# ------------------------------------------------------------------ the layers


def test_a_head_s_smoothed_codes_are_quantized_in_slices_with_each_row_s_own_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """`smoothed_int8` works through a head a few rows at a time: the codes, scales and
    smoothing are those of the whole-matrix definition, bit for bit, a ragged last slice
    and a bfloat16 weight included."""
    monkeypatch.setattr(quant, "SMOOTH_ROWS", 7)
    torch.manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        weight = (torch.randn(40, 32) * torch.linspace(0.1, 3.0, 32)).to(dtype)  # columns of different ranges
        w = weight.float()
        smooth = w.abs().amax(dim=0).clamp(min=1e-12).sqrt()
        rows = quant.Int8Linear.from_weight(w / smooth)
        codes, scales, got_smooth = quant.smoothed_int8(weight)
        assert torch.equal(got_smooth, smooth) and torch.equal(codes, rows.weight_int8) and torch.equal(scales, rows.scales)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make", [Int8Linear.from_weight, Int4Linear.from_weight], ids=["int8", "int4"])
def test_a_quantized_linear_multiplies_by_its_dequantized_weight(make, dtype) -> None:
    torch.manual_seed(0)
    dense = nn.Linear(128, 96, bias=True)
    layer = make(dense.weight.to(dtype), dense.bias.to(dtype))
    x = torch.randn(3, 5, 128).to(dtype)  # [batch, tokens, in]
    y = layer(x)
    assert y.shape == (3, 5, 96) and y.dtype == dtype
    reference = x.float() @ layer.dequantize().t() + dense.bias.to(dtype).float()
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert (y.float() - reference).abs().max().item() < tolerance * reference.abs().max().item() + 1e-4
    # ... and the quantized weight is within half a quantization step of the dense one
    # (a step is max|w| / 127 for int8, at most 2 max|w| / 15 for int4), plus the
    # rounding of bfloat16 scales.
    given = dense.weight.to(dtype).float()
    error = (layer.dequantize() - given).abs().max().item()
    step = given.abs().max().item() * (1 / 127 if make == Int8Linear.from_weight else 2 / 15)
    assert error <= step * (0.51 if dtype == torch.float32 else 0.8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_on_cuda_multiplies_in_torch_ops_as_the_packed_op_does(dtype) -> None:
    # On CUDA, Int8Linear converts its codes in torch ops (`dequant_int8_mm`, which compiles
    # into one reduction per one-row product) instead of `_weight_int8pack_mm`: the same
    # product, scaled after the sum, as the packed op computes it here on the CPU.
    torch.manual_seed(0)
    layer = Int8Linear.from_weight(torch.randn(96, 128).to(dtype))
    assert (layer.weight_int8.to(torch.bfloat16).float() == layer.weight_int8.float()).all()  # codes exact in bf16
    for rows in (1, 4, 17):
        x = torch.randn(rows, 128).to(dtype)
        ours = quant.dequant_int8_mm(x, layer.weight_int8, layer.scales)
        packed = torch.ops.aten._weight_int8pack_mm(x, layer.weight_int8, layer.scales)
        assert ours.shape == (rows, 96) and ours.dtype == dtype
        tolerance = 1e-5 if dtype == torch.float32 else 0.02
        assert (ours.float() - packed.float()).abs().max().item() <= tolerance * packed.float().abs().max().item()


def test_the_cpu_int4_layout_is_found_and_unpacks_to_exactly_the_kernel_s_weight() -> None:
    assert cpu_pack_block() is not None, "torch's CPU int4 packing changed layout: prefills lose the dense path"
    torch.manual_seed(0)
    layer = Int4Linear.from_weight(torch.randn(256, 96), group_size=32)
    assert torch.allclose(layer.unpacked(), layer.dequantize(), atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make", [Int8Linear.from_weight, Int4Linear.from_weight], ids=["int8", "int4"])
def test_a_long_prefill_runs_a_dense_gemm_on_the_same_weight(make, dtype) -> None:
    # From DENSE_FROM_ROWS rows the packed kernel is skipped (slow at many rows); fewer
    # rows, as in every decoding and verifying step, keep it. Same weight either way.
    torch.manual_seed(0)
    layer = make(torch.randn(128, 96).to(dtype), None)
    x = torch.randn(DENSE_FROM_ROWS, 96).to(dtype)
    reference = x.float() @ layer.dequantize().t()
    tolerance = 1e-5 if dtype == torch.float32 else 0.02
    scale = reference.abs().max().item()
    assert (layer(x).float() - reference).abs().max().item() < tolerance * scale
    assert (layer(x[:64]).float() - reference[:64]).abs().max().item() < tolerance * scale


def test_a_long_int4_prefill_does_not_call_the_packed_kernel(monkeypatch) -> None:
    layer = Int4Linear.from_weight(torch.randn(128, 96), group_size=32)

    def packed_kernel(x2d):
        raise AssertionError(f"the int4 kernel ran on {x2d.shape[0]} rows")

    monkeypatch.setattr(layer, "_matmul", packed_kernel)
    assert layer(torch.randn(DENSE_FROM_ROWS, 96)).shape == (DENSE_FROM_ROWS, 128)
    with pytest.raises(AssertionError, match="64 rows"):
        layer(torch.randn(64, 96))


def shared_int4_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A tiny Llama whose projections are whole blocks of the CPU packing (k and v: 64
    outputs), on int4 with q/k/v and gate/up sharing their packed weights."""
    model = quantize_linears_on(peaked(tiny_llama(seed, layers=2, hidden=128)).to(dtype), "int4")
    groups = share_products(model, lambda: model(torch.tensor([[3, 4]]), use_cache=False))
    assert groups == 2 * 2  # per layer: q/k/v and gate/up; o and down multiply other inputs
    return model


def test_layers_of_one_input_share_a_packed_weight_and_each_keeps_its_own_output() -> None:
    model = quantize_linears_on(peaked(tiny_llama(0, layers=2, hidden=128)), "int4")
    ids = torch.tensor([random_prompt(0, 12)])
    from pardec_cli.doctor import weight_bytes

    read = weight_bytes(model)
    with torch.no_grad():
        before = model(ids).logits
        assert share_products(model, lambda: model(ids[:, :2], use_cache=False)) == 4
        after = model(ids).logits
    assert torch.equal(before, after)  # eagerly each member multiplies its own rows, bit for bit
    attention = model.model.layers[0].self_attn
    members = [attention.q_proj, attention.k_proj, attention.v_proj]
    assert [m.shared_columns for m in members] == [(0, 128), (128, 192), (192, 256)]
    # The codes are views into the group's (not copied); each keeps its own scales for eager calls.
    assert all(m.packed.untyped_storage().data_ptr() == members[0].shared_packed.data_ptr() for m in members)
    assert all(m.shared_scales is members[0].shared_scales and m.scales_and_zeros.is_contiguous() for m in members)
    assert model.model.layers[0].self_attn.o_proj.shared_columns is None
    assert model.model.layers[0].mlp.down_proj.shared_columns is None
    assert weight_bytes(model) == read  # what a step reads: the group's codes and scales, no copy twice


def test_a_compiled_step_makes_one_int4_call_per_group_and_gives_the_eager_logits() -> None:
    model = shared_int4_model()
    calls: list[tuple[int, int]] = []

    def counting(graph: torch.fx.Graph) -> None:
        count = lambda: sum(n.target is torch.ops.aten._weight_int4pack_mm_for_cpu.default for n in graph.nodes)  # noqa: E731
        before = count()
        merge_identical_products(graph)
        calls.append((before, count()))

    ids = torch.tensor([random_prompt(1, 12)])
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, options={"post_grad_custom_pre_pass": counting})
    try:
        with torch.no_grad():
            eager, traced = model(ids).logits, compiled(ids).logits
    finally:  # dynamo's state of this model's frames must not reach a later test's aot_compile
        torch._dynamo.reset()
    assert calls == [(2 * 7, 2 * 4)]  # 7 layers' calls per decoder layer became 4
    assert torch.allclose(eager, traced, atol=1e-4)


def test_a_model_the_probe_cannot_run_keeps_its_layers_apart() -> None:
    model = quantize_linears_on(tiny_llama(0, layers=2, hidden=128), "int4")

    def broken() -> None:
        raise RuntimeError("this architecture wants other inputs")

    assert share_products(model, broken) == 0
    assert all(getattr(m, "shared_columns", None) is None for m in model.modules())
    assert not any(name.endswith("shared_packed") for name, _ in model.named_buffers())


def test_a_model_without_int4_layers_is_not_probed() -> None:
    model = quantize_linears_on(tiny_llama(0, layers=2, hidden=128), "int8")

    def probe() -> None:
        raise AssertionError("a forward ran where no layer could share")

    assert share_products(model, probe) == 0


def test_layers_that_are_not_whole_blocks_of_the_packing_stay_apart() -> None:
    model = quantize_linears_on(tiny_llama(0, layers=2, hidden=32), "int4")  # k and v: 16 outputs; gate and up: 64
    assert share_products(model, lambda: model(torch.tensor([[3, 4]]), use_cache=False)) == 2  # gate/up per layer
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.shared_columns is None and layer.mlp.up_proj.shared_columns == (64, 128)


def test_int4_from_codes_follows_gguf_q4_1_arithmetic() -> None:
    """w = q * d + m (GGUF Q4_1) with torch's (q - 8) * scale + zero: zero = m + 8 d."""
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (64, 96), generator=g, dtype=torch.uint8)
    d = (torch.rand(64, 3, generator=g) * 0.01).half()
    m = (torch.randn(64, 3, generator=g) * 0.05).half()
    layer = Int4Linear.from_codes(q, d, m, group_size=32, dtype=torch.float32)
    expected = q.float() * d.float().repeat_interleave(32, 1) + m.float().repeat_interleave(32, 1)
    assert torch.allclose(layer.dequantize(), expected, atol=1e-6)


def test_quantize_linears_keeps_the_head_and_embedding_dense() -> None:
    model = tiny_llama(layers=2)
    replaced = quantize_linears(model, "int8")
    assert replaced == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert isinstance(model.lm_head, nn.Linear) and isinstance(model.get_output_embeddings().weight, torch.Tensor)
    assert weights_label(model) == "int8"
    assert quantize_linears(tiny_llama(layers=1), "full") == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_int8_head_keeps_the_dense_tied_weight_for_readers_and_close_logits(dtype) -> None:
    model = tiny_llama(layers=1, hidden=64).to(dtype)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's
    dense_weight = model.get_output_embeddings().weight
    ids = torch.tensor([random_prompt(0, 12)])
    with torch.no_grad():
        before = model(ids).logits.float()
        assert quantize_head(model) and isinstance(model.get_output_embeddings(), Int8Head)
        after = model(ids).logits.float()
    head = model.get_output_embeddings()
    assert isinstance(head, Int8Head)
    # Readers of .weight (Medusa, EAGLE, layer-skip, head training) still get the exact tied matrix.
    assert head.weight is dense_weight is model.model.embed_tokens.weight
    assert not torch.equal(before, after)  # the logits really come from the int8 copy
    assert (after - before).norm() < 0.02 * before.norm()
    assert not isinstance(tiny_llama(layers=1).get_output_embeddings(), Int8Head)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_int8_head_gives_a_row_the_same_logits_whatever_the_rows_beside_it(dtype) -> None:
    """Integer products are exact: a decode step (1 row) and a verification (many rows)
    compute one function, bit for bit, which a dense 16-bit GEMM does not promise."""
    head = Int8Head(nn.Linear(64, 1000, bias=False).to(dtype))
    x = torch.randn(33, 64, generator=torch.Generator().manual_seed(0)).to(dtype) * 3
    with torch.no_grad():
        together = head(x)
        for rows in (1, 2, 7, 16):
            assert torch.equal(head(x[:rows]), together[:rows])
        assert all(torch.equal(head(x[i : i + 1])[0], together[i]) for i in range(33))


@pytest.mark.parametrize("x_zero_point", [0, 128], ids=["signed", "unsigned"])
def test_the_int8_heads_prepacked_kernel_computes_what_int_mm_does(x_zero_point) -> None:
    """oneDNN's prepacked int8 matmul (where this torch has it, fast or not on this CPU),
    with signed activations or shifted into uint8 with zero point 128, and torch._int_mm
    are kernels for one function: integer products, bit for bit. Without VNNI (AVX2) its
    pairwise 16-bit sums saturate: there the head never takes it."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (1000, 64), dtype=torch.int8, generator=generator)
    scales = torch.rand(1000, generator=generator)
    x = torch.randint(-127, 128, (20, 64), dtype=torch.int8, generator=generator)
    packed = torch.ops.onednn.qlinear_prepack(codes, None)
    activations = quant._as_uint8(x) if x_zero_point else x
    got = quant.onednn_int8_mm(activations, packed, scales, torch.zeros((), dtype=torch.long), x_zero_point)
    if not {"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_info().flags:
        assert not torch.equal(got, quant.int_mm_scaled(x, codes, scales))
        assert quant.onednn_int8_packed(codes, scales, timed=False) is None
        return
    assert torch.equal(got, quant.int_mm_scaled(x, codes, scales))


def test_the_int8_head_takes_the_prepacked_kernel_where_it_is_faster_and_gives_the_same_logits() -> None:
    """oneDNN has no fast signed-int8 kernel on some CPUs (~80x slower than _int_mm on an
    AMD EPYC without AMX): by default the head times both once and keeps the faster;
    either way the logits are the same."""
    dense = nn.Linear(64, 1000, bias=False).to(torch.bfloat16)
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16) * 3
    plain, chosen, packed = Int8Head(dense, prepack=False), Int8Head(dense), Int8Head(dense, prepack=True)
    assert plain.kernel == "_int_mm"
    if packed.kernel == "_int_mm":
        pytest.skip("oneDNN's int8 matmul is not available in this torch")
    assert packed.kernel == "oneDNN prepacked, u8"  # VNNI's native form, unless timed
    assert not any("packed" in name for name in packed.state_dict())  # an opaque copy, rebuilt at every load
    with torch.no_grad():
        assert torch.equal(packed(x), plain(x))
        assert torch.equal(chosen(x), plain(x))


def test_a_head_that_is_not_an_nn_linear_stays_as_it_is() -> None:
    model = tiny_llama(layers=1)
    model.lm_head = nn.Identity()
    assert not quantize_head(model)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantized_model_compiles_without_graph_breaks_and_matches_eager(mode) -> None:
    model = quantize_linears_on(tiny_llama(layers=2, hidden=64), mode)
    ids = torch.tensor([random_prompt(0, 12)])
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(ids)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(model, backend="inductor")
    with torch.no_grad():
        eager, traced = model(ids).logits, compiled(ids).logits
    assert torch.allclose(eager, traced, atol=1e-4)


def quantize_linears_on(model: nn.Module, mode: str) -> nn.Module:
    """What loading does with quantized weights on a CPU: decoder layers and the head."""
    quantize_linears(model, mode)
    quantize_head(model)
    return model


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("method", ["pld", "suffix", "recycling"])
def test_greedy_methods_equal_vanilla_on_the_same_quantized_weights(mode, method) -> None:
    for seed in (0, 1):
        target = quantize_linears_on(peaked(tiny_llama(seed)), mode)
        prompt = random_prompt(seed) * 2  # repeats give the lookup methods something to draft
        vanilla, _ = run("vanilla", {}, target, prompt, max_new_tokens=40)
        tokens, _ = run(method, {}, target, prompt, max_new_tokens=40)
        assert tokens == vanilla


def test_weights_modes_resolve_and_a_bad_one_is_a_usage_error() -> None:
    assert resolve_weights("int4", dtype="float32", device="cpu", stored=None) == "int4"
    assert resolve_weights("auto", dtype="bfloat16", device="cuda", stored=None) == "full"
    # auto: the measured table (4-bit blocks run as int4 in bfloat16; dense stays dense)
    assert resolve_weights("auto", dtype="bfloat16", device="cpu", stored="q4") == "int4"
    assert resolve_weights("auto", dtype="bfloat16", device="cpu", stored=None) == "full"
    assert resolve_weights("auto", dtype="float32", device="cpu", stored="q4") == "full"
    # where float32 runs on pardec's AVX2 kernels: 4-bit blocks as q4q8, dense layers as q8q8
    # (llama.cpp's arithmetic for Q4_1 and Q8_0 weights), both on the native step
    assert resolve_weights("auto", dtype="float32", device="cpu", stored="q4", avx2=True) == "q4q8"
    assert resolve_weights("auto", dtype="float32", device="cpu", stored=None, avx2=True) == "q8q8"
    assert resolve_weights("q8q8", dtype="float32", device="cpu", stored="q4") == "q8q8"
    assert resolve_weights("auto", dtype="bfloat16", device="cpu", stored="q4", avx2=True) == "int4"
    assert resolve_weights("auto", dtype="float32", device="cuda", stored="q4", avx2=True) == "full"
    assert resolve_weights("full", dtype="float32", device="cpu", stored="q4", avx2=True) == "full"
    with pytest.raises(PardecUsageError, match="--weights"):
        resolve_weights("int3", dtype="float32", device="cpu", stored=None)


# ------------------------------------------------------------- GGUF kept quantized


TOKENS = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("!"), ord("!") + 93)]  # 96 tokens


def write_tiny_gguf(path: Path, *, hidden: int = 64, layers: int = 2, linears: str = "Q4_1",
                    types: dict[str, str] | None = None, alignment: int | None = None) -> dict[str, np.ndarray]:
    """A tiny llama GGUF (Q4_1 linears, or `linears` another GGUF type's name; `types` maps
    some of them, by GGUF name in the layer ("ffn_down", "attn_v"), to other types, as Q4_K_M
    files mix in Q6_K; Q8_0 embedding, F32 norms); returns
    the float weights written, by GGUF name, before quantization (K-quants: as ggml
    dequantizes them)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    if alignment is not None:  # the data's alignment (general.alignment), 32 when not given
        writer.add_custom_alignment(alignment)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(hidden * 2)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(TOKENS))
    writer.add_token_types([2, 3, 3] + [1] * (len(TOKENS) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    written: dict[str, np.ndarray] = {}

    def add(name: str, shape: tuple[int, ...], kind: T) -> None:
        w = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        written[name] = w
        if kind == T.F32:
            writer.add_tensor(name, w)
        elif kind in (T.Q4_K, T.Q6_K):  # gguf cannot quantize K-quants: random codes and scales
            size, scales = {T.Q4_K: (144, slice(0, 4)), T.Q6_K: (210, slice(208, 210))}[kind]
            blocks = rng.integers(0, 256, (shape[0], shape[1] // 256, size), dtype=np.uint8)
            blocks[..., scales] = np.array([0.0013, 0.0007][: (scales.stop - scales.start) // 2],
                                           dtype=np.float16).view(np.uint8)  # d (and Q4_K's dmin)
            q = blocks.reshape(shape[0], -1)
            written[name] = gguf.quants.dequantize(q, kind).reshape(shape)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=kind)
        else:
            q = gguf.quants.quantize(w, kind)  # uint8 [rows, bytes per row]
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=kind)

    kv = hidden // 2  # 2 of 4 heads
    add("token_embd.weight", (len(TOKENS), hidden), T.Q8_0)
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,), T.F32)
        add(f"blk.{i}.ffn_norm.weight", (hidden,), T.F32)
        for name, shape in [("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (2 * hidden, hidden)),
                            ("ffn_up", (2 * hidden, hidden)), ("ffn_down", (hidden, 2 * hidden))]:  # fmt: skip
            add(f"blk.{i}.{name}.weight", shape, getattr(T, (types or {}).get(name, linears)))
    add("output_norm.weight", (hidden,), T.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    write_tiny_gguf(path)
    return path


def test_import_keeps_q4_and_q8_blocks_and_stays_small(tiny_gguf: Path) -> None:
    from gguf import GGUFReader

    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.layout import read_marker

    path = import_gguf(tiny_gguf, "tiny-q")
    layout = json.loads((path / "pardec-quant.json").read_text())["tensors"]
    assert layout["model.embed_tokens.weight"] == "q8"
    assert layout["model.layers.0.self_attn.q_proj.weight"] == "q4"
    assert read_marker(path)["stored"] == "gguf-blocks"
    tensor_bytes = sum(t.n_bytes for t in GGUFReader(str(tiny_gguf)).tensors)
    assert (path / "pardec-quant.safetensors").stat().st_size <= 1.3 * tensor_bytes


def test_a_store_of_format_1_with_4_bit_codes_loads_as_one_of_records(tiny_gguf: Path, tmp_path: Path) -> None:
    """The store keeps 4-bit weights as the records the kernels read (format 2: no packing
    at each load); a store written before, with codes, scales and minimums (format 1),
    loads to the same tensors, dequantized or as records."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    from pardec_cli.quant import Int4Records, unpack_records
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.quantized import load_quantized_dir

    new = import_gguf(tiny_gguf, "tiny-q")
    stored = load_file(str(new / "pardec-quant.safetensors"))
    assert "model.layers.0.self_attn.q_proj.weight.q4_records" in stored
    assert not any(key.endswith(".q4_codes") for key in stored)  # every tiny Q4 layer is whole records
    assert json.loads((new / "pardec-quant.json").read_text())["format"] == 2
    old = tmp_path / "old"
    shutil.copytree(new, old)
    as_codes: dict[str, torch.Tensor] = {}
    for key, t in stored.items():
        if not key.endswith(".q4_records"):
            as_codes[key] = t
            continue
        name = key.removesuffix(".q4_records")
        q, scale, minimum = unpack_records(t, t.shape[0] * 16, t.shape[1] * 32)
        as_codes[f"{name}.q4_codes"] = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
        as_codes[f"{name}.q4_scale"], as_codes[f"{name}.q4_min"] = scale.half(), minimum.half()
    save_file(as_codes, str(old / "pardec-quant.safetensors"))
    meta = json.loads((old / "pardec-quant.json").read_text())
    (old / "pardec-quant.json").write_text(json.dumps({**meta, "format": 1}))
    config = AutoConfig.from_pretrained(str(new))
    for kw in ({"weights": "full"}, {"weights": "int4", "records": "float32", "own_widths": True}):
        a, b = (load_quantized_dir(d, config, dtype=torch.float32, device="cpu", **kw) for d in (new, old))
        layer = a.model.layers[0].self_attn.q_proj
        assert isinstance(layer, Int4Records) if kw["weights"] == "int4" else isinstance(layer, nn.Linear)
        sa, sb = a.state_dict(), b.state_dict()
        assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_4_bit_weights_the_kernels_cannot_take_are_stored_as_codes() -> None:
    """Records hold 16 outputs: a Q4 weight of 40 rows (or with a float16 scale the kernels
    refuse) keeps codes, scales and minimums, and both forms dequantize alike."""
    from pardec_cli.store.quantized import _as_records, dequantize_stored

    rng = np.random.default_rng(1)
    for rows, subnormal in ((40, False), (48, False), (48, True)):
        codes = torch.from_numpy(rng.integers(0, 256, (rows, 32), dtype=np.uint8))  # [N, K/2]: K = 64
        scale = torch.from_numpy(rng.uniform(0.001, 0.01, (rows, 2)).astype(np.float16))
        if subnormal:
            scale[3, 1] = 1e-6  # below float16's smallest normal (6.1e-5)
        minimum = torch.from_numpy(rng.uniform(-0.05, 0.0, (rows, 2)).astype(np.float16))
        parts = {"q4_codes": codes, "q4_scale": scale, "q4_min": minimum}
        stored = _as_records(parts)
        records = rows % 16 == 0 and not subnormal
        assert list(stored) == (["q4_records"] if records else ["q4_codes", "q4_scale", "q4_min"])
        assert torch.equal(dequantize_stored("q4", stored), dequantize_stored("q4", parts))


def test_pardec_import_says_the_blocks_were_kept(tiny_gguf: Path) -> None:
    result = invoke(["import", str(tiny_gguf), "--name", "tiny-said", "-q"])
    assert result.exit_code == 0, result.stderr
    assert "(its quantized blocks kept)" in result.stdout and "float32" not in result.stdout


def test_a_kept_gguf_loads_to_exactly_transformers_dequantized_weights(tiny_gguf: Path) -> None:
    """The reference is transformers' own GGUF loader (gguf's dequantization, q/k rows
    un-permuted), which pardec used before keeping blocks."""
    from transformers import AutoModelForCausalLM

    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    path = import_gguf(tiny_gguf, "tiny-q")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                                     dtype=torch.float32)  # fmt: skip
    ours, theirs = model.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name


def test_q4_k_blocks_are_kept_as_4_bit_codes_with_float16_scales(tmp_path: Path) -> None:
    """Q4_K (the usual K-quant files' 4-bit type): the codes as they are, each 32 inputs'
    scale d * sc and min -dmin * m rounded to float16 (pardec's q4 layout): within that
    rounding of ggml's dequantization, and a quarter of a GGUF tensor's size more at most."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    gguf_path = tmp_path / "tiny.Q4_K.gguf"
    write_tiny_gguf(gguf_path, hidden=256, linears="Q4_K")
    path = import_gguf(gguf_path, "tiny-k")
    layout = json.loads((path / "pardec-quant.json").read_text())["tensors"]
    assert layout["model.layers.1.mlp.down_proj.weight"] == layout["model.layers.0.self_attn.k_proj.weight"] == "q4"
    tensor_bytes = sum(t.n_bytes for t in GGUFReader(str(gguf_path)).tensors)
    assert (path / "pardec-quant.safetensors").stat().st_size <= 1.25 * tensor_bytes
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_path.name, dtype=torch.float32)
    ours, theirs = model.state_dict(), reference.state_dict()
    for name in theirs:
        bound = 2**-11 * 16 * theirs[name].abs().max() + 1e-7  # (15 |scale| + |min|) in float16
        assert (ours[name] - theirs[name]).abs().max() <= bound, name
    assert not torch.equal(ours["model.layers.0.mlp.up_proj.weight"], theirs["model.layers.0.mlp.up_proj.weight"])
    packed, _ = load_model(path, dtype="float32", device="cpu", weights="int4")
    layer = packed.model.layers[0].self_attn.q_proj
    assert isinstance(layer, Int4Linear)
    assert torch.allclose(layer.dequantize(), model.model.layers[0].self_attn.q_proj.weight, atol=1e-5)


@pytest.mark.parametrize("linears,down", [("Q4_K", "Q6_K"), ("Q5_0", None)])
def test_other_quantized_types_keep_their_blocks_and_load_dequantized_exactly(tmp_path: Path, linears: str,
                                                                              down: str | None) -> None:
    """Types no kernel of pardec's multiplies (Q6_K in a Q4_K_M file, Q5_0) keep the file's
    blocks (the store stays about the file's size) and load as gguf dequantizes them:
    transformers' own loading gives the same weights, bit for bit."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model
    from pardec_cli.store.quantized import stored_kind

    gguf_path = tmp_path / f"tiny.{linears}.gguf"
    write_tiny_gguf(gguf_path, hidden=256, linears=linears, types={"ffn_down": down} if down else None)
    path = import_gguf(gguf_path, "tiny-mixed")
    layout = json.loads((path / "pardec-quant.json").read_text())["tensors"]
    kept = "q4" if linears == "Q4_K" else f"gguf:{linears}"
    assert layout["model.layers.0.self_attn.q_proj.weight"] == kept
    assert layout["model.layers.1.mlp.down_proj.weight"] == f"gguf:{down or linears}"
    assert stored_kind(path) == ("q4" if linears == "Q4_K" else "q8")  # Q5_0 beside the Q8_0 embedding
    tensor_bytes = sum(t.n_bytes for t in GGUFReader(str(gguf_path)).tensors)
    assert (path / "pardec-quant.safetensors").stat().st_size <= 1.25 * tensor_bytes
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_path.name, dtype=torch.float32)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert torch.equal(ours["model.layers.1.mlp.down_proj.weight"], theirs["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(ours["model.layers.1.self_attn.k_proj.weight"], theirs["model.layers.1.self_attn.k_proj.weight"]) \
        or linears == "Q4_K"  # Q4_K: scales rounded to float16 (the test above)
    packed, _ = load_model(path, dtype="float32", device="cpu", weights="int4")  # the dense ones quantized at load
    assert isinstance(packed.model.layers[1].mlp.down_proj, Int4Linear)


def test_a_file_mostly_of_wider_blocks_is_not_run_on_4_bits(tmp_path: Path) -> None:
    """llama.cpp's Q4_K_M of a model whose width is no multiple of 256 is mostly Q5_0 with
    Q4_K in a few ffn_down tensors: auto weighs the kept weights, not the tensors, and keeps
    8 bits (q8q8) rather than requantize the Q5_0 majority to 4."""
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.quantized import _kept_weights, stored_kind

    gguf_path = tmp_path / "tiny.Q5_0.gguf"
    write_tiny_gguf(gguf_path, hidden=256, linears="Q5_0", types={"ffn_down": "Q4_K"})
    path = import_gguf(gguf_path, "mostly-q5")
    per_layer = {"q4": 256 * 512, "gguf:Q5_0": 2 * 256 * 256 + 2 * 128 * 256 + 2 * 512 * 256}
    assert _kept_weights(path) == {"q8": 96 * 256, **{kind: 2 * n for kind, n in per_layer.items()}}
    assert stored_kind(path) == "q8"
    assert resolve_weights("auto", dtype="float32", device="cpu", stored=stored_kind(path), avx2=True) == "q8q8"


def test_gguf_names_are_transformers_own_map(tiny_gguf: Path) -> None:
    """`gguf_hf_names` builds gguf's name table once; transformers' map, which builds it for
    every module, is the reference."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, get_gguf_hf_weights_map

    from pardec_cli.store.quantized import gguf_hf_names

    config = AutoConfig.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    ours = gguf_hf_names(skeleton, "llama", config.num_hidden_layers)
    assert ours == get_gguf_hf_weights_map(skeleton, LlamaTensorProcessor(config=config.to_dict()))
    assert ours["blk.1.attn_q.weight"] == "model.layers.1.self_attn.q_proj.weight"
    with pytest.raises(ModelLoadError, match="'foonet'"):
        gguf_hf_names(skeleton, "foonet", config.num_hidden_layers)


@pytest.mark.parametrize(("types", "alignment"), [(None, None), ({"ffn_down": "Q6_K", "attn_v": "Q4_K"}, 64)],
                         ids=["q4_1", "k-quants-aligned-64"])  # fmt: skip
def test_gguf_tensors_are_gguf_s_own_reader_s_without_its_metadata_parse(tmp_path: Path, types, alignment) -> None:
    """`read_gguf_tensors` skips the metadata that gguf's GGUFReader parses value by value
    (seconds for a real vocabulary): the same names, types, shapes and bytes, and the
    architecture, whatever the data's alignment; a file cut short is one clear error."""
    from gguf import GGUFReader

    from pardec_cli.store.gguf_import import read_gguf_tensors

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, hidden=256, types=types, alignment=alignment)
    architecture, tensors = read_gguf_tensors(path)
    reader = GGUFReader(str(path))
    assert architecture == "llama" and len(tensors) == len(reader.tensors) > 10
    for ours, theirs in zip(tensors, reader.tensors):
        assert (ours.name, ours.tensor_type, ours.data.shape, ours.data.dtype) == \
            (theirs.name, theirs.tensor_type, theirs.data.shape, theirs.data.dtype)
        assert np.array_equal(ours.data, theirs.data)
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-1000])
    with pytest.raises(ModelLoadError, match="ends past the file's end"):
        read_gguf_tensors(tmp_path / "cut.gguf")
    (tmp_path / "header.gguf").write_bytes(data[:300])
    with pytest.raises(ModelLoadError, match="not a valid GGUF file"):
        read_gguf_tensors(tmp_path / "header.gguf")


def test_a_big_endian_gguf_is_one_clear_error(tmp_path: Path) -> None:
    """Both header readers (`gguf_architecture`, which `pardec import` asks first, and
    `read_gguf_tensors`) say a file written for the other byte order is one they do not
    read, rather than misreading its counts ("implausible string length" before)."""
    import gguf

    from pardec_cli.store.gguf_import import gguf_architecture, read_gguf_tensors

    writer = gguf.GGUFWriter(str(tmp_path / "be.gguf"), "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_block_count(1)
    writer.add_tensor("blk.0.attn_norm.weight", np.arange(64, dtype=np.float32).reshape(2, 32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for read in (gguf_architecture, read_gguf_tensors):
        with pytest.raises(ModelLoadError, match="written for big-endian machines; pardec reads little-endian"):
            read(tmp_path / "be.gguf")


def test_int4_from_kept_codes_equals_the_dequantized_weights(tiny_gguf: Path) -> None:
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    path = import_gguf(tiny_gguf, "tiny-q")
    full, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    packed, _ = load_model(path, dtype="float32", device="cpu", weights="int4")
    layer = packed.model.layers[1].self_attn.k_proj
    assert isinstance(layer, Int4Linear)
    dense = full.model.layers[1].self_attn.k_proj.weight
    assert torch.allclose(layer.dequantize(), dense, atol=1e-5)  # only the bf16-free fp32 zero rounding
    int8, _ = load_model(path, dtype="float32", device="cpu", weights="int8")
    assert isinstance(int8.model.layers[0].mlp.down_proj, Int8Linear)
    assert all(isinstance(m.get_output_embeddings(), Int8Head) for m in (packed, int8))
    assert not isinstance(full.get_output_embeddings(), Int8Head)
    ids = torch.tensor([random_prompt(3, 10)])
    with torch.no_grad():
        a, b = full(ids, output_hidden_states=True), packed(ids, output_hidden_states=True)
    assert torch.allclose(a.hidden_states[-1], b.hidden_states[-1], atol=1e-4)  # the decoder: the same weights
    assert (a.logits - b.logits).norm() < 0.02 * a.logits.norm()  # the head: int8


def test_int4_fits_each_device_s_kernel() -> None:
    from pardec_cli.quant import int4_fits

    assert int4_fits(1536, 576, 32, "cpu")  # SmolLM2's gate/up on the CPU kernel
    assert not int4_fits(1536, 576, 32, "cuda")  # ... miss CUDA's tiles of 128 inputs
    assert int4_fits(576, 1536, 32, "cuda")  # its down projection fits them
    assert not int4_fits(100, 128, 32, "cuda")  # outputs in eights
    assert not int4_fits(64, 48, 32, "cpu")  # inputs in whole groups


def test_kept_q4_codes_the_device_s_int4_kernel_cannot_take_load_dense(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA the tiny GGUF's 64-wide layers miss the kernel's tiles: such a layer is
    dequantized exactly and kept dense (it failed to load, 'the file is damaged')."""
    from pardec_cli import quant
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    path = import_gguf(tiny_gguf, "tiny-q")
    full, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    monkeypatch.setattr(quant, "int4_fits", lambda n, k, group_size, device_type: n != 32)  # k/v: 32 outputs
    mixed, _ = load_model(path, dtype="float32", device="cpu", weights="int4")
    attention = mixed.model.layers[1].self_attn
    assert isinstance(attention.q_proj, Int4Linear)
    assert type(attention.k_proj) is torch.nn.Linear
    assert torch.equal(attention.k_proj.weight, full.model.layers[1].self_attn.k_proj.weight)
    ids = torch.tensor([random_prompt(3, 10)])
    with torch.no_grad():
        a, b = full(ids, output_hidden_states=True), mixed(ids, output_hidden_states=True)
    assert torch.allclose(a.hidden_states[-1], b.hidden_states[-1], atol=1e-4)


# ----------------------------------------------------------------------- the CLI


def test_weights_flag_shows_in_stats(tiny_cli_model: Path) -> None:
    result = invoke(["gen", "-m", str(tiny_cli_model), "--weights", "int8", "--dtype", "float32",
                     "-n", "4", "--method", "vanilla", "--stats", "hi"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "(float32, int8 weights, cpu)" in result.stderr


def test_a_bad_weights_value_is_one_clear_line(tiny_cli_model: Path) -> None:
    result = invoke(["gen", "-m", str(tiny_cli_model), "--weights", "int3", "hi"])
    assert result.exit_code == 2
    assert "'int3' is not one of 'auto', 'full', 'int8', 'int4'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_embedded_copy_expanded_by_an_earlier_pardec_is_converted_again_once(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pardec_cli.home import models_dir
    from pardec_cli.store import embedded, gguf_import, layout

    old = models_dir() / embedded.EMBEDDED_ALIAS
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    layout.write_marker(old, source="gguf", dtype="float32")  # no "stored": the dense float32 copy
    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: tiny_gguf)
    path = embedded.ensure_embedded_model()
    assert layout.read_marker(path)["stored"] == "gguf-blocks" and (path / "pardec-quant.json").is_file()
    monkeypatch.setattr(gguf_import, "_convert", lambda *a, **k: pytest.fail("converted twice"))
    assert embedded.ensure_embedded_model() == path


# -- dense bfloat16 layers on oneDNN's prepacked weights -------------------------------

needs_packing = pytest.mark.skipif(
    quant.PackedLinear.from_linear(nn.Linear(64, 32).bfloat16()) is None,
    reason="this torch or CPU cannot prepack bfloat16 linears with oneDNN",
)


@needs_packing
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_linear_gives_exactly_the_dense_products(bias) -> None:
    torch.manual_seed(0)
    dense = nn.Linear(96, 48, bias=bias).bfloat16()
    packed = quant.PackedLinear.from_linear(dense)
    assert packed is not None and not hasattr(packed, "weight")  # the packed copy replaces the dense weight
    for shape in [(1, 96), (5, 96), (2, 3, 96), (70, 96)]:
        x = torch.randn(*shape).bfloat16()
        assert torch.equal(packed(x), dense(x)), shape


def test_a_linear_that_cannot_be_packed_stays_dense() -> None:
    assert quant.PackedLinear.from_linear(nn.Linear(64, 32)) is None  # float32: torch's own kernels
    model = tiny_llama(0)
    assert quant.pack_linears(model) == 0 and quant.weights_label(model) == "full"


@needs_packing
def test_packed_decoder_layers_decode_as_the_dense_model_eager_and_compiled() -> None:
    """Same products, so the same tokens; the head stays dense (tied embedding readers)."""
    dense = tiny_llama(3).bfloat16()
    prompt = random_prompt(3, 12)
    want, _ = run("vanilla", {}, dense, prompt, max_new_tokens=16)
    model = tiny_llama(3).bfloat16()
    assert quant.pack_linears(model) == 4 * 7  # four layers' q, k, v, o, gate, up, down
    assert isinstance(model.lm_head, nn.Linear) and quant.weights_label(model) == "full"
    assert run("vanilla", {}, model, prompt, max_new_tokens=16)[0] == want
    ids = torch.tensor([prompt])
    torch._dynamo.reset()
    try:  # an opaque op: inductor must not need the packed weight as a frozen constant
        compiled = torch.compile(model, fullgraph=True)
        with torch.no_grad():  # inductor fuses the bfloat16 elementwise work in float32: close, not equal
            assert torch.allclose(compiled(ids).logits, model(ids).logits, atol=0.02)
    finally:
        torch._dynamo.reset()
