"""`pardec doctor` knows the floor: the memory bandwidth (a copy test), the bytes of weights
one forward reads, the least time a forward can take at that bandwidth, and the measured
one-token forward as a multiple of it."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
from safetensors import safe_open

from pardec_cli.doctor import FLOOR_ROUNDS, bandwidth_floor_ms, floor_multiple, kv_cache_bytes, weight_bytes
from pardec_cli.hardware import measure_memory_bandwidth
from tests.cli_helpers import invoke
from tests.tiny_models import tiny_llama

# -- the arithmetic -------------------------------------------------------------------


def test_the_floor_is_the_weights_read_at_the_measured_bandwidth():
    # The figures: 270 MB of bf16 weights at 27 GB/s take 10 ms.
    assert bandwidth_floor_ms(270_000_000, 27.0) == pytest.approx(10.0)
    assert bandwidth_floor_ms(1_000_000_000, 1.0) == pytest.approx(1000.0)
    with pytest.raises(ValueError):
        bandwidth_floor_ms(1, 0.0)


def test_the_multiple_says_how_far_a_forward_is_from_the_floor():
    assert floor_multiple(16.6, 10.0) == pytest.approx(1.66)
    assert floor_multiple(10.0, 10.0) == 1.0


def test_weight_bytes_leave_out_the_input_embedding_a_lookup_barely_reads():
    model = tiny_llama(vocab=96, layers=2, hidden=32)  # untied: the LM head is its own matrix
    every = sum(p.numel() * 4 for p in model.parameters()) + sum(b.numel() * b.element_size() for b in model.buffers())
    assert weight_bytes(model) == every - 96 * 32 * 4


def test_tied_embeddings_count_once_as_the_lm_head_that_reads_them_whole():
    model = tiny_llama(vocab=96, layers=2, hidden=32)
    untied = weight_bytes(model)
    model.lm_head.weight = model.model.embed_tokens.weight
    assert weight_bytes(model) == untied  # one 96 x 32 matrix read whole by the LM head, as before


def test_a_tied_head_on_int8_counts_its_int8_copy_and_not_the_dense_embedding():
    from pardec_cli.quant import quantize_head

    model = tiny_llama(vocab=96, layers=2, hidden=32)
    model.lm_head.weight = model.model.embed_tokens.weight
    tied = weight_bytes(model)
    assert quantize_head(model)
    # The 96 x 32 float32 matrix gives way to its int8 codes, 96 row scales and 32 column
    # factors (and a zero point, with oneDNN's prepacked codes).
    zero_point = 8 if hasattr(model.get_output_embeddings(), "packed") else 0
    assert weight_bytes(model) == tied - 96 * 32 * 4 + 96 * 32 + 96 * 4 + 32 * 4 + zero_point


def test_an_untied_head_on_int8_counts_its_int8_copy_and_not_its_dense_weight():
    """Llama-3-style untied heads keep their dense weight for readers of
    get_output_embeddings(); a decoding step reads only the int8 copy."""
    from pardec_cli.quant import quantize_head

    model = tiny_llama(vocab=96, layers=2, hidden=32)  # untied
    untied = weight_bytes(model)
    assert quantize_head(model)
    zero_point = 8 if hasattr(model.get_output_embeddings(), "packed") else 0
    assert weight_bytes(model) == untied - 96 * 32 * 4 + 96 * 32 + 96 * 4 + 32 * 4 + zero_point


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_head_on_pardec_s_bfloat16_kernel_counts_its_copy_once(tied: bool) -> None:
    from pardec_cli.quant import BF16Head

    model = tiny_llama(vocab=96, layers=2, hidden=32).bfloat16()
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    dense = weight_bytes(model)
    model.set_output_embeddings(BF16Head(model.lm_head))
    assert weight_bytes(model) == dense  # the records copy is read instead of the dense weight


def test_a_head_on_pardec_s_int8_kernel_counts_its_codes_scales_and_column_factors() -> None:
    from pardec_cli.quant import Int8RecordsHead

    model = tiny_llama(vocab=96, layers=2, hidden=32)
    model.lm_head.weight = model.model.embed_tokens.weight
    tied = weight_bytes(model)
    model.set_output_embeddings(Int8RecordsHead(model.lm_head))
    assert weight_bytes(model) == tied - 96 * 32 * 4 + 96 * 32 + 96 * 4 + 32 * 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are Linux's")
def test_weight_bytes_are_the_same_once_the_weights_share_huge_page_buffers():
    """Moved to huge pages (`hugepages`) the weights share a few large storages: the bytes a
    forward reads are counted by the memory each tensor spans, not by storage."""
    from pardec_cli.hugepages import move_to_huge_pages
    from pardec_cli.quant import quantize_head

    model = tiny_llama(vocab=96, layers=2, hidden=32)
    model.lm_head.weight = model.model.embed_tokens.weight
    assert quantize_head(model)
    before = weight_bytes(model)
    assert move_to_huge_pages(model, setting="madvise", chunk_bytes=4096) > 0  # several buffers
    assert weight_bytes(model) == before


def test_weight_bytes_follow_the_dtype():
    model = tiny_llama(vocab=96, layers=2, hidden=32)
    fp32 = weight_bytes(model)
    assert weight_bytes(model.bfloat16()) * 2 == fp32  # every tensor, buffers too, is floating point


def test_the_copy_and_read_tests_measure_a_positive_bandwidth():
    assert measure_memory_bandwidth("cpu", size_bytes=1 << 20, repeats=2) > 0
    assert measure_memory_bandwidth("cpu", size_bytes=1 << 20, repeats=2, kind="read") > 0
    with pytest.raises(ValueError, match="write"):
        measure_memory_bandwidth("cpu", kind="write")


# -- through the CLI -----------------------------------------------------------------------


@pytest.fixture
def bandwidth_10gbs(monkeypatch):
    """The bandwidth tests, replaced: 10 GB/s read, 20 GB/s copied (read + written), at once."""
    devices = []
    monkeypatch.setattr("pardec_cli.hardware.measure_memory_bandwidth",
                        lambda device, kind="copy": devices.append(device) or (10.0 if kind == "read" else 20.0))  # fmt: skip
    return devices


def test_doctor_prints_the_floor_of_the_model_and_the_forward_against_it(tiny_cli_model, bandwidth_10gbs):
    result = invoke(["doctor", "-m", str(tiny_cli_model), "--dtype", "float32"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index(f"floor of {tiny_cli_model}")
    memory, weights, pages, floor, forward, cache = lines[start + 1: start + 7]
    assert memory.startswith("  memory        10.0 GB/s read on cpu (read test")
    assert memory.endswith("a copy test moves 20.0 GB/s, read + written)")
    assert weights.startswith("  weights       ") and weights.endswith("MB read by one forward (float32, full weights, eager step)")
    assert pages.startswith("  pages         ") and "pages" in pages[16:]  # 2 MB ones where Linux offers them
    assert floor.startswith("  floor         ") and floor.endswith("ms per forward (weights / read bandwidth)")
    assert forward.startswith("  forward       ") and "ms for one token over a 300-token context: " in forward
    assert forward.endswith("x one at the copy test's rate)")
    assert cache.startswith("  with cache    ") and "MB of keys and values (float32) read too: " in cache
    assert cache.endswith("x that")
    assert bandwidth_10gbs == ["cpu"] * (2 + FLOOR_ROUNDS)  # read and copy, then a read after each forward
    assert f"{FLOOR_ROUNDS + 1} times around {FLOOR_ROUNDS} forward measurements" in memory


def test_the_cache_line_needs_a_config_that_names_layers_and_heads():
    llama = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_cache_bytes(llama, 300, 2) == 2 * 30 * 3 * 64 * 300 * 2  # SmolLM2-135M's float16 cache: 6.9 MB
    assert kv_cache_bytes(SimpleNamespace(n_layer=12, n_head=12, n_embd=768), 300, 4) is None  # GPT-2's names
    assert kv_cache_bytes(None, 300, 4) is None


def test_the_floor_takes_the_fastest_read_and_the_fastest_forward(tiny_cli_model, monkeypatch):
    """A neighbour's load comes and goes: the read tests alternate with the forward's
    measurements, and the multiple compares the best of each."""
    reads = iter([10.0, 12.0, 8.0, 11.0])
    monkeypatch.setattr("pardec_cli.hardware.measure_memory_bandwidth",
                        lambda device, kind="copy": next(reads) if kind == "read" else 20.0)
    forwards = iter([3.0, 2.0, 4.0])
    monkeypatch.setattr("pardec_cli.doctor.one_token_forward_ms", lambda session: (next(forwards), 300))
    result = invoke(["doctor", "-m", str(tiny_cli_model), "--dtype", "float32", "--json"])
    assert result.exit_code == 0, result.stderr
    floor = json.loads(result.stdout)["floor"]
    assert floor["bandwidth_gbs"] == 12.0 and floor["forward_ms"] == 2.0
    assert floor["multiple"] == pytest.approx(2.0 / (floor["weight_bytes"] / 12e9 * 1e3), rel=1e-2)


def test_doctor_json_floor_is_consistent(tiny_cli_model, bandwidth_10gbs):
    result = invoke(["doctor", "-m", str(tiny_cli_model), "--dtype", "float32", "--json"])
    assert result.exit_code == 0, result.stderr
    floor = json.loads(result.stdout)["floor"]
    # The weights on disk, less the input embedding (the tiny model's LM head is its own).
    with safe_open(str(tiny_cli_model / "model.safetensors"), "pt") as f:
        on_disk = sum(f.get_tensor(k).nbytes for k in f.keys() if k != "model.embed_tokens.weight")
    assert 0 <= floor["weight_bytes"] - on_disk <= 1024  # plus the rotary buffer
    assert floor["floor_ms"] == pytest.approx(floor["weight_bytes"] / 10e9 * 1e3, rel=1e-3)
    assert floor["forward_ms"] > 0 and floor["context_tokens"] == 300
    assert floor["multiple"] == pytest.approx(floor["forward_ms"] / floor["floor_ms"], rel=1e-2)
    assert floor["copy_floor_ms"] == pytest.approx(floor["floor_ms"] / 2, rel=1e-2)  # 20 GB/s copied
    # The keys and values over those 300 tokens, from the tiny model's config, in its dtype.
    config = json.loads((tiny_cli_model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    assert floor["cache_bytes"] == 2 * config["num_hidden_layers"] * kv_heads * head_dim * 300 * 4
    assert floor["cache_dtype"] == "float32"
    assert floor["cache_floor_ms"] == pytest.approx((floor["weight_bytes"] + floor["cache_bytes"]) / 10e9 * 1e3, rel=1e-3)
    assert floor["cache_multiple"] == pytest.approx(floor["forward_ms"] / floor["cache_floor_ms"], rel=1e-2)


def test_doctor_measures_the_floor_with_the_weights_asked_for(tiny_cli_model, bandwidth_10gbs):
    """Issue 16's floor target is for bf16 and int8 weights, gen's default on a CPU is int4:
    --weights says which one the floor and the forward are measured with."""
    floors = {}
    for weights in ("full", "int8"):
        result = invoke(["doctor", "-m", str(tiny_cli_model), "--dtype", "float32", "--weights", weights, "--json"])
        assert result.exit_code == 0, result.stderr
        floors[weights] = json.loads(result.stdout)["floor"]
    assert floors["full"]["weights"] == "full" and floors["int8"]["weights"] == "int8"
    assert floors["int8"]["weight_bytes"] < floors["full"]["weight_bytes"]
    bad = invoke(["doctor", "-m", str(tiny_cli_model), "--weights", "int3"])
    assert bad.exit_code == 2 and "int3" in bad.stderr


def test_doctor_no_measure_leaves_the_floor_out(tiny_cli_model, bandwidth_10gbs):
    result = invoke(["doctor", "-m", str(tiny_cli_model), "--no-measure", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["floor"] is None
    assert bandwidth_10gbs == []
    assert "floor of" not in invoke(["doctor", "-m", str(tiny_cli_model), "--no-measure"]).stdout


def test_doctor_for_a_model_that_is_not_here_still_measures_the_bandwidth(bandwidth_10gbs):
    result = invoke(["doctor", "-m", "qwen2.5-7b"])
    assert result.exit_code == 0, result.stderr
    tail = result.stdout.splitlines()[-3:]
    assert tail == ["floor of qwen2.5-7b", "  memory        10.0 GB/s read on cpu (read test: best of 5 sums over "
                    "256 MiB; a copy test moves 20.0 GB/s, read + written)",
                    "  qwen2.5-7b is not on this machine (`pardec pull qwen2.5-7b`)"]


# -- the compiled runner's saved steps -----------------------------------------------------


def test_doctor_says_which_compiled_steps_are_saved(tiny_cli_model, isolated_home):
    before = invoke(["doctor", "-m", str(tiny_cli_model), "--no-measure"])
    assert "  saved steps   none yet: the first compiled run (bench, tune, serve" in before.stdout
    steps = isolated_home / "compiled" / "steps"
    steps.mkdir(parents=True)
    (steps / "decode-0123456789abcdef.pt2").write_bytes(b"x" * 2048)
    (steps / "verify-0123456789abcdef.pt2").write_bytes(b"x" * 1024)
    result = invoke(["doctor", "-m", str(tiny_cli_model), "--no-measure", "--json"])
    saved = json.loads(result.stdout)["compiled"]["saved_steps"]
    assert [(s["kind"], s["bytes"]) for s in saved] == [("decode", 2048), ("verify", 1024)]
    text = invoke(["doctor", "-m", str(tiny_cli_model), "--no-measure"]).stdout
    assert f"  saved steps   2 in {steps} (decode, verify; 0 MiB): later runs load them in seconds" in text


def test_doctor_expects_the_native_step_for_a_llama_with_silu_whatever_its_config_names():
    """The embedded model's converted config names no architectures, only its model type."""
    from pardec_cli.doctor import _native_expected

    base = {"model_type": "llama", "architecture": None, "activation": "silu"}
    assert _native_expected(base) and _native_expected({**base, "architecture": "LlamaForCausalLM"})
    assert not _native_expected({**base, "model_type": "qwen2", "architecture": "Qwen2ForCausalLM"})
    assert not _native_expected({**base, "activation": "gelu"})
    assert not _native_expected({**base, "architecture": "LlamaForSequenceClassification"})


def test_doctor_names_the_steps_as_the_session_does_with_pardec_s_kernels(monkeypatch) -> None:
    """What doctor reads from learned.json is keyed by `Session.step_kind`, whose weights
    carry "+pardec" where layers run pardec's kernels (`quant.kernel_suffix`): doctor must
    predict that suffix, or it finds none of what gen, chat and bench recorded."""
    from types import SimpleNamespace

    from pardec_cli import hardware
    from pardec_cli.doctor import _kernel_suffix

    cpu32, cpu16 = SimpleNamespace(device="cpu", dtype="float32"), SimpleNamespace(device="cpu", dtype="bfloat16")
    built = {"enabled": True, "bfloat16": True, "status": "built"}
    for held in ("q4q8", "full", "int8"):  # float32 layers on the AVX2 library
        assert _kernel_suffix(cpu32, held, built, avx2=True) == "+pardec"
    assert _kernel_suffix(cpu32, "int4", built, avx2=True) == ""  # torch's int4 kernel
    assert _kernel_suffix(cpu32, "q4q8", built, avx2=False) == ""  # int8 activations on the AVX512 library
    assert _kernel_suffix(cpu16, "int4", built, avx2=False) == "+pardec"
    assert _kernel_suffix(cpu16, "int4", {**built, "status": "not built"}, avx2=False) == ""
    assert _kernel_suffix(cpu16, "int4", {**built, "enabled": False}, avx2=False) == ""
    assert _kernel_suffix(SimpleNamespace(device="cuda", dtype="bfloat16"), "int4", built, avx2=False) == ""
    monkeypatch.setattr(hardware.CpuInfo, "has_amx_bf16", property(lambda self: False))
    assert _kernel_suffix(cpu16, "full", built, avx2=False) == "+pardec"  # dense bfloat16 on pardec's kernel without AMX
    monkeypatch.setattr(hardware.CpuInfo, "has_amx_bf16", property(lambda self: True))
    assert _kernel_suffix(cpu16, "full", built, avx2=False) == ""  # dense bfloat16 stays on oneDNN's AMX tiles
    assert _kernel_suffix(cpu16, "int8", built, avx2=False) == "+pardec"


def test_a_gpu_s_floor_says_nothing_of_the_cpu_s_memory_pages() -> None:
    """The floor report of a run on an H200 (its numbers), less the page facts a CPU run has:
    no "pages" line, the rest as on a CPU."""
    from pardec_cli.cli.doctor import _floor_lines

    floor = {"device": "cuda:0", "bandwidth_gbs": 3061.47, "bandwidth_source": "read test: best of 5 sums over 256 MiB",
             "copy_gbs": 3793.77, "cache_bytes": 76800, "cache_dtype": "bfloat16", "cache_floor_ms": 0.002,
             "cache_multiple": 1433.78, "dtype": "bfloat16", "weights": "full", "compiled": False, "runner": "eager",
             "weight_bytes": 6439616, "floor_ms": 0.002, "forward_ms": 3.052, "context_tokens": 300,
             "multiple": 1450.88, "copy_floor_ms": 0.002, "copy_multiple": 1797.93}
    lines = _floor_lines(floor, "tiny")
    assert not any(line.startswith("  pages") for line in lines)
    assert lines[2].startswith("  memory        3061.5 GB/s read on cuda:0")
    assert any(line.startswith("  forward       3.05 ms for one token") for line in lines)
