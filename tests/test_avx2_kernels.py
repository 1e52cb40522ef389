"""pardec's AVX2 kernels (`kernels.AVX2`) and the float32 layers on them: dense float32
layers and heads (`quant.F32Linear`) and int8 layers in float32 (`quant.Int8F32`).

The kernels' tests build the library once for the run (about 20 s) and are skipped on a
CPU without AVX2 and FMA; the loading choices run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pardec_cli import kernels, quant
from pardec_cli.hardware import cpu_info
from pardec_cli.quant import DENSE_FROM_ROWS, F32Linear, Int8F32, Int8Linear, use_avx2
from tests.test_exactness import random_prompt
from tests.test_quant import tiny_gguf  # noqa: F401 (a fixture)
from tests.tiny_models import tiny_llama

AVX2 = all(flag in cpu_info().flags for flag in kernels.AVX2_FLAGS)


@pytest.fixture(scope="session")
def avx2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The AVX2 library, built once for the test run and loaded into this process."""
    if not AVX2:
        pytest.skip("this CPU lacks AVX2 and FMA")
    directory = kernels.build_dir(tmp_path_factory.mktemp("kernels"), kernels.AVX2)
    kernels.build(directory)
    assert kernels.load(directory) and kernels.loaded(kernels.AVX2)
    return directory


def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x-free inputs: a float32 weight [n, k], int8 codes [n, k] and their scales [n]."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    return w, q, torch.rand(n, generator=g) * 0.01 + 1e-3


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 21])
@pytest.mark.parametrize("n", [64, 37])  # outputs in blocks of 4, and a short last block
def test_the_ops_multiply_float32_activations_by_float32_and_int8_weights(avx2_dir: Path, rows: int, n: int) -> None:
    w, q, scales = weights(n, 72)
    x = torch.randn(rows, 72, generator=torch.Generator().manual_seed(rows))
    dense = torch.ops.pardec_avx2.f32_mm(x, w)
    assert dense.shape == (rows, n) and dense.dtype == torch.float32
    torch.testing.assert_close(dense.double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-4)
    int8 = torch.ops.pardec_avx2.q8f32_mm(x, q, scales)
    torch.testing.assert_close(int8.double(), (x.double() @ q.double().T) * scales.double(), rtol=1e-5, atol=1e-4)


def test_a_row_s_product_does_not_depend_on_the_rows_beside_it(avx2_dir: Path) -> None:
    """Rows are multiplied in pairs and a last odd row alone, by the same sums: a row's
    output is the same bits in a one-token step and in any verifying step."""
    w, q, scales = weights(52, 96)
    x = torch.randn(9, 96, generator=torch.Generator().manual_seed(1))
    for op, args in ((torch.ops.pardec_avx2.f32_mm, (w,)), (torch.ops.pardec_avx2.q8f32_mm, (q, scales))):
        together = op(x, *args)
        for rows in (1, 2, 5):
            for start in range(0, 9 - rows + 1, 2):
                assert torch.equal(op(x[start:start + rows], *args), together[start:start + rows])


def test_the_ops_split_their_work_over_torch_s_threads_with_the_same_result(avx2_dir: Path) -> None:
    w, q, scales = weights(512, 64)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.ops.pardec_avx2.f32_mm(x, w), torch.ops.pardec_avx2.q8f32_mm(x, q, scales)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.ops.pardec_avx2.f32_mm(x, w), alone[0])
    assert torch.equal(torch.ops.pardec_avx2.q8f32_mm(x, q, scales), alone[1])
    assert b"GOMP_parallel" in (avx2_dir / f"{kernels.AVX2.name}.so").read_bytes()


def test_bad_inputs_are_errors_not_crashes(avx2_dir: Path) -> None:
    w, q, scales = weights(16, 64)
    x = torch.randn(2, 64)
    for bad in (
        lambda: torch.ops.pardec_avx2.f32_mm(x[:, :60], w[:, :60].contiguous()),  # K not a multiple of 8
        lambda: torch.ops.pardec_avx2.f32_mm(x, w[:, :56].contiguous()),  # K differs
        lambda: torch.ops.pardec_avx2.f32_mm(x.bfloat16(), w),
        lambda: torch.ops.pardec_avx2.f32_mm(x, w.double()),
        lambda: torch.ops.pardec_avx2.f32_mm(x, w.T),  # not contiguous
        lambda: torch.ops.pardec_avx2.f32_mm(x[0], w),
        lambda: torch.ops.pardec_avx2.q8f32_mm(x, q, scales[:8]),
        lambda: torch.ops.pardec_avx2.q8f32_mm(x, q, scales.double()),
        lambda: torch.ops.pardec_avx2.q8f32_mm(x, q.to(torch.uint8), scales),
    ):
        with pytest.raises(RuntimeError):
            bad()


def test_a_float32_layer_on_the_kernel_keeps_its_weight_and_bias(avx2_dir: Path) -> None:
    dense = torch.nn.Linear(64, 24)
    layer = F32Linear(dense)
    assert isinstance(layer, torch.nn.Linear) and layer.weight is dense.weight and layer.bias is dense.bias
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), dense(x))
    # A long prefill, or other activations, take torch's product of the same weight.
    long = torch.randn(DENSE_FROM_ROWS, 64)
    assert torch.equal(layer(long), torch.nn.functional.linear(long, dense.weight, dense.bias))
    # A gradient through it (the op has no backward): torch's product.
    wanted = torch.randn(3, 64, requires_grad=True)
    layer(wanted).sum().backward()
    assert wanted.grad is not None and torch.allclose(wanted.grad, dense.weight.sum(0).expand(3, 64))
    assert dense.weight.grad is not None
    assert not F32Linear.takes(torch.nn.Linear(60, 8)) and not F32Linear.takes(torch.nn.Linear(64, 8).bfloat16())
    assert not F32Linear.takes(layer)  # not twice


def test_an_int8_layer_on_the_kernel_gives_what_torch_s_int8_kernel_gives(avx2_dir: Path) -> None:
    layer = Int8Linear.from_weight(torch.randn(40, 64), torch.randn(40))
    ours = Int8F32.from_int8(layer)
    assert ours is not None and ours.weight_int8 is layer.weight_int8 and ours.scales is layer.scales
    x = torch.randn(3, 64)
    torch.testing.assert_close(ours(x), layer(x), rtol=1e-5, atol=1e-5)
    assert Int8F32.from_int8(Int8Linear.from_weight(torch.randn(8, 64).bfloat16())) is None  # bfloat16 scales


def test_an_int8_head_on_the_kernel_computes_each_row_s_logits_alone(avx2_dir: Path) -> None:
    """`Int8Head`'s smoothed codes, by float32 activations in one pass: close to the dense
    head and to `Int8Head`, each row's logits the same bits alone or beside others."""
    dense = torch.nn.Linear(64, 200, bias=False)
    head = quant.Int8F32Head(dense)
    assert head.weight is dense.weight and quant.own_kernel_activations(head) == "float32"
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(3))
    together = head(x)
    assert all(torch.equal(head(x[i:i + 1]), together[i:i + 1]) for i in range(7))
    want = dense(x)
    assert (together - want).norm() < 0.01 * want.norm()
    torch.testing.assert_close(together, quant.Int8Head(dense, prepack=False)(x), rtol=0.02, atol=0.02)
    long = torch.randn(DENSE_FROM_ROWS, 64)  # a long prefill: the dense weight
    assert torch.equal(head(long), torch.nn.functional.linear(long, dense.weight))


def test_use_avx2_puts_float32_layers_and_the_head_on_the_kernel_over_their_own_weights(avx2_dir: Path) -> None:
    model = tiny_llama(3, vocab=96, layers=2, hidden=64)
    weight = model.get_output_embeddings().weight
    assert use_avx2(model) == 2 * 7 + 1
    head = model.get_output_embeddings()
    assert isinstance(head, F32Linear) and head.weight is weight  # not copied (a tied head stays tied)
    assert quant.kernel_suffix(model) == "+pardec" and quant.weights_label(model) == "full"
    assert use_avx2(model) == 0


def test_a_float32_model_on_the_kernels_gets_the_same_logits_in_every_compiled_step(avx2_dir: Path, tmp_path: Path) -> None:
    """Compiled on the kernels, the one-token, verify and wide steps agree on a token's
    logits (the products' rows are the same bits; inductor's float32 attention and norms
    may round apart by an ulp), and every method's greedy tokens are plain decoding's."""
    from pardec_cli.engine.cache import rollback_to
    from pardec_cli.engine.runner import DECODE, VERIFY, VERIFY_WIDE, CompiledLanguageModel, step_fingerprint
    from tests.test_runner import run_on

    model = tiny_llama(5, vocab=96, layers=2, hidden=64)
    plain_fingerprint = step_fingerprint(model)
    use_avx2(model)
    assert step_fingerprint(model) != plain_fingerprint  # saved steps of torch's products are not reused
    runner = CompiledLanguageModel(model, step_dir=tmp_path)
    prompt, tokens = random_prompt(5), random_prompt(6)[:12]
    with torch.inference_mode():
        cache = runner.new_cache(len(prompt) + 2 * len(tokens))
        runner.forward(prompt, cache, last_only=True)
        alone = torch.stack([runner.forward([token], cache)[-1] for token in tokens])
        for rows in (2, 8, 12):
            rollback_to(cache, len(prompt))
            together = runner.forward(tokens[:rows], cache, parents=tuple(range(-1, rows - 2)))
            torch.testing.assert_close(together, alone[:rows], rtol=1e-5, atol=1e-6)
    assert {kind for kind, state in runner.graph_states().items() if state.compile_seconds} == {DECODE, VERIFY, VERIFY_WIDE}
    plain, _ = run_on(runner, "vanilla", {}, prompt, max_new_tokens=48)
    for method, options in (("pld", {}), ("suffix+recycling", {}), ("suffix", {"max_nodes": 24})):
        got, _ = run_on(runner, method, options, prompt, max_new_tokens=48)
        assert got == plain, method


# -------------------------------------------------------------- loading and building


def test_float32_loads_take_the_avx2_kernels_once_built_in_the_store(
    avx2_dir: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from pardec_cli.home import kernels_dir
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    monkeypatch.setattr(kernels, "avx2_wanted", lambda flags: True)
    path = import_gguf(tiny_gguf, "tiny-q")
    started: list[Path] = []
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: started.append(directory) or True)
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    # Not built in this store: torch's products now, and a build starts for the next run.
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert started == [kernels.build_dir(kernels_dir(), kernels.AVX2)]
    started[0].mkdir(parents=True)
    (started[0] / f"{kernels.AVX2.name}.so").symlink_to(avx2_dir / f"{kernels.AVX2.name}.so")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    assert isinstance(model.model.layers[0].self_attn.q_proj, F32Linear)
    assert isinstance(model.get_output_embeddings(), F32Linear)
    model, _ = load_model(path, dtype="float32", device="cpu", weights="int8")
    assert isinstance(model.model.layers[0].mlp.down_proj, Int8F32) and quant.weights_label(model) == "int8"
    assert isinstance(model.get_output_embeddings(), quant.Int8F32Head)
    # bfloat16, int4, a CPU that does not want them, or PARDEC_KERNELS=0: torch's products.
    for dtype, weights_ in (("bfloat16", "full"), ("float32", "int4")):
        model, _ = load_model(path, dtype=dtype, device="cpu", weights=weights_)
        assert not any(isinstance(m, (F32Linear, Int8F32)) for m in model.modules()), (dtype, weights_)
    monkeypatch.setattr(kernels, "avx2_wanted", lambda flags: False)
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    assert not any(isinstance(m, F32Linear) for m in model.modules())
    monkeypatch.setattr(kernels, "avx2_wanted", lambda flags: True)
    monkeypatch.setenv("PARDEC_KERNELS", "0")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    assert not any(isinstance(m, F32Linear) for m in model.modules())


def test_only_a_cpu_whose_torch_runs_avx2_wants_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert kernels.avx2_wanted({"avx2", "fma", "f16c"})
    assert not kernels.avx2_wanted({"avx2"}) and not kernels.avx2_wanted({"fma"})
    assert not kernels.avx2_wanted({"avx2", "fma", "avx512f"})  # measured only where torch runs AVX2
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert kernels.avx2_wanted({"avx2", "fma", "avx512f"})


def test_each_library_builds_in_its_own_directory(tmp_path: Path) -> None:
    avx2, avx512 = kernels.build_dir(tmp_path, kernels.AVX2), kernels.build_dir(tmp_path)
    assert avx2 != avx512 and avx2.name.startswith("avx2-") and avx512.name.startswith("int4-")
    assert kernels.library_of(avx2) is kernels.AVX2 and kernels.library_of(avx512) is kernels.AVX512
    assert kernels.status(avx2) == "not built"
    assert kernels.source_digest(kernels.AVX2) != kernels.source_digest(kernels.AVX512)


def test_doctor_says_whether_the_avx2_kernels_run_here() -> None:
    from pardec_cli.cli.doctor import _kernels_line

    base = {"dir": "/k/int4-abc", "status": "not built", "enabled": True, "bfloat16": False, "int8": False,
            "float32": True, "avx2_dir": "/k/avx2-def", "avx2_status": "built"}  # fmt: skip
    assert _kernels_line(base) == "pardec's, built in /k/avx2-def: full and int8 weights in float32"
    assert "first load in float32" in _kernels_line({**base, "avx2_status": "not built"})
    assert "PARDEC_KERNELS=0" in _kernels_line({**base, "enabled": False})
    assert "lacks AVX512-BF16" in _kernels_line({**base, "float32": False})
    assert _kernels_line({**base, "bfloat16": True}).startswith("pardec's for int4, int8 and full weights in bfloat16")


@pytest.mark.parametrize(("weights", "op_name"), [("full", "f32_mm"), ("int8", "q8f32_mm")])
def test_layers_of_one_input_share_one_product_when_compiled(avx2_dir: Path, weights: str, op_name: str) -> None:
    """q/k/v and gate/up: one weight each group (members' weights become row views of it,
    no second copy), and a compiled step makes one call per group."""
    from tests.test_int4_kernels import compiled_product_calls
    from tests.test_quant import quantize_linears_on

    model = tiny_llama(4, layers=2, hidden=128)
    if weights == "int8":
        model = quantize_linears_on(model, "int8")  # the head too, on Int8Head
    head = 1 if weights == "full" else 0  # the dense head's product is alone in its group
    assert use_avx2(model) == 2 * 7 + head
    op = getattr(torch.ops.pardec_avx2, op_name).default
    ids = torch.tensor([random_prompt(1, 12)])
    with torch.no_grad():
        before = model(ids).logits
        assert quant.share_products(model, lambda: model(ids[:, :2], use_cache=False)) == 4
        after = model(ids).logits
    assert torch.equal(before, after)  # eager: each member multiplies its own rows, as before
    attention = model.model.layers[0].self_attn
    members = [attention.q_proj, attention.k_proj, attention.v_proj]
    name = "weight" if weights == "full" else "weight_int8"
    assert [m.shared_columns for m in members] == [(0, 128), (128, 192), (192, 256)]
    assert all(getattr(m, name).untyped_storage().data_ptr() == getattr(members[0], f"shared_{name}").data_ptr() for m in members)
    calls, traced = compiled_product_calls(model, ids, op)
    assert calls == [(2 * 7 + head, 2 * 4 + head)]
    torch.testing.assert_close(traced, after, rtol=1e-4, atol=1e-5)
