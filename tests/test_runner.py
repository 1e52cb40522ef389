"""The compiled runner (`engine.runner`): a static KV cache, explicit masks and positions,
torch.compile'd steps -- and the same tokens as plain decoding, for every method.

Most tests run the runner with compiling switched off (`EAGER_STATIC`: the same static
cache, masks, positions and rollbacks, the model run as is), which checks all of the
runner's own logic in milliseconds; a few compile for real (tens of seconds, once per
test run thanks to one shared model and inductor's on-disk cache).
"""

from __future__ import annotations

import functools
import os
import warnings

import pytest
import torch

from pardec_cli.engine.cache import keep_path, rollback_to
from pardec_cli.engine.events import FINISH_EOS, FINISH_LENGTH
from pardec_cli.engine.attention import REDUCE_ROWS
from pardec_cli.engine.loop import decode
from pardec_cli.engine.model import LanguageModel
from pardec_cli.engine.compile_policy import compile_pays
from pardec_cli.engine.runner import (
    DECODE,
    MAX_COMPILED_ROWS,
    VERIFY,
    VERIFY_WIDE,
    CompiledLanguageModel,
    compile_options,
    graph_kind,
    padded_rows,
    step_file,
    step_fingerprint,
    step_mask,
)
from pardec_cli.engine.static_cache import MIN_CAPACITY, StaticKVCache, capacity_for
from pardec_cli.engine.tree import tree_attention
from pardec_cli.errors import PardecUsageError
from pardec_cli.methods import registry
from pardec_cli.methods.base import MethodEnv
from tests.head_helpers import head_env, write_eagle1, write_eagle3, write_medusa
from tests.test_exactness import METHOD_CASES, FakeTokenizer, hf_greedy, random_prompt
from tests.test_methods_draftfree import TREE_CASES
from tests.tiny_models import peaked, tiny_llama


def no_compile(fn, **kwargs):
    """A stand-in for torch.compile that returns the function unchanged."""
    return fn


def eager_static(model, notices=None) -> CompiledLanguageModel:
    return CompiledLanguageModel(model, compile_fn=no_compile, on_notice=(notices.append if notices is not None else None))


def run_on(target: LanguageModel, method: str, options: dict, prompt, *, max_new_tokens: int, drafter=None, eos=()):
    def load(spec: str):
        return LanguageModel(drafter), FakeTokenizer(drafter.config.vocab_size)

    env = MethodEnv(target, FakeTokenizer(target.config.vocab_size), load)
    proposer = registry.create(method, options, env)
    events = list(decode(target, proposer, prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos))
    return [t for e in events for t in e.tokens], events


# ------------------------------------------------------------------ the pieces


def test_graph_kinds_one_token_a_few_tokens_more_tokens_and_eager_beyond():
    assert graph_kind(1) == DECODE
    assert graph_kind(2) == graph_kind(REDUCE_ROWS) == VERIFY
    assert graph_kind(REDUCE_ROWS + 1) == graph_kind(MAX_COMPILED_ROWS) == VERIFY_WIDE
    assert graph_kind(MAX_COMPILED_ROWS + 1) is None


def test_compile_options_use_cuda_graphs_on_cuda_and_freezing_on_cpu():
    cuda = compile_options("cuda")
    # CUDA graphs ("reduce-overhead" is this option), one-row products as tuned reductions
    assert cuda["options"] == {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
    assert "mode" not in cuda  # torch.compile takes a mode or options, not both
    cpu = compile_options("cpu")
    assert cpu["options"]["freezing"] is True and "mode" not in cpu


def test_compiling_pays_for_long_lived_sessions_and_long_work_only():
    assert compile_pays(None, "cpu") and compile_pays(None, "cuda:1")
    assert not compile_pays(256, "cpu")
    assert compile_pays(512, "cpu", saved=True) and not compile_pays(64, "cpu", saved=True)
    assert compile_pays(1_000_000, "cpu") and compile_pays(1_000_000, "cuda:0")


def test_capacities_are_powers_of_two_from_the_minimum():
    assert capacity_for(1) == MIN_CAPACITY
    assert capacity_for(MIN_CAPACITY) == MIN_CAPACITY
    assert capacity_for(MIN_CAPACITY + 1) == 2 * MIN_CAPACITY
    assert capacity_for(5000) == 8192


@pytest.mark.parametrize("parents", [(-1, 0, 0, 1, 2, -1), (-1, 0, 1, 2)], ids=["tree", "chain-as-tree"])
def test_step_mask_is_the_tree_mask_over_the_cache_then_nothing(parents):
    past, capacity = 7, 32
    rows = len(parents) + 1
    expected, expected_positions = tree_attention(parents, past, dtype=torch.float32, device="cpu")
    mask, positions = step_mask(past, rows, capacity, parents, dtype=torch.float32, device=torch.device("cpu"))
    assert mask.shape == (1, 1, rows, capacity)
    assert torch.equal(mask[..., : past + rows], expected)
    assert (mask[..., past + rows :] == torch.finfo(torch.float32).min).all()  # unfilled rows: never attended
    assert torch.equal(positions, expected_positions)


def test_a_chain_mask_is_causal():
    mask, positions = step_mask(3, 4, 16, None, dtype=torch.float32, device=torch.device("cpu"))
    seen = mask[0, 0] == 0
    assert seen[:, :3].all()
    assert torch.equal(seen[:, 3:7], torch.ones(4, 4, dtype=torch.bool).tril())
    assert not seen[:, 7:].any()
    assert positions.tolist() == [[3, 4, 5, 6]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decoding_step_mask_is_a_one_row_chain(dtype):
    for past, width in [(0, 64), (7, 32), (31, 32)]:
        mask, positions = step_mask(past, 1, width, None, dtype=dtype, device=torch.device("cpu"))
        as_tree = step_mask(past, 1, width, [], dtype=dtype, device=torch.device("cpu"))  # the general path
        assert mask.dtype == dtype and torch.equal(mask, as_tree[0]) and torch.equal(positions, as_tree[1])
        assert positions.tolist() == [[past]] and (mask[0, 0, 0] == 0).tolist() == [i <= past for i in range(width)]


def test_padded_rows_see_the_cache_and_themselves_and_take_the_next_positions():
    mask, positions = step_mask(3, 3, 16, None, dtype=torch.float32, device=torch.device("cpu"), padding=2)
    seen = mask[0, 0] == 0
    assert mask.shape == (1, 1, 5, 16)
    assert torch.equal(seen[:3, 3:6], torch.ones(3, 3, dtype=torch.bool).tril())  # the real rows: unchanged
    assert not seen[:3, 6:].any()  # nor do they see the padding
    assert seen[3:, :3].all() and seen[3, 6] and seen[4, 7]
    assert seen[3:].sum(dim=1).tolist() == [4, 4]  # the cache and itself: softmax stays finite
    assert positions.tolist() == [[3, 4, 5, 6, 7]]
    assert [padded_rows(n) for n in (2, 3, 4, 5, 17, 33, 64)] == [2, 4, 4, 8, 32, 64, 64]


def test_the_static_cache_rolls_back_by_length_and_grows_keeping_its_rows():
    model = tiny_llama(0)
    cache = StaticKVCache(model.config, 256, dtype=torch.float32, device=torch.device("cpu"))
    assert cache.get_seq_length() == 0 and cache.capacity == 256 and cache.is_croppable
    cache.layers[0].keys[0, 0, :10] = torch.arange(10.0)[:, None]
    cache.length = 10
    rollback_to(cache, 6)
    assert cache.get_seq_length() == 6
    with pytest.raises(ValueError):
        cache.crop(3)  # transformers 5's convention: a negative count
    cache.grow(512)
    assert cache.capacity == 512 and cache.layers[0].keys.shape[2] == 512
    assert torch.equal(cache.layers[0].keys[0, 0, :6, 0], torch.arange(6.0))
    assert (cache.layers[0].keys[0, 0, 6:] == 0).all()  # only the filled rows were kept


def test_a_model_without_mask_attention_is_refused_with_the_fix():
    model = tiny_llama(0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(PardecUsageError, match="4-D mask") as refused:
        CompiledLanguageModel(model)
    assert "eagerly" in refused.value.hint


# ------------------------------------------------- logits and caches match eager


def test_logits_and_kept_cache_rows_equal_the_dynamic_cache_path():
    """Prefill, a tree step, keep a non-prefix path, then a chain step: the runner's logits
    and cache rows equal the eager LanguageModel's at every point (float32)."""
    model = tiny_llama(3)
    eager, runner = LanguageModel(model), eager_static(model)
    prompt = random_prompt(3)
    parents = (-1, 0, 0, 1, -1)
    with torch.inference_mode():
        caches = [lm.new_cache(64) for lm in (eager, runner)]
        for lm, cache in zip((eager, runner), caches):
            lm.forward(prompt, cache, last_only=True)
        tree = [lm.forward([5, 6, 7, 8, 9, 10], cache, parents=parents) for lm, cache in zip((eager, runner), caches)]
        torch.testing.assert_close(tree[1], tree[0], rtol=0, atol=1e-5)
        for cache in caches:  # the root is at len(prompt), its nodes after it; keep node 0 -> 1 -> 3
            keep_path(cache, len(prompt) + 1, (0, 1, 3))
        chain = [lm.forward([11, 12, 13], cache) for lm, cache in zip((eager, runner), caches)]
        torch.testing.assert_close(chain[1], chain[0], rtol=0, atol=1e-5)
    dynamic, static = caches
    assert static.get_seq_length() == dynamic.get_seq_length() == len(prompt) + 1 + 3 + 3
    n = static.get_seq_length()
    for d, s in zip(dynamic.layers, static.layers):
        torch.testing.assert_close(s.keys[:, :, :n], d.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(s.values[:, :, :n], d.values, rtol=0, atol=1e-5)


def test_a_generation_longer_than_the_cache_grows_it():
    model = peaked(tiny_llama(1))
    runner = eager_static(model)
    prompt = random_prompt(1, length=MIN_CAPACITY - 10)
    cache = runner.new_cache()  # sized for nothing in particular: it must grow
    assert cache.capacity == capacity_for(1 + MAX_COMPILED_ROWS)
    with torch.inference_mode():
        runner.forward(prompt, cache, last_only=True)
        for token in range(40):
            runner.forward([3 + token], cache)
    assert cache.capacity >= len(prompt) + 40 and cache.get_seq_length() == len(prompt) + 40


# ------------------------------------------------------ exactness, every method


@functools.lru_cache(maxsize=None)
def _reference(seed: int, sharp: bool, limit: int) -> tuple[int, ...]:
    model = _model(seed, sharp)
    return tuple(hf_greedy(model, random_prompt(seed), limit))


@functools.lru_cache(maxsize=None)
def _model(seed: int, sharp: bool):
    model = tiny_llama(seed)
    return peaked(model) if sharp else model


@pytest.mark.parametrize("seed,sharp", [(0, True), (1, False)], ids=["peaked", "flat"])
@pytest.mark.parametrize("method,options", METHOD_CASES + TREE_CASES, ids=str)
def test_every_method_on_the_static_runner_equals_plain_decoding(method, options, seed, sharp):
    model = _model(seed, sharp)
    drafter = tiny_llama(seed + 100, layers=2)
    tokens, events = run_on(eager_static(model), method, options, random_prompt(seed), max_new_tokens=40, drafter=drafter)
    assert tokens == list(_reference(seed, sharp, 40))
    assert events[-1].finish_reason == FINISH_LENGTH


def padded_static(model, rows_seen: list[int]) -> CompiledLanguageModel:
    """A static runner padding its verify steps (as on CUDA), recording each graph call's row count."""

    def recording_compile(fn, **kwargs):
        def step(model, input_ids, *args):
            rows_seen.append(input_ids.shape[1])
            return fn(model, input_ids, *args)

        return step

    return CompiledLanguageModel(model, compile_fn=recording_compile, fixed_shapes=True)


@pytest.mark.parametrize("seed,sharp", [(0, True), (1, False)], ids=["peaked", "flat"])
@pytest.mark.parametrize("method,options", METHOD_CASES + TREE_CASES, ids=str)
def test_verify_steps_padded_to_a_power_of_two_give_the_tokens_of_plain_decoding(method, options, seed, sharp):
    """CUDA's padded steps: 2-64 rows run as the next power of two, the padding's outputs dropped."""
    model = _model(seed, sharp)
    rows_seen: list[int] = []
    runner = padded_static(model, rows_seen)
    drafter = tiny_llama(seed + 100, layers=2)
    tokens, events = run_on(runner, method, options, random_prompt(seed), max_new_tokens=40, drafter=drafter)
    assert tokens == list(_reference(seed, sharp, 40))
    assert set(rows_seen) <= {1, 2, 4, 8, 16, 32, 64}
    assert cache_rows_match_plain_decoding(runner, method, options, seed, drafter)


def cache_rows_match_plain_decoding(runner, method, options, seed, drafter) -> bool:
    """After a padded generation the cache holds what an unpadded one does, up to its length."""
    plain = eager_static(runner.model)
    caches = []
    for lm in (runner, plain):
        original = lm.new_cache
        lm.new_cache = lambda tokens=0, original=original: caches.append(original(tokens)) or caches[-1]
        run_on(lm, method, options, random_prompt(seed), max_new_tokens=40, drafter=drafter)
        del lm.new_cache
    padded, unpadded = caches[0], caches[-1]
    n = unpadded.length
    return padded.length == n and all(
        torch.allclose(a.keys[:, :, :n], b.keys[:, :, :n], atol=1e-5) and torch.allclose(a.values[:, :, :n], b.values[:, :, :n], atol=1e-5)
        for a, b in zip(padded.layers, unpadded.layers)
    )


HEAD_CASES = [("medusa", {}), ("eagle", {}), ("eagle3", {"topk": 3, "depth": 3, "nodes": 8})]


def with_heads(folder, target_for):
    """A peaked tiny model with Medusa, EAGLE and EAGLE-3 heads written under `folder`, and
    a MethodEnv whose target is `target_for(model)`."""
    model = peaked(tiny_llama(2))
    folders = {kind: folder / kind for kind in ("medusa", "eagle", "eagle3")}
    write_medusa(folders["medusa"], model, seed=2)
    write_eagle1(folders["eagle"], model, seed=2)
    write_eagle3(folders["eagle3"], model, seed=2)
    return model, head_env(model, folders, target=target_for(model))


@pytest.mark.parametrize("method,options", HEAD_CASES, ids=str)
def test_heads_read_the_hidden_states_of_padded_steps_exactly(tmp_path, method, options):
    rows_seen: list[int] = []
    model, env = with_heads(tmp_path, lambda model: padded_static(model, rows_seen))
    prompt = random_prompt(2)
    events = list(decode(env.target, registry.create(method, options, env), prompt, max_new_tokens=40))
    assert [t for e in events for t in e.tokens] == hf_greedy(model, prompt, 40)
    assert any(rows > 1 for rows in rows_seen) and set(rows_seen) <= {1, 2, 4, 8, 16, 32, 64}


def test_a_new_generation_reuses_the_buffers_of_a_finished_one():
    """Stable addresses for CUDA graphs: the buffers of a finished generation's cache are
    handed to the next cache of that capacity (never to one in use), stale rows and all."""
    model = _model(0, True)
    runner = eager_static(model)
    first = runner.new_cache(100)
    address = first.layers[0].keys.data_ptr()
    second = runner.new_cache(100)  # the first is still in use: its own buffers
    assert second.layers[0].keys.data_ptr() != address
    del first, second
    third = runner.new_cache(100)
    assert third.layers[0].keys.data_ptr() == address
    assert runner.new_cache(2000).capacity != third.capacity  # another capacity: its own buffers
    del third
    long_prompt = random_prompt(7, length=150)
    run_on(runner, "suffix", {}, long_prompt, max_new_tokens=20)  # leaves rows beyond a short prompt
    tokens, _ = run_on(runner, "suffix", {}, random_prompt(0), max_new_tokens=40)
    assert tokens == list(_reference(0, True, 40))
    assert runner.new_cache(100).layers[0].keys.data_ptr() == address


def test_warming_steps_distinct_tokens_so_a_loaded_graph_is_checked_on_real_logits():
    """warm's steps are what a loaded graph is first checked on: one token repeated gave
    degenerate 16-bit logits that failed a good saved graph every run."""
    model = _model(0, True)
    steps: list[list[int]] = []

    def recording_compile(fn, **kwargs):
        def step(model, input_ids, *args):
            steps.append(input_ids[0].tolist())
            return fn(model, input_ids, *args)

        return step

    CompiledLanguageModel(model, compile_fn=recording_compile, fixed_shapes=True).warm()
    assert {len(ids) for ids in steps} == {1, 2, 4, 8, 16, 32, 64}
    assert all(len(set(ids)) == len(ids) for ids in steps)


def test_warming_padded_steps_records_every_shape_a_generation_then_runs():
    """On CUDA a graph is recorded per step shape and per cache buffer: warm(contexts) runs
    each padded row count on the cache capacity of each context, and leaves those buffers
    to the generations, so a timed generation records nothing new."""
    model = _model(0, True)
    seen: list[tuple[int, int, int]] = []

    def recording_compile(fn, **kwargs):
        def step(model, input_ids, positions, mask, cache, *args):
            seen.append((input_ids.shape[1], mask.shape[-1], cache.layers[0].keys.data_ptr()))
            return fn(model, input_ids, positions, mask, cache, *args)

        return step

    runner = CompiledLanguageModel(model, compile_fn=recording_compile, fixed_shapes=True)
    prompts = [random_prompt(0), random_prompt(7, length=200)]
    runner.warm(contexts=[len(p) + 40 for p in prompts])
    warmed = set(seen)
    assert {rows for rows, _, _ in warmed} == {1, 2, 4, 8, 16, 32, 64}
    assert len({capacity for _, capacity, _ in warmed}) == 2  # the two prompts need two cache sizes
    assert all(seen.count(shape) == 3 for shape in warmed)  # warm-up, record, replay
    seen.clear()
    for prompt in prompts:
        tokens, _ = run_on(runner, "suffix+recycling", {}, prompt, max_new_tokens=40)
        assert tokens == hf_greedy(model, prompt, 40)
    assert seen and set(seen) <= warmed


def test_cuda_recordings_lift_inductor_s_dynamic_shape_warning_and_replays_do_not():
    """A recording per padded row count and cache capacity is the runner's design, so the
    calls that may compile or record (a shape's first three: run, record, replay) lift
    inductor's "too many CUDA graphs" warning, which printed in a GPU bench's output, and
    its advice to use TF32 in float32; later calls run as they are."""
    from torch._inductor import config

    from pardec_cli.engine.runner import quiet_recording

    runner = CompiledLanguageModel(_model(0, True), compile_fn=lambda fn, **kwargs: fn, fixed_shapes=True)
    assert [runner.records(VERIFY, False, 4, 256) for _ in range(4)] == [True, True, True, False]
    assert runner.records(VERIFY, False, 4, 512) and runner.records(VERIFY, True, 4, 256)
    assert runner.records(DECODE, False, 1, 256)
    limit = config.triton.cudagraph_dynamic_shape_warn_limit
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet_recording():
            assert config.triton.cudagraph_dynamic_shape_warn_limit is None
            warnings.warn("TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled.", stacklevel=1)
        warnings.warn("anything else", stacklevel=1)
    assert config.triton.cudagraph_dynamic_shape_warn_limit == limit
    assert [str(w.message) for w in shown] == ["anything else"]


def test_warming_unpadded_steps_compiles_each_graph_once():
    calls: list[int] = []

    def counting_compile(fn, **kwargs):
        calls.append(1)
        return fn

    runner = CompiledLanguageModel(_model(0, True), compile_fn=counting_compile)
    runner.warm(contexts=[100, 5000])  # one symbolic graph per kind serves every size: nothing more to do
    assert len(calls) == 3 and set(runner.graph_states()) == {"decode", "verify", "verify-wide"}


@pytest.mark.parametrize("method,options", [("pld", {}), ("suffix+recycling", {}), ("lookahead", {})], ids=str)
def test_eos_and_the_token_limit_inside_a_draft_on_the_static_runner(method, options):
    model = _model(5, True)
    prompt = random_prompt(5)
    free = hf_greedy(model, prompt, 40)
    eos = free[17]
    tokens, events = run_on(eager_static(model), method, options, prompt, max_new_tokens=40, eos=(eos,))
    assert tokens == free[: free.index(eos) + 1] and events[-1].finish_reason == FINISH_EOS
    for limit in (1, 2, 7):
        assert run_on(eager_static(model), method, options, prompt, max_new_tokens=limit)[0] == free[:limit]


@pytest.mark.parametrize("method,options", HEAD_CASES, ids=str)
def test_heads_read_hidden_states_through_the_static_runner_exactly(tmp_path, method, options):
    model, env = with_heads(tmp_path, eager_static)
    prompt = random_prompt(2)
    events = list(decode(env.target, registry.create(method, options, env), prompt, max_new_tokens=40))
    assert [t for e in events for t in e.tokens] == hf_greedy(model, prompt, 40)
    assert sum(e.drafted for e in events) > 0


# ------------------------------------------------------- failures fall back


def test_a_graph_that_fails_to_compile_runs_eagerly_with_one_notice():
    def broken_compile(fn, **kwargs):
        def compiled(*args, **kw):
            raise RuntimeError("inductor: no C++ compiler found\nlong trace")

        return compiled

    model = _model(0, True)
    notices: list[str] = []
    runner = CompiledLanguageModel(model, compile_fn=broken_compile, on_notice=notices.append)
    tokens, _ = run_on(runner, "pld", {}, random_prompt(0), max_new_tokens=40)
    assert tokens == list(_reference(0, True, 40))
    failed = [n for n in notices if "failed" in n]
    assert len(failed) == len(runner.graph_states()) >= 2  # one per graph (decode, verify, ...), not one per step
    assert "no C++ compiler found" in failed[0] and "long trace" not in failed[0]
    assert all(state.failed for state in runner.graph_states().values())


# ------------------------------------------------------- really compiled


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory):
    """Where the module's compiled runner saves its steps (a later runner loads them)."""
    return tmp_path_factory.mktemp("steps")


@pytest.fixture(scope="module")
def compiled_runner(step_dir):
    """One compiled runner for the module: each graph compiles once (tens of seconds)."""
    notices: list[str] = []
    runner = CompiledLanguageModel(_model(0, True), on_notice=notices.append, step_dir=step_dir)
    runner.notices = notices
    return runner


@pytest.mark.parametrize(
    "method,options", [("vanilla", {}), ("pld", {}), ("suffix+recycling", {}), ("lookahead", {}), ("jacobi", {})], ids=str
)
def test_compiled_steps_give_the_tokens_of_plain_decoding(compiled_runner, method, options):
    tokens, events = run_on(compiled_runner, method, options, random_prompt(0), max_new_tokens=40)
    assert tokens == list(_reference(0, True, 40))
    # The module's runner is shared, and the tests may run in any order (one worker each):
    # every graph used so far compiled, and this method's kind of step among them.
    states = compiled_runner.graph_states()
    assert states and all(state.failed is None and state.compile_seconds is not None for state in states.values())
    if method == "vanilla":
        assert "decode" in states
    else:
        assert {"verify", "verify-wide"} & states.keys()
        assert sum(e.drafted for e in events) > 0


def test_one_verify_graph_serves_every_draft_size_and_cache_size(compiled_runner):
    """Drafts of many sizes and a cache that grows must not recompile (a symbolic row count
    and capacity): the verify graph's compile time is counted once."""
    from torch._dynamo.utils import counters

    compiled_runner.warm()
    before = counters["stats"]["unique_graphs"]
    prompt = random_prompt(0, length=MIN_CAPACITY)  # grows the cache past its first capacity
    tokens, _ = run_on(compiled_runner, "pld", {"num_draft": 3}, prompt, max_new_tokens=30)
    tokens2, _ = run_on(compiled_runner, "suffix", {"max_nodes": 24}, prompt, max_new_tokens=30)
    assert tokens == tokens2 == hf_greedy(compiled_runner.model, prompt, 30)
    assert counters["stats"]["unique_graphs"] == before


def test_saved_steps_load_in_a_later_runner_for_another_checkpoint(compiled_runner, step_dir):
    """A later process loads the saved graphs instead of tracing the model; the weights are
    graph inputs, so another checkpoint of the same architecture uses the same files."""
    compiled_runner.warm()
    assert step_file(step_dir, compiled_runner.model, DECODE).is_file()
    assert step_file(step_dir, compiled_runner.model, VERIFY).is_file()
    other = _model(1, False)
    assert step_fingerprint(other) == step_fingerprint(compiled_runner.model)
    notices: list[str] = []
    later = CompiledLanguageModel(other, on_notice=notices.append, step_dir=step_dir)
    tokens, events = run_on(later, "pld", {"min_ngram": 1}, random_prompt(1), max_new_tokens=40)
    assert tokens == list(_reference(1, False, 40))
    assert sum(e.drafted for e in events) > 0
    states = later.graph_states()
    assert states["decode"].origin == states["verify"].origin == "loaded"
    assert not any("compiling" in n for n in notices), notices


def test_quantized_weights_and_the_int8_head_compile_and_decode_as_plain_decoding_does(tmp_path):
    """What `--weights int4` loads on a CPU (packed int4 layers, q/k/v and gate/up sharing
    one packed weight each, the int8 head) compiles without breaking, and every method
    still gives plain decoding's tokens."""
    from pardec_cli.quant import quantize_head, quantize_linears, share_products

    model = peaked(tiny_llama(0, hidden=128))  # its own: the cached _model is shared by the module's other tests
    quantize_linears(model, "int4")
    assert quantize_head(model)
    assert share_products(model, lambda: model(torch.tensor([[3, 4]]), use_cache=False)) == 2 * 4
    runner = CompiledLanguageModel(model, step_dir=tmp_path)
    reference = hf_greedy(model, random_prompt(0), 40)
    for method in ("vanilla", "pld", "suffix+recycling"):
        tokens, _ = run_on(runner, method, {}, random_prompt(0), max_new_tokens=40)
        assert tokens == reference, method
    states = runner.graph_states()
    assert states["decode"].failed is None and states["verify"].failed is None
    # The saved steps load in a later runner (the head's oneDNN-prepacked codes are an input).
    later = CompiledLanguageModel(model, step_dir=tmp_path)
    tokens, _ = run_on(later, "suffix", {}, random_prompt(0), max_new_tokens=40)
    assert tokens == reference
    assert later.graph_states()["verify"].origin == "loaded"


def test_two_models_of_other_head_sizes_compile_in_one_process(tmp_path):
    """A target and a drafter, or two served models: the second's steps compile too, though
    dynamo saw another attention scale in the same step function before (the one-token
    step has the attention all steps have)."""
    for hidden in (32, 64):  # head sizes 8 and 16
        model = peaked(tiny_llama(3, hidden=hidden, layers=2))
        runner = CompiledLanguageModel(model, step_dir=tmp_path / str(hidden))
        tokens, _ = run_on(runner, "vanilla", {}, random_prompt(3), max_new_tokens=24)
        assert tokens == hf_greedy(model, random_prompt(3), 24)
        assert runner.graph_states()["decode"].failed is None, hidden


def test_hidden_states_come_out_of_compiled_and_saved_steps(tmp_path):
    """EAGLE-3 reads three layers' hidden states from every step: the "+hidden" graphs."""
    model = peaked(tiny_llama(2))
    write_eagle3(tmp_path / "eagle3", model, seed=2)
    runner = CompiledLanguageModel(model, step_dir=tmp_path / "steps")
    env = head_env(model, {"eagle3": tmp_path / "eagle3"}, target=runner)
    prompt = random_prompt(2)
    events = list(decode(runner, registry.create("eagle3", {"topk": 3, "depth": 3, "nodes": 8}, env), prompt, max_new_tokens=40))
    assert [t for e in events for t in e.tokens] == hf_greedy(model, prompt, 40)
    assert sum(e.drafted for e in events) > 0
    # Trees of 8 nodes: 9 rows, the wide verify graph; fewer after a short match.
    expected = {"decode+hidden": None, "verify+hidden": None, "verify-wide+hidden": None}
    assert {name: state.failed for name, state in runner.graph_states().items()} == expected
    assert step_file(tmp_path / "steps", model, VERIFY, hidden=True).is_file()


def test_a_damaged_saved_step_is_compiled_again_with_one_notice(compiled_runner, step_dir, tmp_path):
    compiled_runner.warm()
    saved = step_file(step_dir, compiled_runner.model, DECODE)
    damaged = tmp_path / "steps"
    damaged.mkdir()
    (damaged / saved.name).write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    notices: list[str] = []
    runner = CompiledLanguageModel(_model(0, True), on_notice=notices.append, step_dir=damaged)
    tokens, _ = run_on(runner, "vanilla", {}, random_prompt(0), max_new_tokens=20)
    assert tokens == list(_reference(0, True, 20))
    assert sum("could not be loaded" in n for n in notices) == 1
    assert runner.graph_states()["decode"].origin == "compiled"
    assert (damaged / saved.name).stat().st_size > saved.stat().st_size // 2  # saved again, whole


def test_a_saved_step_that_does_not_fit_the_model_is_dropped_not_trusted(tmp_path):
    """A file under this model's name that computes something else (here: the decode step
    of a 3-layer model in a 4-layer model's place) is caught by the first step's check
    against the eager step: that step's output is the eager one, and the graph is
    compiled anew."""
    other_dir, wrong = tmp_path / "other", tmp_path / "steps"
    shallow = CompiledLanguageModel(tiny_llama(0, layers=3), step_dir=other_dir)
    run_on(shallow, "vanilla", {}, random_prompt(0), max_new_tokens=2)
    model = _model(0, True)
    wrong.mkdir()
    step_file(wrong, model, DECODE).write_bytes(step_file(other_dir, shallow.model, DECODE).read_bytes())
    notices: list[str] = []
    runner = CompiledLanguageModel(model, on_notice=notices.append, step_dir=wrong)
    tokens, _ = run_on(runner, "vanilla", {}, random_prompt(0), max_new_tokens=20)
    assert tokens == list(_reference(0, True, 20))
    assert sum("does not fit this model" in n for n in notices) == 1, notices
    assert runner.graph_states()["decode"].origin == "compiled"


def test_a_loaded_step_is_trusted_to_rounding_not_to_another_model():
    from pardec_cli.engine.runner import _close

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 3, 500, generator=g) * 8
    rounded = (logits + 0.3 * logits.norm() / 500 ** 0.5 / 3 ** 0.5 * torch.randn(1, 3, 500, generator=g))
    assert _close(rounded.bfloat16(), logits.bfloat16())  # ~30% of the norm: 16-bit rounding at position 0
    assert not _close(torch.randn(1, 3, 500, generator=g).bfloat16() * 8, logits.bfloat16())
    assert _close(logits + 1e-5, logits) and not _close(rounded, logits)  # float32: to 1e-3
    assert not _close(logits[:, :2], logits)


def test_the_fingerprint_names_architecture_dtype_and_weight_layout_not_weights(monkeypatch):
    from pardec_cli.quant import quantize_head

    base = step_fingerprint(tiny_llama(0))
    assert step_fingerprint(tiny_llama(5)) == base
    assert step_fingerprint(tiny_llama(0).to(torch.bfloat16)) != base
    assert step_fingerprint(tiny_llama(0, layers=3)) != base
    with_int8_head = tiny_llama(0)
    quantize_head(with_int8_head)
    assert step_fingerprint(with_int8_head) != base
    with_a_buffer = tiny_llama(0)
    with_a_buffer.model.norm.register_buffer("extra", torch.ones(1))  # the module's code changed
    assert step_fingerprint(with_a_buffer) != base
    monkeypatch.setattr("transformers.__version__", "99.0")  # other modeling code was traced
    assert step_fingerprint(tiny_llama(0)) != base
    monkeypatch.undo()
    assert step_fingerprint(tiny_llama(0)) == base
    # Kernels compiled for AVX512 would not run on an AVX2-only CPU sharing the store.
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "SOMETHING ELSE")
    assert step_fingerprint(tiny_llama(0)) != base


def test_without_compile_missing_only_saved_steps_run_compiled(tmp_path):
    """What auto does for a short generation: saved steps load, missing ones run eagerly
    at once instead of compiling for a minute in the middle of it."""
    notices: list[str] = []
    runner = CompiledLanguageModel(_model(0, True), on_notice=notices.append, step_dir=tmp_path, compile_missing=False)
    tokens, _ = run_on(runner, "pld", {"min_ngram": 1}, random_prompt(0), max_new_tokens=20)
    assert tokens == list(_reference(0, True, 20))
    assert notices == [] and not any(tmp_path.iterdir())
    assert {state.failed for state in runner.graph_states().values()} == {"not saved (runs eagerly)"}


@pytest.mark.real_model  # Session.load reads the real tokenizer
def test_auto_compiles_short_work_only_once_every_step_is_saved(tiny_cli_model, isolated_home, monkeypatch):
    from pardec_cli.session import Session, compiled_steps_dir

    def load(tokens):
        return Session.load(str(tiny_cli_model), dtype="float32", device="cpu", compile="auto", expected_tokens=tokens)

    assert not load(512).compiled
    model = load(512).target.model
    compiled_steps_dir().mkdir(parents=True)
    step_file(compiled_steps_dir(), model, DECODE).write_bytes(b"saved")
    assert not load(512).compiled  # the verify steps are not saved yet
    step_file(compiled_steps_dir(), model, VERIFY).write_bytes(b"saved")
    assert not load(512).compiled  # the wide verify step is not saved yet
    step_file(compiled_steps_dir(), model, VERIFY_WIDE).write_bytes(b"saved")
    session = load(512)
    assert session.compiled and session.target.compile_missing is False
    assert not load(64).compiled
    monkeypatch.setattr(CompiledLanguageModel, "warm", lambda self, **kwargs: None)  # the saved steps are not real
    assert load(None).target.compile_missing is True  # bench, tune, serve: compile what is missing


# ------------------------------------------------------------------ the CLI


@pytest.mark.real_model  # the tiny model speaks through the real tokenizer
def test_gen_compile_on_prints_the_same_text_as_eager(tiny_cli_model):
    from tests.cli_helpers import invoke

    args = ["gen", "-m", str(tiny_cli_model), "--dtype", "float32", "--method", "pld", "-n", "24", "--temp", "0", "--stats", "Repeat: a b c a b c"]
    eager = invoke([*args, "--compile", "off"])
    compiled = invoke([*args, "--compile", "on"])
    assert eager.exit_code == compiled.exit_code == 0, compiled.stderr
    assert compiled.stdout == eager.stdout and compiled.stdout.strip()
    assert "compiling the decode step" in compiled.stderr and "compiling" not in eager.stderr
    assert "float32, cpu, compiled step)" in compiled.stderr and "compiled step" not in eager.stderr
    assert "Traceback" not in compiled.stderr


def test_a_bad_compile_value_is_one_usage_error():
    from tests.cli_helpers import invoke

    result = invoke(["gen", "--compile", "sometimes", "hi"])
    assert result.exit_code == 2 and "'sometimes' is not one of" in result.stderr and "Traceback" not in result.stderr


def test_the_compile_cache_lives_in_the_store_unless_the_user_moved_it(monkeypatch, isolated_home, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from pardec_cli.session import use_compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what torch writes there itself
    use_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(isolated_home / "compiled")
    mine = str(tmp_path / "my-inductor-cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", mine)
    use_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == mine
