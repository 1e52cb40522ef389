"""KV cache rollback: dropping rejected draft positions leaves exactly the kept prefix."""

from __future__ import annotations

import pytest
import torch

from pardec_cli.engine.cache import cache_keyword, cache_length, check_rollback_supported, new_cache, rollback_to
from pardec_cli.errors import CacheRollbackError
from tests.tiny_models import tiny_llama


def forward(model, ids, cache):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=True, **{cache_keyword(model): cache}).logits[0]


def test_rollback_then_continue_equals_never_having_drafted():
    model = tiny_llama(seed=3)
    prefix, rejected, follow = [5, 9, 11, 4], [7, 7, 8], [12, 30]

    cache = new_cache(model.config)
    forward(model, prefix + rejected, cache)
    assert cache_length(cache) == 7
    rollback_to(cache, len(prefix))
    assert cache_length(cache) == 4
    after_rollback = forward(model, follow, cache)

    clean = new_cache(model.config)
    forward(model, prefix, clean)
    reference = forward(model, follow, clean)
    torch.testing.assert_close(after_rollback, reference, rtol=0, atol=0)
    for layer_a, layer_b in zip(cache.layers, clean.layers):
        torch.testing.assert_close(layer_a.keys, layer_b.keys, rtol=0, atol=0)


def test_rollback_to_current_length_is_a_no_op():
    model = tiny_llama()
    cache = new_cache(model.config)
    forward(model, [1, 2, 3], cache)
    rollback_to(cache, 3)
    assert cache_length(cache) == 3


def test_rolling_forward_is_an_error():
    model = tiny_llama()
    cache = new_cache(model.config)
    forward(model, [1, 2], cache)
    with pytest.raises(ValueError, match="forward"):
        rollback_to(cache, 5)


def test_dynamic_cache_is_accepted():
    check_rollback_supported(new_cache(tiny_llama().config))


class NoCrop:
    pass


class SlidingWindow:
    is_croppable = False

    def crop(self, n):  # pragma: no cover - must never be called
        raise AssertionError


@pytest.mark.parametrize("cache", [NoCrop(), SlidingWindow()])
def test_caches_that_cannot_roll_back_fail_loudly_before_decoding(cache):
    with pytest.raises(CacheRollbackError) as info:
        check_rollback_supported(cache)
    assert "cannot be rolled back" in info.value.message
    assert info.value.cache_type == type(cache).__name__
    assert info.value.hint is None  # the engine names no flag: each front end words the remedy


@pytest.mark.parametrize("cache", [NoCrop(), SlidingWindow()])
def test_the_cli_words_the_remedy_in_its_own_flags(cache):
    from pardec_cli.cli.main import cli_words

    with pytest.raises(CacheRollbackError) as info:
        check_rollback_supported(cache)
    message, hint = cli_words(info.value)
    assert (message, hint) == (info.value.message, "use --method vanilla with this model")


def test_sampling_errors_name_the_setting_and_the_cli_names_its_flag():
    from pardec_cli.cli.main import cli_words
    from pardec_cli.engine.sampling_params import SamplingParams
    from pardec_cli.errors import InvalidSamplingError

    with pytest.raises(InvalidSamplingError) as info:
        SamplingParams(top_p=0.0)
    assert (info.value.setting, info.value.message) == ("top_p", "top_p must be in (0, 1], got 0.0")
    assert cli_words(info.value)[0] == "--top-p must be in (0, 1], got 0.0"


def test_decode_checks_rollback_before_the_first_step():
    """A speculative method on a cache without rollback fails before generating anything."""
    from transformers import DynamicCache

    from pardec_cli.engine.loop import decode
    from pardec_cli.engine.model import LanguageModel
    from pardec_cli.methods import registry
    from pardec_cli.methods.base import MethodEnv

    class SlidingWindowCache(DynamicCache):
        is_croppable = False

    class SlidingWindowModel(LanguageModel):
        def new_cache(self, tokens=0):
            return SlidingWindowCache(config=self.config)

    target = SlidingWindowModel(tiny_llama())
    proposer = registry.create("pld", {}, MethodEnv(target, None, None))
    with pytest.raises(CacheRollbackError):
        next(iter(decode(target, proposer, [1, 2, 3], max_new_tokens=4)))
    # Plain decoding never rolls back, so it still runs on such a cache.
    vanilla = registry.create("vanilla", {}, MethodEnv(target, None, None))
    assert len(list(decode(target, vanilla, [1, 2, 3], max_new_tokens=4))) == 4


def test_decoding_leaves_the_callers_grad_mode_alone():
    """The loop runs under inference mode, but between its steps the consumer's code does
    not (training heads calls decode and then backpropagates); two generations consumed
    in turn and one abandoned halfway do not leave inference mode switched on."""
    import torch

    from pardec_cli.engine.loop import decode
    from pardec_cli.engine.model import LanguageModel
    from pardec_cli.methods import registry
    from pardec_cli.methods.base import MethodEnv

    target = LanguageModel(tiny_llama())
    first = decode(target, registry.create("pld", {}, MethodEnv(target, None, None)), [1, 2, 3, 1, 2], max_new_tokens=6)
    second = decode(target, registry.create("vanilla", {}, MethodEnv(target, None, None)), [4, 5], max_new_tokens=6)
    for _ in range(2):
        next(first)
        assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        next(second)
        assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    list(second)
    del first  # abandoned mid-generation
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_a_step_passes_the_cache_by_the_keyword_the_installed_transformers_takes():
    # transformers 5.24 renamed `past_key_values` to `cache` and warns on the old name:
    # a step must not print that warning under a user's generation.
    import warnings

    from pardec_cli.engine.model import LanguageModel

    lm = LanguageModel(tiny_llama())
    cache = lm.new_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lm.forward([1, 2, 3], cache)
    assert cache_length(cache) == 3
