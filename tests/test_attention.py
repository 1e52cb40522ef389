"""pardec's CPU attention (engine.attention): the same math as transformers' eager attention."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from pardec_cli.engine import attention
from pardec_cli.engine.attention import (
    CAUSAL_PREFILL, CPU_ATTENTION, KERNEL_ATTENTION, MAX_ROWS, REDUCE_ROWS, attend, cpu_attention,
)
from pardec_cli.engine.runner import PRECOMPILE_OPTIONS, CompiledLanguageModel, runner_attention, step_options
from tests.tiny_models import tiny_llama


class _Module:
    """What eager attention reads from the attention module."""

    training = False

    def __init__(self, groups: int) -> None:
        self.num_key_value_groups = groups


# Both ways of writing it: broadcast products (compiled steps of up to REDUCE_ROWS rows), matmul.
@pytest.mark.parametrize("products", [True, False])
@pytest.mark.parametrize("rows", [1, 2, REDUCE_ROWS, REDUCE_ROWS + 1, 33])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
def test_cpu_attention_equals_eager_attention(products, rows, heads, kv_heads):
    generator = torch.Generator().manual_seed(rows * 10 + heads)
    width, dim = 70, 16
    query = torch.randn(1, heads, rows, dim, generator=generator)
    key = torch.randn(1, kv_heads, width, dim, generator=generator)
    value = torch.randn(1, kv_heads, width, dim, generator=generator)
    mask = torch.zeros(1, 1, rows, width)
    mask[..., -5:] = torch.finfo(torch.float32).min  # rows the cache does not hold yet
    mask[0, 0, 0, 60:65] = torch.finfo(torch.float32).min  # a tree row that does not see its siblings
    module = _Module(heads // kv_heads)
    expected, expected_weights = eager_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, weights = attend(query, key, value, mask, 0.25, products=products)
    assert got.shape == expected.shape == (1, rows, heads, dim)
    assert torch.allclose(got, expected, atol=1e-5) and torch.allclose(weights, expected_weights, atol=1e-6)


@pytest.mark.parametrize("products", [True, False])
def test_gemma2_softcap_and_the_default_scaling_as_in_its_eager_attention(products, monkeypatch):
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager

    generator = torch.Generator().manual_seed(5)
    query = torch.randn(1, 4, 3, 16, generator=generator) * 4  # large scores: the cap bites
    key = torch.randn(1, 2, 20, 16, generator=generator) * 4
    value = torch.randn(1, 2, 20, 16, generator=generator)
    module = _Module(2)
    module.head_dim = 16
    expected, _ = gemma2_eager(module, query, key, value, None, softcap=5.0)  # scaling: head_dim ** -0.5
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: products)
    got, _ = cpu_attention(module, query, key, value, None, dropout=0.0, softcap=5.0)
    assert torch.allclose(got, expected, atol=1e-5)
    uncapped, _ = eager_attention_forward(module, query, key, value, None, scaling=0.25)
    assert not torch.allclose(got, uncapped, atol=1e-3)


# A prompt's rows (more than any step verifies) go to torch's fused attention: the same
# math, in float32 and bfloat16, with a cached prefix, and with no mask at all.
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("start", [0, 7])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
def test_a_prefill_is_eager_attention_fused(dtype, atol, start, heads, kv_heads):
    generator = torch.Generator().manual_seed(start + heads)
    rows, dim = MAX_ROWS + 6, 16
    width = start + rows + 10  # a window past the rows written so far
    query = torch.randn(1, heads, rows, dim, generator=generator)
    key = torch.randn(1, kv_heads, width, dim, generator=generator)
    value = torch.randn(1, kv_heads, width, dim, generator=generator)
    seen = torch.arange(width) <= torch.arange(start, start + rows)[:, None]  # causal after the prefix
    mask = torch.zeros(rows, width).masked_fill(~seen, torch.finfo(torch.float32).min)[None, None]
    module = _Module(heads // kv_heads)
    expected, _ = eager_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, weights = cpu_attention(module, query.to(dtype), key.to(dtype), value.to(dtype), mask, scaling=0.25)
    assert weights is None and got.dtype == dtype and got.shape == expected.shape == (1, rows, heads, dim)
    assert torch.allclose(got.float(), expected, atol=atol)
    unmasked, _ = eager_attention_forward(module, query, key, value, None, scaling=0.25)
    assert torch.allclose(cpu_attention(module, query, key, value, None, scaling=0.25)[0], unmasked, atol=1e-5)


def test_a_fresh_prefill_leaves_the_mask_out_and_is_causal_from_the_top_left(monkeypatch):
    """No cached rows and a chain: row i sees keys 0..i, whatever the window holds past the
    prompt's rows, so torch's fused attention can skip the blocks above the diagonal. The
    runner says so for a fresh prefill only, not for one after cached rows."""
    generator = torch.Generator().manual_seed(11)
    rows, dim = MAX_ROWS + 6, 16
    width = rows + 10  # rows past the prompt's: a reused cache's stale ones
    query = torch.randn(1, 9, rows, dim, generator=generator)
    key = torch.randn(1, 3, width, dim, generator=generator)
    value = torch.randn(1, 3, width, dim, generator=generator)
    seen = torch.arange(width) <= torch.arange(rows)[:, None]
    mask = torch.zeros(rows, width).masked_fill(~seen, torch.finfo(torch.float32).min)[None, None]
    expected, _ = eager_attention_forward(_Module(3), query, key, value, mask, scaling=0.25)
    got, _ = cpu_attention(_Module(3), query, key, value, mask, scaling=0.25, **{CAUSAL_PREFILL: True})
    assert torch.allclose(got, expected, atol=1e-5)

    calls = []
    fused = attention.prefill_attention
    monkeypatch.setattr(attention, "prefill_attention", lambda *args, causal=False: calls.append(causal) or fused(*args, causal=causal))
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    model = tiny_llama(0, layers=2).to(torch.bfloat16)
    lm = CompiledLanguageModel(model, compile_fn=lambda fn, **kwargs: fn)
    assert model.config._attn_implementation == CPU_ATTENTION
    cache = lm.new_cache(400)
    with torch.inference_mode():
        lm.forward([3 + i % 90 for i in range(rows)], cache, last_only=True)  # fresh
        lm.forward([5 + i % 90 for i in range(rows)], cache, last_only=True)  # after the first rows
    assert calls == [True, True, False, False]  # per layer


def test_products_only_inside_a_compiled_step_of_a_few_rows(monkeypatch):
    seen = []
    monkeypatch.setattr("pardec_cli.engine.attention.attend", lambda *args, products, softcap: seen.append(products))
    for rows in (2, REDUCE_ROWS + 1):
        query, key = torch.zeros(1, 4, rows, 8), torch.zeros(1, 2, 16, 8)
        cpu_attention(None, query, key, key, None, scaling=1.0)  # eagerly: matmul, whatever the rows
    assert seen == [False, False]


def test_the_runner_uses_it_for_16_bit_cpu_steps_without_amx_and_keeps_sdpa_for_float32(monkeypatch):
    assert runner_attention(tiny_llama(0), amx=False) == "sdpa"  # float32: bit-exact SDPA
    model = tiny_llama(0).to(torch.bfloat16)
    assert runner_attention(model, amx=False) == CPU_ATTENTION
    assert runner_attention(model, amx=True) == "eager"  # matmul measured faster with AMX
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    CompiledLanguageModel(model, compile_fn=lambda fn, **kwargs: fn)
    assert model.config._attn_implementation == CPU_ATTENTION
    assert CompiledLanguageModel.supports(model)  # a second runner over the same model
    assert runner_attention(model, amx=True) == "eager"  # a home shared with an AMX machine


def test_only_steps_on_pardec_s_attention_op_keep_eager_s_roundings():
    """emulate_precision_casts makes rows exact with the op and would round every product
    of the broadcast-products attention (slower, no exactness gained there)."""
    assert step_options(KERNEL_ATTENTION)["emulate_precision_casts"] is True
    assert "emulate_precision_casts" not in step_options(CPU_ATTENTION) and "emulate_precision_casts" not in step_options("eager")
    assert step_options(CPU_ATTENTION) == PRECOMPILE_OPTIONS


@pytest.mark.parametrize("rows", [1, 40, 80])
def test_without_a_mask_every_row_sees_only_the_tokens_up_to_its_own(rows):
    """transformers leaves the mask out of an eager prefill without padding (SDPA then runs
    causal): pardec's attention writes the causal mask out, or a prompt's rows would attend
    to the tokens after them (they did, with no error, before)."""
    from transformers import AttentionInterface

    from pardec_cli.engine.attention import register

    model = tiny_llama(3, vocab=96, layers=2, hidden=64)
    ids = torch.randint(0, 96, (1, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids[:, :rows]).logits  # SDPA, causal
        register(CPU_ATTENTION)
        assert CPU_ATTENTION in AttentionInterface._global_mapping
        model.set_attn_implementation(CPU_ATTENTION)
        got = model(ids[:, :rows]).logits
        whole = model(ids).logits  # the first rows see no more than alone
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(whole[:, :rows], want, atol=1e-5)
