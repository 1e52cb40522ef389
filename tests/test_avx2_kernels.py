"""pardec's AVX2 kernels (`kernels.AVX2`) and the float32 layers on them: dense float32
layers and heads (`quant.F32Linear`), int8 layers in float32 (`quant.Int8F32`) and
``--weights q4q8`` (`quant.Int4Records` with ``activations="float32"``).

The kernels' tests build the library once for the run (about 20 s) and are skipped on a
CPU without AVX2 and FMA; the loading choices run everywhere.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from pardec_cli import kernels, quant
from pardec_cli.hardware import cpu_info
from pardec_cli.quant import DENSE_FROM_ROWS, F32Linear, Int8F32, Int8Linear, use_avx2
from tests.test_exactness import random_prompt
from tests.test_quant import tiny_gguf  # noqa: F401 (a fixture)
from tests.tiny_models import tiny_llama

AVX2 = kernels.avx2_runs(cpu_info().flags)
LIBRARY = kernels.avx2_library(cpu_info().flags)  # this CPU's build of it (with VNNI where it has it)


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
    packed = quant.pack_head(q)
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
        lambda: torch.ops.pardec_avx2.q8q8_mm(x[:, :40], q[:, :40].contiguous(), scales),  # K not a multiple of 32
        lambda: torch.ops.pardec_avx2.q8q8_mm(x, q, scales),  # codes not packed
        lambda: torch.ops.pardec_avx2.q8q8_mm(x, packed, torch.rand(17)),  # 17 outputs need 2 blocks of 16
        lambda: torch.ops.pardec_avx2.q8q8_mm(x, packed.view(torch.uint8), scales),
        lambda: torch.ops.pardec_avx2.q8q8_mm(x.double(), packed, scales),
        lambda: torch.ops.pardec_avx2.q8q8_mm(x[:, :32], packed, scales),  # K differs
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


def test_the_head_s_codes_are_packed_16_outputs_by_32_inputs() -> None:
    """Record (b, g), byte 64 p + 4 i + j: q[16 b + i, 32 g + 4 p + j]; a short last block padded with zeros."""
    q = torch.randint(-127, 128, (37, 96), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    packed = quant.pack_head(q)
    assert packed.shape == (3, 3, 512) and packed.dtype == torch.int8 and packed.is_contiguous()
    for b, g, p, i, j in [(0, 0, 0, 0, 0), (0, 0, 0, 0, 3), (0, 0, 0, 1, 0), (0, 0, 1, 0, 0), (1, 2, 7, 15, 3), (2, 1, 5, 4, 2)]:
        assert packed[b, g, 64 * p + 4 * i + j] == q[16 * b + i, 32 * g + 4 * p + j]
    assert not packed[2].view(3, 8, 16, 4)[:, :, 5:].any()  # outputs 37..47 do not exist


@pytest.mark.parametrize(("rows", "n", "k"), [(1, 64, 64), (3, 37, 96), (5, 50, 576), (9, 33, 32), (17, 16, 64)])
def test_q8q8_multiplies_int8_codes_by_int8_activation_groups(avx2_dir: Path, rows: int, n: int, k: int) -> None:
    """Each row's groups of 32 become int8 codes with d = max|x| / 127, as llama.cpp's
    Q8_0 by Q8_0: y = scale * sum_g d_g * (integer sum of codes by codes). Codes of -128
    too; a short last block of outputs; rows past a tile; each row the same bits alone."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g)
    q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    scales = torch.rand(n, generator=g)
    groups = x.view(rows, k // 32, 32)
    d = groups.abs().amax(-1) / 127
    qx = torch.round(groups / d[..., None]).clamp(-127, 127)
    sums = torch.einsum("mgk,ngk->mng", qx.double(), q.view(n, k // 32, 32).double())  # exact integers
    want = (sums * d.double()[:, None, :]).sum(-1) * scales.double()
    packed = quant.pack_head(q)
    got = torch.ops.pardec_avx2.q8q8_mm(x, packed, scales)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert all(torch.equal(torch.ops.pardec_avx2.q8q8_mm(x[i:i + 1], packed, scales)[0], got[i]) for i in range(rows))


@pytest.mark.parametrize("k", [64, 72])  # inputs in groups of 32 (q8q8_mm), or not (q8f32_mm)
def test_an_int8_head_on_the_kernel_computes_each_row_s_logits_alone(avx2_dir: Path, k: int) -> None:
    """`Int8Head`'s smoothed codes, by int8 activation groups (inputs in 32s, `q8q8_mm`) or
    float32 activations: close to the dense head and to `Int8Head`, each row's logits the
    same bits alone or beside others."""
    dense = torch.nn.Linear(k, 200, bias=False)
    head = quant.Int8F32Head(dense)
    assert head.weight is dense.weight and quant.own_kernel_activations(head) == "float32"
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(3))
    together = head(x)
    assert all(torch.equal(head(x[i:i + 1]), together[i:i + 1]) for i in range(7))
    want = dense(x)
    assert (together - want).norm() < 0.01 * want.norm()
    torch.testing.assert_close(together, quant.Int8Head(dense, prepack=False)(x), rtol=0.02, atol=0.02)
    long = torch.randn(DENSE_FROM_ROWS, k)  # a long prefill: the dense weight
    assert torch.equal(head(long), torch.nn.functional.linear(long, dense.weight))


def test_use_avx2_puts_float32_layers_and_the_head_on_the_kernel_over_their_own_weights(avx2_dir: Path) -> None:
    model = tiny_llama(3, vocab=96, layers=2, hidden=64)
    weight = model.get_output_embeddings().weight
    assert use_avx2(model) == 2 * 7 + 1
    head = model.get_output_embeddings()
    assert isinstance(head, F32Linear) and head.weight is weight  # not copied (a tied head stays tied)
    assert quant.kernel_suffix(model) == "+pardec" and quant.weights_label(model) == "full"
    assert use_avx2(model) == 0



@pytest.mark.parametrize("bf16_hardware", [False, True])
def test_a_first_run_builds_the_native_step_s_kernels_beside_the_conversion_and_waits_where_eager_would_be_slow(
    avx2_dir: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, bf16_hardware: bool  # noqa: F811
) -> None:
    """The embedded model's first run: the AVX2 build starts before the conversion; where
    the run would otherwise decode eagerly in float32 it waits for the build (with a notice)
    and runs the native step; where the CPU has bfloat16 hardware it does not wait."""
    from pardec_cli.home import kernels_dir
    from pardec_cli.session import Session
    from pardec_cli.store import embedded, resolve
    from pardec_cli.store.gguf_import import import_gguf

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    path = import_gguf(tiny_gguf, "tiny-q")
    cpu = with_bf16(monkeypatch, bf16_hardware)
    store = kernels.build_dir(kernels_dir(), kernels.avx2_library(cpu.flags))
    events: list[str] = []
    monkeypatch.setattr(embedded, "embedded_pending", lambda: True)
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: events.append("build") or directory == store)

    def converted(spec: str | None, **kwargs: Any) -> resolve.ResolvedModel:
        events.append("convert")
        return resolve.ResolvedModel("smollm2-135m", path, "store")

    def wait(directory: Path, timeout_s: float, **kwargs: Any) -> bool:
        events.append("wait")
        built_in(directory, avx2_dir)
        return True

    monkeypatch.setattr(resolve, "resolve_model", converted)
    monkeypatch.setattr(kernels, "wait_for_build", wait)
    notices: list[str] = []
    # (auto compiles a bfloat16 model's graphs: a minute of this test's time for nothing it checks)
    session = Session.load(None, compile="off" if bf16_hardware else "auto", notice=notices.append)
    if bf16_hardware:  # its fallback is bfloat16 on torch's int4 kernel: no wait
        assert events[:2] == ["build", "convert"] and "wait" not in events and session.runner != "native"
        # A stand-in for the native step of the runs after it: auto estimates its cost curve
        # rather than measure steps no later run takes.
        from pardec_cli.tuning import curve

        def measured(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("a stand-in's curve was measured")

        monkeypatch.setattr(curve, "measure_step_curve", measured)
        monkeypatch.setenv("PARDEC_LEARN", "1")  # (off in the suite: curves are learned only with it on)
        assert session.stand_in and session.auto_selector().learned_curve is None
        assert not any("measuring the cost" in n for n in notices)
    else:
        assert events[:3] == ["build", "convert", "wait"] and session.runner == "native"
        assert (session.dtype, session.weights) == ("float32", "q4q8") and "waiting" in notices[0]
        assert not session.stand_in

@pytest.mark.parametrize("bf16_hardware", [False, True])
def test_a_measurement_waits_for_the_native_step_s_kernels_a_gen_would_not_wait_for(
    avx2_dir: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, bf16_hardware: bool  # noqa: F811
) -> None:
    """bench and tune load with `measuring`: where the AVX2 library is not built, its build
    starts and the load waits for it (with a notice), so that they time the native step, not
    the eager one a first `pardec gen` runs meanwhile (which starts the build and goes on),
    on a CPU with bfloat16 hardware too (its stand-in is a bfloat16 step)."""
    from pardec_cli.home import kernels_dir
    from pardec_cli.session import Session
    from pardec_cli.store import resolve
    from pardec_cli.store.gguf_import import import_gguf

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    path = import_gguf(tiny_gguf, "tiny-q")
    cpu = with_bf16(monkeypatch, bf16_hardware)
    store = kernels.build_dir(kernels_dir(), kernels.avx2_library(cpu.flags))
    events: list[str] = []
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: events.append("build") or directory == store)
    monkeypatch.setattr(resolve, "resolve_model", lambda spec, **kwargs: resolve.ResolvedModel("tiny-q", path, "store"))

    def wait(directory: Path, timeout_s: float, **kwargs: Any) -> bool:
        events.append("wait")
        built_in(directory, avx2_dir)
        return True

    monkeypatch.setattr(kernels, "wait_for_build", wait)
    gen = Session.load("tiny-q", compile="off")
    assert "wait" not in events and gen.runner != "native"  # started the build, went on
    events.clear()
    notices: list[str] = []
    bench = Session.load("tiny-q", compile="auto", notice=notices.append, measuring=True)
    assert events[:2] == ["build", "wait"] and bench.runner == "native" and "waiting" in notices[0]


def with_bf16(monkeypatch: pytest.MonkeyPatch, bf16_hardware: bool) -> Any:
    """Make this CPU one with bfloat16 hardware (avx512_bf16) or one without (no bf16 or AMX
    flags), its other flags kept (they choose the AVX2 library's build); the CpuInfo."""
    from pardec_cli import hardware

    cpu = cpu_info()
    flags = {flag for flag in cpu.flags if "bf16" not in flag and not flag.startswith("amx")}
    cpu = hardware.CpuInfo(cpu.model_name, cpu.logical_cores, frozenset(flags | ({"avx512_bf16"} if bf16_hardware else set())))
    monkeypatch.setattr(hardware, "cpu_info", lambda: cpu)
    return cpu


def built_in(directory: Path, avx2_dir: Path) -> None:
    """Make `directory` (a store's build directory of this CPU's library) hold the run's build."""
    directory.mkdir(parents=True)
    (directory / f"{LIBRARY.name}.so").symlink_to(avx2_dir / f"{LIBRARY.name}.so")


def compiled_steps_agree_and_methods_are_exact(model: torch.nn.Module, step_dir: Path, *, native: bool = False) -> Any:
    """Compile `model`'s steps (or with `native`, run them as `engine.native`'s one call);
    a token's logits must be the same bits in its one-token step and as a row of 2, 8 and
    12-row verifying steps (the products, the head and the attention op each compute a row
    alone), and pld's, suffix's and suffix+recycling's greedy tokens must be plain
    decoding's. Returns the runner."""
    from pardec_cli.engine.cache import rollback_to
    from pardec_cli.engine.runner import CompiledLanguageModel
    from tests.test_runner import run_on

    runner = CompiledLanguageModel(model, step_dir=step_dir, native=native)
    prompt, tokens = random_prompt(5), random_prompt(6)[:12]
    with torch.inference_mode():
        cache = runner.new_cache(len(prompt) + 2 * len(tokens))
        runner.forward(prompt, cache, last_only=True)
        alone = torch.stack([runner.forward([token], cache)[-1] for token in tokens])
        for rows in (2, 8, 12):
            rollback_to(cache, len(prompt))
            together = runner.forward(tokens[:rows], cache, parents=tuple(range(-1, rows - 2)))
            assert torch.equal(together, alone[:rows]), rows
    plain, _ = run_on(runner, "vanilla", {}, prompt, max_new_tokens=48)
    for method, options in (("pld", {}), ("suffix+recycling", {}), ("suffix", {"max_nodes": 24})):
        got, _ = run_on(runner, method, options, prompt, max_new_tokens=48)
        assert got == plain, method
    return runner


def test_a_float32_model_on_the_kernels_gets_the_same_logits_in_every_compiled_step(avx2_dir: Path, tmp_path: Path) -> None:
    """Compiled on the kernels (with pardec's attention op), the one-token, verify and wide
    steps give a token the same bits, and every method's greedy tokens are plain decoding's."""
    from pardec_cli.engine.runner import DECODE, VERIFY, VERIFY_WIDE, step_fingerprint

    model = tiny_llama(5, vocab=96, layers=2, hidden=64)
    plain_fingerprint = step_fingerprint(model)
    use_avx2(model)
    assert step_fingerprint(model) != plain_fingerprint  # saved steps of torch's products are not reused
    runner = compiled_steps_agree_and_methods_are_exact(model, tmp_path)
    assert {kind for kind, state in runner.graph_states().items() if state.compile_seconds} == {DECODE, VERIFY, VERIFY_WIDE}


# -------------------------------------------------------------- q4q8 on AVX2


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_q4q8_computes_q4_1_by_q8_products(avx2_dir: Path, rows: int) -> None:
    """llama.cpp's Q4_1 x Q8_1 over pardec's records: each row's groups of 32 to int8,
    exact integer sums, then the float16 scales and minimums; a row's output is the same
    bits alone or beside others (a verifying step's rows equal one-token steps')."""
    from tests.test_int4_kernels import codes, reference_q8

    q, scale, minimum = codes(64, 96)
    blocks = quant.pack_records(q, scale, minimum)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    got = torch.ops.pardec_avx2.q4q8_mm(x, blocks, 64)
    assert got.shape == (rows, 64) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference_q8(x, q, scale, minimum), rtol=1e-5, atol=1e-4)
    assert all(torch.equal(torch.ops.pardec_avx2.q4q8_mm(x[i:i + 1], blocks, 64), got[i:i + 1]) for i in range(rows))
    # Any float activations (a bfloat16 model asking for q4q8): float32 out.
    half = x.bfloat16()
    assert torch.equal(torch.ops.pardec_avx2.q4q8_mm(half, blocks, 64), torch.ops.pardec_avx2.q4q8_mm(half.float(), blocks, 64))


def test_a_q4q8_layer_on_avx2_multiplies_a_long_prefill_on_the_kernel_too(avx2_dir: Path) -> None:
    """The AVX2 products beat dequantizing plus a float32 GEMM at any prompt length: a
    prefill of DENSE_FROM_ROWS rows gets the kernel's arithmetic, as a short one does."""
    from tests.test_int4_kernels import codes

    q, scale, minimum = codes(64, 96)
    layer = quant.Int4Records.from_codes(q, scale, minimum, activations="float32")
    assert layer is not None
    x = torch.randn(DENSE_FROM_ROWS + 3, 96)
    with torch.no_grad():
        got = layer(x)
    assert torch.equal(got, torch.ops.pardec_avx2.q4q8_mm(x, layer.blocks, 64))
    assert torch.equal(got[:5], layer(x[:5]))  # rows alone: the same bits


def test_q4q8_s_integer_sums_do_not_overflow_at_the_extremes(avx2_dir: Path) -> None:
    """Codes 15 by activation codes +-127 (a group of equal activations): the largest
    int16 partial sums VPMADDUBSW can produce here, still exact."""
    from tests.test_int4_kernels import reference_q8

    q = torch.full((16, 64), 15, dtype=torch.uint8)
    scale, minimum = torch.full((16, 2), 0.5), torch.zeros(16, 2)
    x = torch.cat([torch.full((1, 64), 3.0), torch.full((1, 64), -3.0)])
    got = torch.ops.pardec_avx2.q4q8_mm(x, quant.pack_records(q, scale, minimum), 16)
    torch.testing.assert_close(got.double(), reference_q8(x, q, scale, minimum))
    assert got[0, 0].item() == 64 * 15 * 0.5 * 3.0


def test_q4q8_s_bad_inputs_are_errors_not_crashes(avx2_dir: Path) -> None:
    from tests.test_int4_kernels import codes

    blocks = quant.pack_records(*codes(32, 64))
    x = torch.randn(2, 64)
    for bad in (
        lambda: torch.ops.pardec_avx2.q4q8_mm(x, blocks, 48),  # n does not match the records
        lambda: torch.ops.pardec_avx2.q4q8_mm(x[:, :32], blocks, 32),  # K differs
        lambda: torch.ops.pardec_avx2.q4q8_mm(x, blocks[:, :, :300].contiguous(), 32),
        lambda: torch.ops.pardec_avx2.q4q8_mm(x, blocks.float(), 32),
        lambda: torch.ops.pardec_avx2.q4q8_mm(x[0], blocks, 32),
        lambda: torch.ops.pardec_avx2.q4q8_mm(x.long(), blocks, 32),
    ):
        with pytest.raises(RuntimeError):
            bad()


def test_q4q8_on_avx2_keeps_every_method_exact_in_compiled_steps(avx2_dir: Path, tmp_path: Path) -> None:
    """With activations rounded to int8 an ulp anywhere would flip roundings: the steps
    still give a token the same bits, and every method is exact."""
    model = tiny_llama(5, vocab=96, layers=2, hidden=64)
    quant.quantize_linears(model, "int4")
    assert quant.use_records(model, "float32") == 2 * 7 and quant.weights_label(model) == "q4q8"
    assert use_avx2(model) == 1 and quant.kernel_suffix(model) == "+pardec"  # the head: each row alone too
    # The AVX2 products pass over a block's records 4 rows at a time (8 on 512-bit
    # registers in the VNNI build): drafts fit those tiles.
    assert quant.row_tile(model) == torch.ops.pardec_avx2.q4q8_row_tile() == (8 if LIBRARY is kernels.AVX2_VNNI else 4)
    compiled_steps_agree_and_methods_are_exact(model, tmp_path)


def native_llama(seed: int = 5, head: str = "int8") -> torch.nn.Module:
    """A tiny Llama on q4q8 records as a GGUF 4-bit load leaves it (`store.loading`): q/k/v
    and gate/up each sharing one product, the head on the AVX2 int8 kernel (`head` "float32":
    its float32 rows on the AVX2 library)."""
    model = tiny_llama(seed, vocab=96, layers=2, hidden=64)
    quant.quantize_linears(model, "int4")
    quant.use_records(model, "float32")
    if head == "int8":
        quant.quantize_head(model, avx2=True)
    else:
        use_avx2(model)
    assert quant.share_products(model, lambda: model(input_ids=torch.zeros(1, 2, dtype=torch.long), use_cache=False)) == 2 * 2
    return model


def q8q8_llama(seed: int = 5) -> torch.nn.Module:
    """A tiny Llama as a q8q8 load leaves it (`store.loading`): every product on `Q8Records`,
    q/k/v and gate/up each sharing one, the head on the AVX2 int8 kernel."""
    model = tiny_llama(seed, vocab=96, layers=2, hidden=64)
    assert quant.quantize_linears(model, "q8q8") == 2 * 7 and quant.weights_label(model) == "q8q8"
    quant.quantize_head(model, avx2=True)
    assert quant.share_products(model, lambda: model(input_ids=torch.zeros(1, 2, dtype=torch.long), use_cache=False)) == 2 * 2
    return model


def mixed_llama(seed: int = 5) -> torch.nn.Module:
    """A tiny Llama whose products mix q4q8 records and `Q8Records` as a GGUF file of 4-bit
    and wider blocks loads (`store.quantized.load_quantized_dir`'s own widths): layer 0's
    q/k/v and gate/up on 4 bits, its o and down on int8 groups; layer 1 the other way round."""
    model = tiny_llama(seed, vocab=96, layers=2, hidden=64)
    quant.quantize_linears(model, "int4")
    quant.use_records(model, "float32")
    wide = ["model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj", *(f"model.layers.1.self_attn.{p}_proj" for p in "qkv"),
            "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]  # fmt: skip
    for name in wide:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, quant.Q8Records.from_weight(model.get_submodule(name).dequantize()))
    quant.quantize_head(model, avx2=True)
    assert quant.share_products(model, lambda: model(input_ids=torch.zeros(1, 2, dtype=torch.long), use_cache=False)) == 2 * 2
    assert quant.weights_label(model) == "q4q8+q8q8"
    return model


def test_the_native_step_runs_a_q4q8_llama_without_compiling_and_keeps_every_method_exact(avx2_dir: Path, tmp_path: Path) -> None:
    """One call per step (`engine.native`): the same bits for a token in every step, every
    method's greedy tokens plain decoding's, and no graph compiled or saved."""
    from pardec_cli.engine.native import native_reason

    model = native_llama()
    assert native_reason(model) is None
    runner = compiled_steps_agree_and_methods_are_exact(model, tmp_path, native=True)
    assert runner.native is not None and runner.graph_states() == {} and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("weights", ["q4q8", "q4q8, float32 head", "q8q8", "q4q8+q8q8"])
def test_the_native_step_computes_what_the_eager_step_does(avx2_dir: Path, weights: str) -> None:
    """Logits and the hidden states Medusa and EAGLE read, against transformers' eager step
    over the same static cache (the same weights and kernels; the norms, RoPE and SiLU in
    another order of float operations, so not the same bits)."""
    from pardec_cli.engine.runner import CompiledLanguageModel

    if weights == "q8q8":
        model = q8q8_llama()
    elif weights == "q4q8+q8q8":
        model = mixed_llama()
    else:
        model = native_llama(head="float32" if "float32" in weights else "int8")
    native = CompiledLanguageModel(model, compile_missing=False)
    eager = CompiledLanguageModel(model, compile_missing=False, native=False)  # no saved graphs: eager steps
    assert native.native is not None and eager.native is None
    prompt, tokens = random_prompt(5), random_prompt(6)[:9]
    with torch.inference_mode():
        got, want = [], []
        for runner, out in ((native, got), (eager, want)):
            cache = runner.new_cache(64)
            runner.forward(prompt, cache, last_only=True)
            out.append(runner.forward_features(tokens[:1], cache, [0, 1, -1]))
            out.append(runner.forward_features(tokens[1:], cache, [0, 1, -1], parents=(-1, -1, 0, 1, 1, 2, 3)))  # a tree
    for (logits, features), (logits_want, features_want) in zip(got, want):
        assert logits.shape == logits_want.shape and features.shape == features_want.shape == (logits.shape[0], 3 * 64)
        assert (logits - logits_want).norm() < 0.02 * logits_want.norm()
        assert (features - features_want).norm() < 0.02 * features_want.norm()
        assert torch.equal(features[:, :64], features_want[:, :64])  # the embeddings: copied rows


def test_what_the_native_step_does_not_take_keeps_the_graphs(avx2_dir: Path) -> None:
    """Products not shared per input, another dtype, torch's products: `native_reason` says why."""
    from pardec_cli.engine.native import native_reason

    model = tiny_llama(5, vocab=96, layers=2, hidden=64)
    assert native_reason(model) == "its output head is not on the AVX2 library"
    quant.quantize_linears(model, "int4")
    quant.use_records(model, "float32")
    use_avx2(model)
    assert native_reason(model) == "its products are not q4q8 or q8q8 records shared per input"
    assert native_reason(native_llama().to(torch.bfloat16)) == "not float32 on a CPU"


def test_the_native_step_s_bad_inputs_are_errors_not_crashes(avx2_dir: Path) -> None:
    from pardec_cli.engine.native import NativeStep
    from pardec_cli.engine.runner import step_mask
    from pardec_cli.engine.static_cache import StaticKVCache

    model = native_llama()
    step = NativeStep(model)
    buffers = StaticKVCache(model.config, 64, dtype=torch.float32, device=torch.device("cpu")).buffers()
    mask, positions = step_mask(0, 2, 64, None, dtype=torch.float32, device=torch.device("cpu"))
    ids = torch.tensor([[5, 7]])
    logits, states = step(ids, positions, mask, 0, buffers, True)
    assert logits.shape == (1, 2, 96) and states is not None and len(states) == 3
    for bad in (
        lambda: step(torch.tensor([[5, 96]]), positions, mask, 0, buffers, False),  # outside the vocabulary
        lambda: step(ids, positions, mask, 63, buffers, False),  # rows past the window
        lambda: step(ids, positions, mask[:, :, :1], 0, buffers, False),  # a mask of another row count
    ):
        with pytest.raises(RuntimeError, match="llama_step"):
            bad()
    for bad in (
        lambda: step(ids, positions, mask, 0, [(k[:, :1].contiguous(), v) for k, v in buffers], False),  # other heads
        lambda: step(ids, positions, mask, 0, buffers[:1], False),  # a layer's cache missing
    ):
        with pytest.raises(RuntimeError, match="set_cache"):
            bad()
    grown = StaticKVCache(model.config, 128, dtype=torch.float32, device=torch.device("cpu")).buffers()
    assert torch.equal(step(ids, positions, mask, 0, grown, False)[0], logits)  # another cache: handed over


def test_a_native_step_that_fails_gives_way_to_the_graphs_with_a_notice(avx2_dir: Path) -> None:
    from pardec_cli.engine.runner import CompiledLanguageModel

    notices: list[str] = []
    runner = CompiledLanguageModel(native_llama(), compile_missing=False, on_notice=notices.append)
    eager = CompiledLanguageModel(native_llama(), compile_missing=False, native=False)

    def broken(*args: Any) -> Any:
        raise RuntimeError("llama_step: something new")

    runner.native = broken  # type: ignore[assignment]
    prompt = random_prompt(5)
    with torch.inference_mode():
        outs = []
        for lm in (runner, eager):
            cache = lm.new_cache(32)
            lm.forward(prompt, cache, last_only=True)
            outs.append(lm.forward([3, 4], cache))
    assert torch.equal(outs[0], outs[1]) and runner.native is None
    assert notices[0] == "the native step failed (RuntimeError: llama_step: something new); compiling the steps instead"


def test_a_prefill_runs_natively_in_chunks_and_gives_a_token_the_bits_of_one_native_step(
    avx2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt, and a chat turn's new text after cached rows, go through the native step
    NATIVE_PREFILL_ROWS rows a call, only the last row's logits computed: the last row's
    logits, the cache rows written and the next steps are those of one native step over
    all the rows (each row is computed alone, whatever the rows and the window beside it)."""
    from pardec_cli.engine import runner as runner_module
    from pardec_cli.engine.runner import CompiledLanguageModel

    monkeypatch.setattr(runner_module, "NATIVE_PREFILL_ROWS", 7)
    model = native_llama()
    runner = CompiledLanguageModel(model, compile_missing=False)
    calls: list[tuple[int, int]] = []  # (rows, logit rows) of each native call
    native = runner.native
    assert native is not None

    def counted(ids: torch.Tensor, *args: Any) -> Any:
        calls.append((ids.shape[1], args[5]))
        return native(ids, *args)

    runner.native = counted  # type: ignore[assignment]
    prompt, turn, tokens = random_prompt(5)[:20], random_prompt(6)[:9], [3, 4, 5]
    with torch.inference_mode():
        chunked = runner.new_cache(64)
        first = runner.forward(prompt, chunked, last_only=True)
        assert calls == [(7, 1), (7, 1), (6, 1)] and chunked.length == 20
        second = runner.forward(turn, chunked, last_only=True)
        assert calls[3:] == [(7, 1), (2, 1)] and chunked.length == 29
        after = runner.forward(tokens, chunked)
        whole = runner.new_cache(64)
        want_first = runner.forward(prompt, whole)  # not last_only: one step of 20 rows, every row's logits
        want_second = runner.forward(turn, whole)
        want_after = runner.forward(tokens, whole)
    assert first.shape == (1, 96) and torch.equal(first[0], want_first[-1]) and torch.equal(second[0], want_second[-1])
    assert torch.equal(after, want_after)
    for (k, v), (k_want, v_want) in zip(chunked.buffers(), whole.buffers()):
        assert torch.equal(k[:, :, :32], k_want[:, :, :32]) and torch.equal(v[:, :, :32], v_want[:, :, :32])
    # Past NATIVE_PREFILL_MAX rows of cache (there, the eager prefill's blocked causal
    # attention is as fast): eager.
    monkeypatch.setattr(runner_module, "NATIVE_PREFILL_MAX", 40)
    before = len(calls)
    with torch.inference_mode():
        runner.forward(turn, chunked, last_only=True)
    assert len(calls) == before and chunked.length == 41


@pytest.mark.parametrize("rows", [3, 9])
def test_a_native_step_gives_the_same_bits_on_one_thread_and_on_several(avx2_dir: Path, rows: int) -> None:
    """A wide step shares out its rows' quantization, norms, RoPE and SiLU, and attention's
    queries, over torch's threads: no row's arithmetic may change with how they are shared."""
    from pardec_cli.engine.native import NativeStep
    from pardec_cli.engine.runner import step_mask
    from pardec_cli.engine.static_cache import StaticKVCache

    model = native_llama()
    cpu = torch.device("cpu")
    prompt = torch.tensor([random_prompt(5)[:20]])
    mask, positions = step_mask(0, 20, 32, None, dtype=torch.float32, device=cpu)
    wide_mask, wide_positions = step_mask(20, rows, 32, None, dtype=torch.float32, device=cpu)
    ids = torch.tensor([random_prompt(6)[:rows]])
    threads, outs = torch.get_num_threads(), []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            step = NativeStep(model)
            buffers = StaticKVCache(model.config, 32, dtype=torch.float16, device=cpu).buffers()
            step(prompt, positions, mask, 0, buffers, False)
            outs.append(step(ids, wide_positions, wide_mask, 20, buffers, False)[0])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_the_native_step_computes_the_last_rows_logits_alone_on_request(avx2_dir: Path) -> None:
    from pardec_cli.engine.native import NativeStep
    from pardec_cli.engine.runner import step_mask
    from pardec_cli.engine.static_cache import StaticKVCache

    model = native_llama()
    cpu = torch.device("cpu")
    mask, positions = step_mask(0, 5, 64, None, dtype=torch.float32, device=cpu)
    ids = torch.tensor([[5, 7, 11, 2, 9]])
    every = NativeStep(model)(ids, positions, mask, 0, StaticKVCache(model.config, 64, dtype=torch.float16, device=cpu).buffers(), False)[0]
    for rows in (1, 3, 5, 8):
        step = NativeStep(model)
        buffers = StaticKVCache(model.config, 64, dtype=torch.float16, device=cpu).buffers()
        assert torch.equal(step(ids, positions, mask, 0, buffers, False, rows)[0], every[:, -min(rows, 5):])
    with pytest.raises(RuntimeError, match="logit_rows must be >= -1"):
        step(ids, positions, mask, 0, buffers, False, -2)


@pytest.mark.parametrize("head", ["int8", "float32"])
def test_a_step_without_its_head_returns_the_rows_whose_head_gives_the_step_s_logits(avx2_dir: Path, head: str) -> None:
    """`NO_HEAD`: the final-normed rows come back instead of logits, and `head` of any of
    them, alone or together, gives the bits of the whole step's logits of those rows."""
    from pardec_cli.engine.native import NO_HEAD, NativeStep
    from pardec_cli.engine.runner import step_mask
    from pardec_cli.engine.static_cache import StaticKVCache

    model = native_llama(head=head)
    cpu = torch.device("cpu")
    mask, positions = step_mask(0, 7, 64, None, dtype=torch.float32, device=cpu)
    ids = torch.tensor([random_prompt(3)[:7]])
    every = NativeStep(model)(ids, positions, mask, 0, StaticKVCache(model.config, 64, dtype=torch.float16, device=cpu).buffers(), False)[0][0]
    step = NativeStep(model)
    normed = step(ids, positions, mask, 0, StaticKVCache(model.config, 64, dtype=torch.float16, device=cpu).buffers(), False, NO_HEAD)[0][0]
    assert normed.shape == (7, model.config.hidden_size)
    assert torch.equal(step.head(normed), every)
    for lo, hi in ((0, 1), (2, 6), (6, 7)):
        assert torch.equal(step.head(normed[lo:hi]), every[lo:hi])
    with pytest.raises(RuntimeError, match="llama_head: rows must be float32"):
        step.head(torch.zeros(2, model.config.hidden_size + 1))


def test_verification_reads_the_native_step_s_head_rows_as_it_needs_them(avx2_dir: Path) -> None:
    """A step of more rows than a tile comes from `forward_rows` as `HeadRows` (once the
    native step was checked): the head runs for the first tile, then for the other rows once
    one of them is read, and every row is
    the bits `forward` gives, for a chain and a tree; a tile's worth of rows or fewer, or a
    step before the check, comes as the logits tensor."""
    from pardec_cli.engine.cache import rollback_to
    from pardec_cli.engine.runner import CompiledLanguageModel
    from pardec_cli.engine.verify import HeadRows

    runner = CompiledLanguageModel(native_llama(), compile_missing=False)
    tile = runner.row_tile
    prompt, tokens = random_prompt(5), random_prompt(6)[: 3 * tile]
    tree = (-1, 0, 0, *range(2, len(tokens) - 2))  # two children under the first node, a chain under the second
    with torch.inference_mode():
        cache = runner.new_cache(64)
        assert isinstance(runner.forward_rows(prompt, cache), torch.Tensor)  # the first native step: checked, with logits
        start = cache.length
        fulls = []
        for parents in (None, tree):
            full = runner.forward(tokens, cache, parents=parents)
            fulls.append(full)
            rollback_to(cache, start)
            rows = runner.forward_rows(tokens, cache, parents=parents)
            assert isinstance(rows, HeadRows) and cache.length == start + len(tokens) and len(rows) == len(tokens)
            assert torch.equal(rows[0], full[0]) and rows.computed() == tile
            assert rows.argmax(tile + 1) == int(full[tile + 1].argmax()) and rows.computed() == len(tokens)
            assert all(torch.equal(rows[i], full[i]) for i in range(len(tokens))) and torch.equal(rows[-1], full[-1])
            rollback_to(cache, start)
        few = runner.forward_rows(tokens[:tile], cache)
        assert isinstance(few, torch.Tensor) and torch.equal(few, fulls[0][:tile])


@pytest.mark.parametrize("start,rows,window", [(0, 1, 32), (20, 1, 32), (20, 3, 32), (20, 3, 64), (19, 2, 21)])
def test_a_chain_without_a_mask_is_the_step_with_step_mask_s_mask(avx2_dir: Path, start: int, rows: int, window: int) -> None:
    """A chain's positions and causal mask made by the op (none handed in, only the window
    it attends) give the bits of the step handed `runner.step_mask`'s, and the same cache rows."""
    from pardec_cli.engine.native import NativeStep
    from pardec_cli.engine.runner import step_mask
    from pardec_cli.engine.static_cache import StaticKVCache

    model = native_llama()
    cpu = torch.device("cpu")
    ids = torch.tensor([random_prompt(7)[:rows]])
    outs, caches = [], []
    for given in (True, False):
        step = NativeStep(model)
        buffers = StaticKVCache(model.config, 64, dtype=torch.float16, device=cpu).buffers()
        if start:
            mask, positions = step_mask(0, start, 64, None, dtype=torch.float32, device=cpu)
            step(torch.tensor([random_prompt(5)[:start]]), positions, mask, 0, buffers, False)
        mask, positions = step_mask(start, rows, window, None, dtype=torch.float32, device=cpu)
        got = step(ids, positions, mask, start, buffers, True) if given else step(ids, None, None, start, buffers, True, 0, window)
        outs.append(got)
        caches.append([k.clone() for k, _ in buffers] + [v.clone() for _, v in buffers])
    (logits, states), (logits_chain, states_chain) = outs
    assert torch.equal(logits, logits_chain)
    assert states is not None and states_chain is not None and all(torch.equal(a, b) for a, b in zip(states, states_chain))
    assert all(torch.equal(a, b) for a, b in zip(*caches))


def test_a_chain_without_a_mask_needs_a_window_that_holds_it(avx2_dir: Path) -> None:
    from pardec_cli.engine.native import NativeStep
    from pardec_cli.engine.static_cache import StaticKVCache

    model = native_llama()
    step = NativeStep(model)
    buffers = StaticKVCache(model.config, 64, dtype=torch.float32, device=torch.device("cpu")).buffers()
    ids = torch.tensor([[5, 7]])
    for start, window in ((0, 0), (0, 1), (10, 11), (0, 65)):  # none, rows past the window, a window past the cache
        with pytest.raises(RuntimeError, match="llama_step"):
            step(ids, None, None, start, buffers, False, 0, window)


def test_the_runner_s_chain_steps_hand_the_native_step_no_mask_once_it_was_checked(avx2_dir: Path) -> None:
    """After the first native step (checked against the eager one, so with a mask), chains
    go without mask and positions; a tree still gets its mask. The logits are what the same
    steps with masks give."""
    from pardec_cli.engine.runner import CompiledLanguageModel, attended_rows, step_mask

    calls: list[tuple[bool, int]] = []  # (mask handed in, window)
    runs = []
    for spy in (True, False):
        runner = CompiledLanguageModel(native_llama(), compile_missing=False)
        native = runner.native
        assert native is not None
        if spy:
            def recorded(*args: Any, native: Any = native) -> Any:
                calls.append((args[2] is not None, args[7]))
                return native(*args)
            runner.native = recorded  # type: ignore[assignment]
        else:  # the same steps, each handed step_mask's mask
            def masked(ids: Any, positions: Any, mask: Any, start: int, buffers: Any, hidden: bool, logit_rows: int = 0,
                       window: int = 0, native: Any = native) -> Any:  # fmt: skip
                if mask is None:
                    mask, positions = step_mask(start, ids.shape[-1], window, None, dtype=torch.float32, device=torch.device("cpu"))
                return native(ids, positions, mask, start, buffers, hidden, logit_rows)
            runner.native = masked  # type: ignore[assignment]
        with torch.inference_mode():
            cache = runner.new_cache(32)
            runner.forward(random_prompt(5)[:6], cache, last_only=True)
            out = [runner.forward([3], cache), runner.forward([4, 5, 6], cache), runner.forward([7, 8, 9, 10], cache, parents=(-1, -1, 0))]
        runs.append(out)
    assert calls[0][0] is True  # the prefill: the checked first step
    assert calls[1:] == [(False, attended_rows(7, cache.capacity, False)), (False, attended_rows(10, cache.capacity, False)), (True, 0)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_q4q8_loads_on_the_avx2_library_where_avx512_vnni_is_missing(
    avx2_dir: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """Asked for, q4q8 takes the AVX2 library (built at once where it is not: the load
    waits, with a notice), its layers straight from the GGUF's blocks, the head on int8."""
    from pardec_cli.home import kernels_dir
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    monkeypatch.setattr(kernels, "cpu_supported", lambda flags, activations: False)  # no AVX512-VNNI
    monkeypatch.setattr(kernels, "avx2_runs", lambda flags: True)
    path = import_gguf(tiny_gguf, "tiny-q")
    built: list[Path] = []
    monkeypatch.setattr(kernels, "build", lambda directory: built.append(directory))
    store = kernels.build_dir(kernels_dir(), LIBRARY)
    store.mkdir(parents=True)
    (store / f"{kernels.AVX2.name}.so").symlink_to(avx2_dir / f"{kernels.AVX2.name}.so")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="q4q8")
    assert built == []  # built already: no wait
    layer = model.model.layers[0].mlp.down_proj
    assert isinstance(layer, quant.Int4Records) and layer.activations == "float32"
    assert quant.weights_label(model) == "q4q8" and isinstance(model.get_output_embeddings(), quant.Int8F32Head)
    from pardec_cli.engine.native import native_reason

    assert native_reason(model) is None  # a GGUF's 4-bit Llama is what the native step takes
    full, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    assert torch.equal(layer.dequantize(), full.model.layers[0].mlp.down_proj.weight)  # the GGUF's weights exactly
    ids = torch.tensor([random_prompt(7, 10)])
    with torch.no_grad():
        got, want = model(ids).logits, full(ids).logits
    assert (got - want).norm() < 0.1 * want.norm()
    # --weights auto takes it for 4-bit blocks in float32 once the kernels are built here
    # (not for a bfloat16 load, nor with PARDEC_KERNELS=0).
    monkeypatch.setenv("PARDEC_KERNELS", "1")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="auto")
    assert quant.weights_label(model) == "q4q8"
    monkeypatch.setenv("PARDEC_KERNELS", "0")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="auto")
    assert quant.weights_label(model) == "full"
    # Not built in this store: built now (the load waits for it, with a notice).
    (store / f"{kernels.AVX2.name}.so").unlink()
    started: list[Path] = []
    monkeypatch.setenv("PARDEC_KERNELS", "1")
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: started.append(directory) or True)
    model, _ = load_model(path, dtype="float32", device="cpu", weights="auto")  # auto does not wait for a build
    assert quant.weights_label(model) == "full" and set(started) == {store}
    notices: list[str] = []
    monkeypatch.setattr(kernels, "load", lambda directory: bool(built))
    monkeypatch.setattr(kernels, "loaded", lambda library=None: True)
    load_model(path, dtype="float32", device="cpu", weights="q4q8", notice=notices.append)
    assert built == [store] and notices and "once" in notices[0]


# -------------------------------------------------------------- attention in float32


def float32_attention_inputs(rows: int, heads: int, kv_heads: int, dim: int, width: int):
    from tests.test_int4_kernels import attention_inputs

    query, cache_k, cache_v, mask = attention_inputs(rows, heads, kv_heads, dim, width)
    return query.float(), cache_k.float(), cache_v.float(), mask


@pytest.mark.parametrize("rows", [1, 3, 9, 33])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 16), (2, 1, 48), (8, 2, 128)])
def test_the_float32_attention_op_computes_softmax_attention(avx2_dir: Path, rows: int, heads: int, kv_heads: int, dim: int) -> None:
    from tests.test_int4_kernels import reference_attention

    query, cache_k, cache_v, mask = float32_attention_inputs(rows, heads, kv_heads, dim, width=70)
    key, value = cache_k[:, :, :70], cache_v[:, :, :70]  # windows of the cache: strided views
    got = torch.ops.pardec_avx2.attention(query, key, value, mask, dim**-0.5)
    assert got.shape == (1, rows, heads, dim) and got.dtype == torch.float32
    assert (got.double() - reference_attention(query, key, value, mask, dim**-0.5)).abs().max() < 1e-5


def test_a_float32_attention_row_is_the_same_bits_alone_beside_other_rows_and_in_any_window(avx2_dir: Path) -> None:
    """What keeps speculation exact with q4q8's int8 activations, where SDPA's last bits
    moved a token's logits by up to ~2 between a decoding and a verifying step."""
    query, cache_k, cache_v, mask = float32_attention_inputs(12, 9, 3, 64, width=100)
    together = torch.ops.pardec_avx2.attention(query, cache_k[:, :, :100], cache_v[:, :, :100], mask, 0.125)
    for r in (0, 5, 11):
        seen = 100 - 12 + r + 1
        for width in sorted({seen, min(seen + 3, 108), min(seen + 16, 108), 108}):
            alone_mask = torch.full((1, 1, 1, width), torch.finfo(torch.float32).min)
            alone_mask[..., :seen] = 0
            alone = torch.ops.pardec_avx2.attention(query[:, :, r : r + 1], cache_k[:, :, :width], cache_v[:, :, :width], alone_mask, 0.125)
            assert torch.equal(alone[0, 0], together[0, r]), (r, width)
    # A tree's row: the same keys at other slots of the window (siblings masked between them).
    sources = [*range(50), 56, 57, 58, 59]
    chain = torch.ops.pardec_avx2.attention(query[:, :, :1], cache_k[:, :, sources], cache_v[:, :, sources], torch.zeros(1, 1, 1, 54), 0.125)
    tree_k, tree_v = torch.zeros(1, 3, 64, 64), torch.zeros(1, 3, 64, 64)
    tree_mask = torch.full((1, 1, 1, 64), float("-inf"))
    for slot, source in zip([*range(50), 50, 53, 57, 58], sources):
        tree_k[:, :, slot], tree_v[:, :, slot], tree_mask[..., slot] = cache_k[:, :, source], cache_v[:, :, source], 0
    assert torch.equal(torch.ops.pardec_avx2.attention(query[:, :, :1], tree_k, tree_v, tree_mask, 0.125), chain)


def test_how_the_float32_attention_op_shares_out_its_rows_changes_no_bits(avx2_dir: Path) -> None:
    """The op serves a KV head's rows in chunks sized by the thread count (they share the
    key and value loads): a row's bits must not depend on the chunking."""
    query, cache_k, cache_v, mask = float32_attention_inputs(16, 9, 3, 64, width=90)
    key, value = cache_k[:, :, :90], cache_v[:, :, :90]
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(torch.ops.pardec_avx2.attention(query, key, value, mask, 0.125))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], other) for other in results[1:])
    # Two sequences in a batch: each the same bits as alone.
    pair = torch.ops.pardec_avx2.attention(torch.cat([query, query.flip(2)]), torch.cat([key, key]), torch.cat([value, value]),
                                           torch.cat([mask, mask]), 0.125)  # fmt: skip
    assert torch.equal(pair[:1], results[0])


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_attention_over_a_float16_cache_is_the_float32_op_over_the_same_values(avx2_dir: Path, rows: int) -> None:
    """q4q8 models keep their cache in float16 (`runner.kv_dtype`): the op widens each value
    exactly, so its rows are the float32 op's over the rounded cache, bit for bit."""
    query, cache_k, cache_v, mask = float32_attention_inputs(rows, 9, 3, 64, width=70)
    k16, v16 = cache_k.half(), cache_v.half()
    got = torch.ops.pardec_avx2.attention(query, k16[:, :, :70], v16[:, :, :70], mask, 0.125)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.ops.pardec_avx2.attention(query, k16[:, :, :70].float(), v16[:, :, :70].float(), mask, 0.125))
    # Through transformers' interface too, and a prefill too long for the op widens the cache
    # for `cpu_attention` (float32 queries, float16 keys and values).
    from pardec_cli.engine.attention import MAX_ROWS, cpu_attention, kernel_attention

    module = type("Attention", (), {"head_dim": 64})()
    assert torch.equal(kernel_attention(module, query, k16[:, :, :70], v16[:, :, :70], mask, scaling=0.125)[0], got)
    long_q, long_k, long_v, long_mask = float32_attention_inputs(MAX_ROWS + 6, 9, 3, 64, width=80)
    long = kernel_attention(module, long_q, long_k.half()[:, :, :80], long_v.half()[:, :, :80], long_mask, scaling=0.125)[0]
    want = cpu_attention(module, long_q, long_k.half()[:, :, :80].float(), long_v.half()[:, :, :80].float(), long_mask, scaling=0.125)[0]
    assert long.dtype == torch.float32 and torch.equal(long, want)


def test_the_native_step_rounds_the_rows_it_writes_to_a_float16_cache_as_torch_does(avx2_dir: Path) -> None:
    from pardec_cli.engine.native import NativeStep
    from pardec_cli.engine.runner import step_mask
    from pardec_cli.engine.static_cache import StaticKVCache

    model = native_llama()
    cpu = torch.device("cpu")
    wide = StaticKVCache(model.config, 64, dtype=torch.float32, device=cpu).buffers()
    narrow = StaticKVCache(model.config, 64, dtype=torch.float16, device=cpu).buffers()
    mask, positions = step_mask(0, 3, 64, None, dtype=torch.float32, device=cpu)
    ids = torch.tensor([[5, 7, 11]])
    # Each step object holds one cache. The first layer's keys and values are the same
    # whatever the cache (later layers' differ: attention has read the rounded rows).
    NativeStep(model)(ids, positions, mask, 0, wide, False)
    NativeStep(model)(ids, positions, mask, 0, narrow, False)
    (k32, v32), (k16, v16) = wide[0], narrow[0]
    assert all(k.dtype == v.dtype == torch.float16 for k, v in narrow)
    assert torch.equal(k16[:, :, :3], k32[:, :, :3].half()) and torch.equal(v16[:, :, :3], v32[:, :, :3].half())
    assert k16[:, :, :3].abs().min() > 0 and k16[:, :, 3:].abs().sum() == 0  # 3 rows written, no more


def test_the_runner_keeps_a_q4q8_model_s_cache_in_float16_and_others_in_their_dtype(
    avx2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pardec_cli.engine import runner as runner_module
    from pardec_cli.engine.runner import CompiledLanguageModel, kv_dtype, step_fingerprint

    model = native_llama()
    before = step_fingerprint(model)  # as the session asks, before a runner sets the attention
    assert kv_dtype(model) == torch.float16
    q4q8 = CompiledLanguageModel(model, compile_missing=False)
    assert q4q8.kv_dtype == torch.float16 and q4q8.new_cache(16).buffers()[0][0].dtype == torch.float16
    dense = tiny_llama(3, vocab=96, layers=2, hidden=64)
    use_avx2(dense)  # float32 layers on the kernels: float32 stays exact to the model
    assert CompiledLanguageModel(dense, compile_missing=False).kv_dtype == torch.float32
    assert CompiledLanguageModel(tiny_llama(3, vocab=96, layers=2, hidden=64).bfloat16(), compile_missing=False).kv_dtype == torch.bfloat16
    # The cache's buffers are inputs of a saved step: its dtype is in the step's fingerprint.
    assert step_fingerprint(model) == before
    monkeypatch.setattr(runner_module, "kv_dtype", lambda m: torch.float32)
    assert step_fingerprint(model) != before


def test_a_float32_model_on_the_kernels_attends_causally_however_long_its_prompt(avx2_dir: Path) -> None:
    """An eager prefill longer than the op's MAX_ROWS goes to `cpu_attention` without a mask
    from transformers: each row still sees only the tokens up to its own (`causal_mask`)."""
    from pardec_cli.engine.attention import MAX_ROWS
    from pardec_cli.engine.runner import use_row_exact_attention

    model = tiny_llama(3, vocab=96, layers=2, hidden=64)
    use_avx2(model)
    assert use_row_exact_attention(model)
    ids = torch.randint(0, 96, (1, MAX_ROWS + 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        short = model(ids[:, :40]).logits  # on the op
        long = model(ids).logits  # past MAX_ROWS: the matmul path
    assert torch.allclose(long[:, :40], short, atol=1e-4)


def test_bad_float32_attention_inputs_are_errors_not_crashes(avx2_dir: Path) -> None:
    query, cache_k, cache_v, mask = float32_attention_inputs(2, 4, 2, 32, width=20)
    key, value = cache_k[:, :, :20], cache_v[:, :, :20]
    attention = torch.ops.pardec_avx2.attention
    with pytest.raises(RuntimeError, match="float32"):
        attention(query.bfloat16(), key, value, mask, 0.1)
    with pytest.raises(RuntimeError, match="float32"):
        attention(query, key, value, mask.bfloat16(), 0.1)
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        attention(query, key.half(), value, mask, 0.1)
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        attention(query, key.bfloat16(), value.bfloat16(), mask, 0.1)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        attention(query, cache_k[:, :1, :20], value, mask, 0.1)
    with pytest.raises(RuntimeError, match="mask"):
        attention(query, key, value, mask[..., :19], 0.1)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        attention(query[..., :20], key[..., :20], value[..., :20], mask, 0.1)  # head size not a multiple of 8


def test_float32_models_on_the_avx2_kernels_take_pardec_s_attention_eager_and_compiled(avx2_dir: Path) -> None:
    from pardec_cli.engine.attention import KERNEL_ATTENTION, kernel_attention
    from pardec_cli.engine.runner import runner_attention, use_row_exact_attention

    model = tiny_llama(3, vocab=96, layers=2, hidden=64)
    assert runner_attention(model) == "sdpa" and not use_row_exact_attention(model)  # torch's products: SDPA
    use_avx2(model)
    assert runner_attention(model) == KERNEL_ATTENTION
    ids = torch.tensor([random_prompt(2, 9)])
    with torch.no_grad():
        before = model(ids).logits
        assert use_row_exact_attention(model) and model.config._attn_implementation == KERNEL_ATTENTION
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)

    class Module:
        head_dim, num_key_value_groups, training = 16, 1, False

    query, cache_k, cache_v, mask = float32_attention_inputs(3, 4, 4, 16, width=20)
    got, _ = kernel_attention(Module(), query, cache_k[:, :, :20], cache_v[:, :, :20], mask)
    assert torch.equal(got, torch.ops.pardec_avx2.attention(query, cache_k[:, :, :20], cache_v[:, :, :20], mask, 0.25))


# -------------------------------------------------------------- loading and building


def test_auto_runs_a_gguf_s_4_bit_blocks_in_float32_on_the_native_step_once_its_kernels_are_built(
    avx2_dir: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """--dtype auto weighs whether the native step's kernels are built (`native_auto`): a
    first load keeps the CPU's dtype and starts their build; a later one runs float32 q4q8."""
    from pardec_cli.home import kernels_dir
    from pardec_cli.session import Session
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import native_auto

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    path = import_gguf(tiny_gguf, "tiny-q")
    started: list[Path] = []
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: started.append(directory) or True)
    assert not native_auto(path) and started == []  # doctor and tune ask without building
    assert not native_auto(path, start=True) and started == [kernels.build_dir(kernels_dir(), LIBRARY)]
    built_in(started[0], avx2_dir)
    assert native_auto(path)
    session = Session.load("tiny-q", compile="auto")
    assert (session.dtype, session.weights) == ("float32", "q4q8")
    assert session.target.native is not None  # type: ignore[attr-defined]
    assert Session.load("tiny-q", dtype="bfloat16", compile="off").dtype == "bfloat16"  # asked for: kept
    assert native_auto(path, "q4q8") and native_auto(path, "q8q8")
    # Weights the native step does not run are eager steps: the CPU's own dtype, bfloat16 where
    # it has bfloat16 hardware (float32 made `--weights int4` 16x slower on a Zen 5 EPYC).
    with_bf16(monkeypatch, True)
    for weights in ("int4", "int8", "full"):
        assert not native_auto(path, weights)
        assert Session.load("tiny-q", weights=weights, compile="off").dtype == "bfloat16"
    assert Session.load("tiny-q", compile="off").dtype == "float32"
    # A dense model: q4q8 and q8q8 asked for run on the native step too (q4q8 in bfloat16 was
    # 115 tok/s against 432 in float32 there); int8 stays eager, in bfloat16.
    dense = path.parent / "dense"
    tiny_llama(3, vocab=96, layers=2, hidden=64).save_pretrained(dense)
    assert native_auto(dense, "q4q8") and native_auto(dense, "q8q8") and not native_auto(dense, "int8")
    assert not native_auto(None)
    monkeypatch.setenv("PARDEC_KERNELS", "0")  # auto's choice falls back to torch's kernels; asked for, q4q8 does not
    assert not native_auto(path) and native_auto(dense, "q4q8")


def test_float32_loads_take_the_avx2_kernels_once_built_in_the_store(
    avx2_dir: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from pardec_cli.home import kernels_dir
    from pardec_cli.store.gguf_import import import_gguf
    from pardec_cli.store.loading import load_model

    monkeypatch.setenv("PARDEC_KERNELS", "1")
    monkeypatch.setattr(kernels, "avx2_runs", lambda flags: True)
    path = import_gguf(tiny_gguf, "tiny-q")
    started: list[Path] = []
    monkeypatch.setattr(kernels, "build_in_background", lambda directory: started.append(directory) or True)
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    # Not built in this store: torch's products now, and a build starts for the next run.
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert started == [kernels.build_dir(kernels_dir(), LIBRARY)]
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
    monkeypatch.setattr(kernels, "avx2_runs", lambda flags: False)
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    assert not any(isinstance(m, F32Linear) for m in model.modules())
    monkeypatch.setattr(kernels, "avx2_runs", lambda flags: True)
    monkeypatch.setenv("PARDEC_KERNELS", "0")
    model, _ = load_model(path, dtype="float32", device="cpu", weights="full")
    assert not any(isinstance(m, F32Linear) for m in model.modules())


def test_every_cpu_with_avx2_fma_and_f16c_runs_the_avx2_library_avx512_ones_too() -> None:
    # On AVX512 too: q4q8 on the native step, and dense and int8 float32 layers (1.6-2.0x and
    # 4-24x torch's AVX512 products at 1-32 rows on a Zen 5, docs/weights.md).
    assert kernels.avx2_runs({"avx2", "fma", "f16c"}) and kernels.avx2_runs({"avx2", "fma", "f16c", "avx512f"})
    assert not kernels.avx2_runs({"avx2"}) and not kernels.avx2_runs({"fma"})
    assert not kernels.avx2_runs({"avx2", "fma"})  # q4q8_mm reads float16 scales (F16C)


def test_a_cpu_with_avx512_vnni_gets_the_vnni_build(tmp_path: Path) -> None:
    assert kernels.avx2_library({"avx2", "fma", "f16c"}) is kernels.AVX2
    assert kernels.avx2_library({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}) is kernels.AVX2_VNNI
    assert kernels.avx2_library({"avx2", "fma", "f16c", "avx512_vnni", "avx512bw"}) is kernels.AVX2  # 256-bit VPDPBUSD needs VL
    assert kernels.avx2_library({"avx2", "fma", "f16c", "avx512_vnni", "avx512vl"}) is kernels.AVX2  # its 512-bit q4q8 needs BW
    vnni = kernels.build_dir(tmp_path, kernels.AVX2_VNNI)
    assert vnni.name.startswith("avx2vnni-") and vnni != kernels.build_dir(tmp_path, kernels.AVX2)
    assert kernels.library_of(vnni) is kernels.AVX2_VNNI


@pytest.mark.skipif(LIBRARY is not kernels.AVX2_VNNI, reason="this CPU lacks AVX512-VNNI")
def test_the_vnni_build_gives_the_same_bits_as_the_avx2_one(avx2_dir: Path, tmp_path: Path) -> None:
    """VPDPBUSD sums a lane's 4 byte products exactly, as VPMADDUBSW + VPMADDWD do, and the
    512-bit kernels do per lane what the 256-bit ones do: q4q8 and the int8 head (9 rows: a
    tile of 8 and one more against tiles of 4), and attention (head sizes 64, 128 and 48,
    float16 and float32 caches) give the same bits from either build (the other build runs
    in a process of its own: both register pardec_avx2)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 256, generator=g)
    blocks = torch.randint(0, 256, (4, 8, 320), dtype=torch.uint8, generator=g)
    blocks[:, :, 256:] = torch.rand(4, 8, 32, generator=g).half().view(torch.uint8).view(4, 8, 64)  # sane f16 scales
    q = torch.randint(-128, 128, (48, 256), dtype=torch.int8, generator=g)
    q[:, :5] = -128  # VPDPBUSD's unsigned q + 128 and VPMADDUBSW's |q| (128 as a byte) both take it
    q = quant.pack_head(q)
    scales = torch.rand(48, generator=g)
    inputs = {"x": x, "blocks": blocks, "q": q, "scales": scales}
    expressions = ["ops.q4q8_mm(i['x'], i['blocks'], 64)", "ops.q8q8_mm(i['x'], i['q'], i['scales'])"]
    for n, (heads, kv_heads, dim, dtype) in enumerate([(9, 3, 64, torch.half), (9, 3, 64, torch.float),
                                                       (8, 2, 128, torch.half), (2, 1, 48, torch.float)]):  # fmt: skip
        query, cache_k, cache_v, mask = float32_attention_inputs(5, heads, kv_heads, dim, width=37)
        inputs |= {f"q{n}": query, f"k{n}": cache_k.to(dtype), f"v{n}": cache_v.to(dtype), f"m{n}": mask}
        expressions.append(f"ops.attention(i['q{n}'], i['k{n}'][:, :, :37], i['v{n}'][:, :, :37], i['m{n}'], {dim**-0.5})")
    ours = [eval(e, {"i": inputs, "ops": torch.ops.pardec_avx2}) for e in expressions]
    theirs = on_the_plain_build(tmp_path, inputs, f"[{', '.join(expressions)}]")
    assert all(torch.isfinite(o).all() and torch.equal(o, t) for o, t in zip(ours, theirs, strict=True))


def on_the_plain_build(tmp_path: Path, inputs: dict[str, torch.Tensor], expression: str) -> Any:
    """`expression` over the `inputs` (as `i`; the library's ops as `ops`), computed by the
    plain AVX2 build of the library in a process of its own: both builds register pardec_avx2."""
    other = kernels.build_dir(tmp_path / "kernels", kernels.AVX2)
    torch.save(inputs, tmp_path / "inputs.pt")
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from pardec_cli import kernels\n"
        "kernels.build(Path(sys.argv[1]))\n"
        "i, ops = torch.load(sys.argv[2]), torch.ops.pardec_avx2\n"
        f"torch.save({expression}, sys.argv[3])\n"
    )
    subprocess.run([sys.executable, "-c", script, str(other), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                   check=True, timeout=600)  # fmt: skip
    return torch.load(tmp_path / "out.pt")


def test_each_library_builds_in_its_own_directory(tmp_path: Path) -> None:
    avx2, avx512 = kernels.build_dir(tmp_path, kernels.AVX2), kernels.build_dir(tmp_path)
    assert avx2 != avx512 and avx2.name.startswith("avx2-") and avx512.name.startswith("int4-")
    assert kernels.library_of(avx2) is kernels.AVX2 and kernels.library_of(avx512) is kernels.AVX512
    assert kernels.status(avx2) == "not built"
    assert kernels.source_digest(kernels.AVX2) != kernels.source_digest(kernels.AVX512)


def test_doctor_says_whether_the_avx2_kernels_run_here() -> None:
    from pardec_cli.cli.doctor import _kernels_lines

    base = {"dir": "/k/int4-abc", "status": "not built", "enabled": True, "bfloat16": False, "int8": False,
            "float32": True, "avx2_dir": "/k/avx2-def", "avx2_status": "built"}  # fmt: skip
    assert _kernels_lines(base) == ["pardec's, built in /k/avx2-def: full, int8, q4q8 and q8q8 weights in float32"]
    assert "first load in float32" in _kernels_lines({**base, "avx2_status": "not built"})[0]
    assert "PARDEC_KERNELS=0" in _kernels_lines({**base, "enabled": False})[0]
    assert "lacks AVX2" in _kernels_lines({**base, "float32": False})[0]
    # An AVX512 CPU runs both libraries: bfloat16 on one, float32 on the other.
    both = _kernels_lines({**base, "bfloat16": True, "int8": True, "status": "built"})
    assert both == ["pardec's, built in /k/int4-abc: int4, int8 and full weights in bfloat16, --weights q4q8 in bfloat16",
                    "pardec's, built in /k/avx2-def: full, int8, q4q8 and q8q8 weights in float32"]


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
