"""``--weights q8q8``: int8 weights in groups of 32 with a scale each (llama.cpp's Q8_0) by
int8 activation groups, on pardec's AVX2 library (`quant.Q8Records`,
``pardec_avx2::q8q8_blocks_mm``), and a Llama decoder of them in the native step.

On the AVX2 library built once per test run (`avx2_dir`, tests/conftest.py); skipped on a
CPU without AVX2 and FMA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pardec_cli import kernels, quant
from pardec_cli.errors import PardecUsageError
from pardec_cli.quant import Q8Records
from tests.test_avx2_kernels import (LIBRARY, built_in, compiled_steps_agree_and_methods_are_exact, on_the_plain_build,
                                     q8q8_llama)
from tests.tiny_models import save_word_level_model, tiny_llama


def q8_inputs(rows: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Activations x [rows, k], codes q [n, k] (-127..127) and scales d [n, k/32]; and the layer's
    packed codes and scales as `Q8Records` holds them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-4).to(torch.float16)
    return x, q, d, quant.pack_head(q)


def packed_scales(d: torch.Tensor) -> torch.Tensor:
    n, groups = d.shape
    return d.view(n // 16, 16, groups).transpose(1, 2).contiguous()


def test_q8_blocks_are_q8_0_codes_with_a_float16_scale_per_group_of_32() -> None:
    """d = max |w| / 127 rounded to float16, codes round(w / d) within -127..127: each weight
    within half a step (a clipped extreme within a step); an all-zero group has zero codes."""
    w = torch.randn(32, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 96)
    w[3, 32:64] = 0.0
    codes, scales = quant.q8_blocks(w)
    assert codes.dtype == torch.int8 and codes.shape == (32, 96) and scales.dtype == torch.float16 and scales.shape == (32, 3)
    assert codes.abs().max() <= 127 and not codes[3, 32:64].any()
    d = scales.float().repeat_interleave(32, dim=1)
    assert ((codes.float() * d - w).abs() <= d * 0.5 + 1e-12).float().mean() > 0.99
    assert ((codes.float() * d - w).abs() <= d * 1.01 + 1e-12).all()
    layer = Q8Records.from_weight(w)
    assert layer is not None and torch.equal(layer.dequantize(), codes.float() * d)
    assert Q8Records.from_weight(torch.randn(24, 64)) is None and Q8Records.from_weight(torch.randn(16, 40)) is None


@pytest.mark.parametrize(("rows", "n", "k"), [(1, 16, 32), (3, 48, 96), (9, 64, 576), (17, 32, 64)])
def test_q8q8_blocks_multiply_int8_groups_by_int8_activation_groups(avx2_dir: Path, rows: int, n: int, k: int) -> None:
    """y[r, o] = sum_g d[o, g] d_x[r, g] (integer sum of codes by codes), the activation groups
    quantized as q8q8_mm's (llama.cpp's Q8_0 by Q8_0); rows past a tile; each row the same bits
    alone."""
    x, q, d, blocks = q8_inputs(rows, n, k, seed=rows)
    groups = x.view(rows, k // 32, 32)
    dx = groups.abs().amax(-1) / 127
    qx = torch.round(groups / dx[..., None]).clamp(-127, 127)
    sums = torch.einsum("mgk,ngk->mng", qx.double(), q.view(n, k // 32, 32).double())  # exact integers
    want = (sums * d.double()[None] * dx.double()[:, None, :]).sum(-1)
    got = torch.ops.pardec_avx2.q8q8_blocks_mm(x, blocks, packed_scales(d))
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert all(torch.equal(torch.ops.pardec_avx2.q8q8_blocks_mm(x[i:i + 1], blocks, packed_scales(d))[0], got[i]) for i in range(rows))


def test_a_q8q8_layer_multiplies_what_it_dequantizes_to_and_keeps_its_bias(avx2_dir: Path) -> None:
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(64, 48)
    layer = Q8Records.from_weight(linear.weight, linear.bias)
    assert layer is not None
    x = torch.randn(2, 5, 64, generator=g)
    want = torch.nn.functional.linear(x, layer.dequantize(), linear.bias)
    got = layer(x)
    assert got.shape == (2, 5, 48)
    assert (got - want).norm() < 0.02 * want.norm()  # the activations' int8 rounding only


def test_q8q8_s_bad_inputs_are_errors_not_crashes(avx2_dir: Path) -> None:
    x, _, d, blocks = q8_inputs(2, 32, 64)
    scales = packed_scales(d)
    for bad in (
        lambda: torch.ops.pardec_avx2.q8q8_blocks_mm(x[:, :40], blocks, scales),  # K not the codes' groups
        lambda: torch.ops.pardec_avx2.q8q8_blocks_mm(x, blocks.view(torch.uint8), scales),  # not int8 codes
        lambda: torch.ops.pardec_avx2.q8q8_blocks_mm(x, blocks, scales.float()),  # scales not float16
        lambda: torch.ops.pardec_avx2.q8q8_blocks_mm(x, blocks, scales[:1]),  # too few scales
        lambda: torch.ops.pardec_avx2.q8q8_blocks_mm(x[0], blocks, scales),  # not 2-D
    ):
        with pytest.raises(RuntimeError):
            bad()


def test_layers_of_one_input_share_one_q8q8_product_and_keep_their_own_outputs(avx2_dir: Path) -> None:
    model = tiny_llama(5, vocab=96, layers=2, hidden=64)
    quant.quantize_linears(model, "q8q8")
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(2))
    attn = model.model.layers[0].self_attn
    before = [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
    quant.share_products(model, lambda: model(input_ids=torch.zeros(1, 2, dtype=torch.long), use_cache=False))
    assert attn.q_proj.shared_columns == (0, attn.q_proj.out_features)
    assert attn.q_proj.shared_blocks is attn.v_proj.shared_blocks and attn.q_proj.shared_scales is attn.k_proj.shared_scales
    assert all(torch.equal(m(x), b) for m, b in zip((attn.q_proj, attn.k_proj, attn.v_proj), before))


def test_the_native_step_runs_a_q8q8_llama_and_keeps_every_method_exact(avx2_dir: Path, tmp_path: Path) -> None:
    """One call per step over int8 groups: a token's logits the same bits in every step, every
    method's greedy tokens plain decoding's, the cache in float16, nothing compiled."""
    from pardec_cli.engine.native import native_reason

    model = q8q8_llama()
    assert native_reason(model) is None and quant.row_tile(model) == (8 if LIBRARY is kernels.AVX2_VNNI else 4)
    runner = compiled_steps_agree_and_methods_are_exact(model, tmp_path, native=True)
    assert runner.native is not None and runner.kv_dtype == torch.float16 and list(tmp_path.iterdir()) == []


def test_the_native_step_takes_q4q8_and_q8q8_products_side_by_side_and_keeps_every_method_exact(
    avx2_dir: Path, tmp_path: Path
) -> None:
    """A GGUF file's model with 4-bit and wider layers (`mixed_llama`: each of a layer's four
    products either kind) runs in one call per step, exact as an all-4-bit one."""
    from pardec_cli.engine.native import native_reason
    from tests.test_avx2_kernels import mixed_llama

    model = mixed_llama()
    assert native_reason(model) is None
    runner = compiled_steps_agree_and_methods_are_exact(model, tmp_path, native=True)
    assert runner.native is not None and list(tmp_path.iterdir()) == []


def test_a_native_step_needs_one_kind_per_shared_product(avx2_dir: Path) -> None:
    from pardec_cli.engine.native import native_reason
    from tests.test_avx2_kernels import native_llama

    mixed = q8q8_llama()
    mixed.model.layers[1].self_attn.v_proj = native_llama().model.layers[1].self_attn.v_proj
    assert native_reason(mixed) == "its products are not q4q8 or q8q8 records shared per input"
    model = q8q8_llama()
    weights = [torch.zeros(64), torch.zeros(16, 2, 512, dtype=torch.int8)]
    with pytest.raises(RuntimeError, match="no scales, or 4 per layer"):
        torch.classes.pardec_avx2.LlamaWeights(
            weights * 3, [torch.zeros(1, 2, 16, dtype=torch.float16)], model.model.embed_tokens.weight.detach(),
            torch.ones(64), torch.empty(0), torch.zeros(96, 64), torch.empty(0), [0], [4, 2, 16, 128], 1e-5, 0.25)


def test_layers_of_one_input_in_two_kinds_take_the_kind_of_most_of_their_weights(avx2_dir: Path) -> None:
    """A Q4_K_M file's Q6_K v projection beside Q4_K q and k: to share one product they
    take one kind, the one holding most of their weights (q and k: 4 bits), the others
    requantized from their dense weights; as many weights of each kind: the wider."""
    model = tiny_llama(3, vocab=96, layers=1, hidden=64)
    quant.quantize_linears(model, "int4")
    quant.use_records(model, "float32")
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    attn.v_proj = Q8Records.from_weight(attn.v_proj.dequantize())
    dense_v = attn.v_proj.dequantize()
    mlp.up_proj = Q8Records.from_weight(mlp.up_proj.dequantize())  # gate/up: as many weights each, the wider kind
    quant.share_products(model, lambda: model(input_ids=torch.zeros(1, 2, dtype=torch.long), use_cache=False))
    assert {type(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj)} == {quant.Int4Records}
    assert attn.v_proj.shared_blocks is attn.q_proj.shared_blocks
    q, _, _ = quant.int4_codes_from_weight(dense_v, 32)
    assert torch.equal(attn.v_proj.codes()[0], q)  # requantized from the int8 groups' weights
    assert type(mlp.gate_proj) is type(mlp.up_proj) is Q8Records and mlp.gate_proj.shared_columns is not None


def test_q8q8_loads_a_model_in_float32_on_the_native_step(avx2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--weights q8q8`: every decoder product on `Q8Records`, the head on int8 codes, float32
    (asked for or auto), the native step; another dtype or device is a usage error."""
    from pardec_cli.engine.native import native_reason
    from pardec_cli.home import kernels_dir
    from pardec_cli.store.loading import load_model

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    built_in(kernels.build_dir(kernels_dir(), LIBRARY), avx2_dir)  # the run's build, as the store's
    path = save_word_level_model(tmp_path / "dense")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="q8q8")
    assert quant.weights_label(model) == "q8q8" and quant.kernel_suffix(model) == "+pardec"
    assert type(model.get_output_embeddings()) is quant.Int8F32Head and native_reason(model) is None
    with pytest.raises(PardecUsageError, match="computes in float32"):
        load_model(path, dtype="bfloat16", device="cpu", weights="q8q8")
    with pytest.raises(PardecUsageError, match="runs on a CPU"):
        load_model(path, dtype="float32", device="cuda", weights="q8q8")


@pytest.mark.skipif(LIBRARY is not kernels.AVX2_VNNI, reason="this CPU lacks AVX512-VNNI")
def test_the_vnni_build_multiplies_q8q8_blocks_to_the_same_bits_as_the_avx2_one(avx2_dir: Path, tmp_path: Path) -> None:
    """VPDPBUSD on q + 128 less 128 times the activation codes' sum against VPMADDUBSW on |q|:
    the same integers, then the same float steps per output (9 rows: a tile of 8 and one more
    against tiles of 4; codes of -127 and 127)."""
    x, q, d, _ = q8_inputs(9, 48, 256, seed=3)
    q[:, :5], q[:, 5:9] = -127, 127
    blocks, scales = quant.pack_head(q), packed_scales(d)
    ours = torch.ops.pardec_avx2.q8q8_blocks_mm(x, blocks, scales)
    theirs = on_the_plain_build(tmp_path, {"x": x, "q": blocks, "d": scales}, "ops.q8q8_blocks_mm(i['x'], i['q'], i['d'])")
    assert torch.isfinite(ours).all() and torch.equal(ours, theirs)


def test_auto_runs_a_dense_model_as_q8q8_in_float32_on_the_native_step_once_its_kernels_are_built(
    avx2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dtype and --weights auto on a dense model: a first load keeps the CPU's dtype and
    starts the kernels' build in the background; once built, float32 q8q8 on the native step.
    An AMX CPU keeps its bfloat16 (its tiles verify many tokens for the price of one); weights
    asked for are kept."""
    from pardec_cli import hardware
    from pardec_cli.home import kernels_dir
    from pardec_cli.session import Session
    from pardec_cli.store.loading import native_auto

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    path = save_word_level_model(tmp_path / "dense")
    started: list[Path] = []
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: started.append(directory) or True)
    avx2 = kernels.build_dir(kernels_dir(), LIBRARY)
    Session.load(str(path), dtype="bfloat16", compile="off")  # a dtype asked for: no float32 library to start
    assert avx2 not in started
    started.clear()
    assert not native_auto(path) and started == []  # doctor and tune ask without building
    assert not native_auto(path, start=True) and started == [avx2]
    built_in(started[0], avx2_dir)
    assert native_auto(path) and not native_auto(path, "full") and not native_auto(None)
    session = Session.load(str(path), compile="auto")
    assert (session.dtype, session.weights) == ("float32", "q8q8")
    assert session.target.native is not None  # type: ignore[attr-defined]
    full = Session.load(str(path), compile="off", weights="full")
    assert full.weights == "full" and full.dtype == hardware.resolve_dtype("auto", "cpu")
    cpu = hardware.cpu_info()
    amx = hardware.CpuInfo(cpu.model_name, cpu.logical_cores, frozenset(cpu.flags | {"amx_bf16", "amx_tile", "avx512_bf16"}))
    monkeypatch.setattr(hardware, "cpu_info", lambda: amx)
    assert not native_auto(path)


def test_a_q8_0_gguf_keeps_its_blocks_and_auto_runs_them_as_q8q8_on_the_native_step(
    avx2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF of Q8_0 linears is stored as its blocks ("q8"); q8q8 takes their codes and
    float16 scales exactly (not requantized, and never to 4 bits), and auto runs them in
    float32 on the native step once the kernels are built."""
    from pardec_cli.session import Session
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model
    from pardec_cli.store.quantized import stored_kind
    from tests.test_quant import write_tiny_gguf

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    # A full-weights load on an AVX2-only CPU would start a real detached build in the test's home.
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: False)
    gguf = tmp_path / "tiny.Q8_0.gguf"
    write_tiny_gguf(gguf, linears="Q8_0")
    path = import_gguf(gguf, "tiny-q8")
    assert stored_kind(path) == "q8"
    full, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    kept, _ = load_model(path, dtype="float32", device="cpu", weights="q8q8")
    layer = kept.model.layers[1].mlp.down_proj
    assert isinstance(layer, Q8Records) and torch.equal(layer.dequantize(), full.model.layers[1].mlp.down_proj.weight)
    from pardec_cli.home import kernels_dir

    built_in(kernels.build_dir(kernels_dir(), LIBRARY), avx2_dir)
    session = Session.load("tiny-q8", compile="auto")
    assert (session.dtype, session.weights, session.runner) == ("float32", "q8q8", "native")


@pytest.mark.parametrize("linears,wider", [("Q4_K", "Q6_K"), ("Q5_0", "Q4_K")])
def test_auto_multiplies_each_kept_gguf_layer_in_its_own_width_on_the_native_step(
    avx2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linears: str, wider: str
) -> None:
    """A Q4_K_M file's Q6_K ffn_down and attn_v beside Q4_K layers: auto keeps ffn_down in
    Q8_0 groups (not requantized to 4 bits; explicit ``--weights q4q8`` still does), v takes
    the 4 bits of q and k to share their product, and one native call runs both kinds. A
    file mostly of Q5_0 (llama.cpp's Q4_K_M of a narrow model) runs its Q4_K ffn_down on its
    own 4-bit codes beside q8q8 layers."""
    from pardec_cli.engine.native import native_reason
    from pardec_cli.home import kernels_dir
    from pardec_cli.session import Session
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model
    from tests.test_quant import write_tiny_gguf

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    built_in(kernels.build_dir(kernels_dir(), LIBRARY), avx2_dir)
    gguf = tmp_path / f"tiny.{linears}.gguf"
    others = ("ffn_down", "attn_v") if wider == "Q6_K" else ("ffn_down",)
    write_tiny_gguf(gguf, hidden=256, linears=linears, types={name: wider for name in others})
    import_gguf(gguf, "tiny-mixed")
    session = Session.load("tiny-mixed", compile="auto")
    assert (session.dtype, session.weights, session.runner) == ("float32", "q4q8+q8q8", "native")
    model = session.target.model
    assert native_reason(model) is None
    path = session.model_path
    full, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    layer, dense = model.model.layers[1], full.model.layers[1]
    if wider == "Q6_K":
        assert type(layer.mlp.down_proj) is Q8Records and type(layer.self_attn.v_proj) is quant.Int4Records
        want = Q8Records.from_weight(dense.mlp.down_proj.weight)  # Q8_0 groups of the Q6_K weights
        assert torch.equal(layer.mlp.down_proj.dequantize(), want.dequantize())
        explicit, _ = load_model(path, dtype="float32", device="cpu", weights="q4q8")
        assert quant.weights_label(explicit) == "q4q8"
    else:
        assert type(layer.mlp.down_proj) is quant.Int4Records and type(layer.self_attn.v_proj) is Q8Records
        assert torch.equal(layer.mlp.down_proj.dequantize(), dense.mlp.down_proj.weight)  # the file's own codes


def test_a_16_bit_checkpoint_is_read_in_16_bits_for_q8q8_and_loads_as_a_float32_read_would(
    avx2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read in float32 first, a 7B model would take 28 GB before its layers were quantized:
    a bfloat16 checkpoint is read in bfloat16, quantized layer by layer, the rest made float32
    after; every tensor is what a float32 read gives (bfloat16 widens exactly)."""
    from pardec_cli.store import loading
    from tests.tiny_models import peaked, word_level_tokenizer, WORDS

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    path = tmp_path / "bf16"
    word_level_tokenizer().save_pretrained(path)
    peaked(tiny_llama(4, vocab=len(WORDS) + 3, layers=2, hidden=64)).to(torch.bfloat16).save_pretrained(path)
    read: list[torch.dtype] = []
    real = loading._from_pretrained
    monkeypatch.setattr(loading, "_from_pretrained", lambda cls, p, kwargs: read.append(kwargs["dtype"]) or real(cls, p, kwargs))
    model, _ = loading.load_model(path, dtype="float32", device="cpu", weights="q8q8")
    assert read == [torch.bfloat16] and model.dtype == torch.float32
    state = model.state_dict()
    assert {t.dtype for k, t in state.items() if k.endswith(("blocks", "scales")) and ".mlp." in k} == {torch.int8, torch.float16}
    assert all(t.dtype in (torch.float32, torch.int8, torch.float16, torch.int64) for t in state.values())
    monkeypatch.setattr(loading, "check_model_files", lambda p: {"model_type": "llama"})  # no dtype: read in float32
    again, _ = loading.load_model(path, dtype="float32", device="cpu", weights="q8q8")
    assert read[-1] == torch.float32
    assert state.keys() == again.state_dict().keys() and all(torch.equal(t, again.state_dict()[k]) for k, t in state.items())
