"""Medusa and EAGLE heads: the published layouts load (and wrong ones are refused), and decoding
with them is exact -- a random head only slows decoding down, it never changes the output."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch.nn import functional as F

from pardec_cli.engine.events import FINISH_EOS, FINISH_LENGTH
from pardec_cli.engine.loop import decode
from pardec_cli.engine.model import LanguageModel
from pardec_cli.engine.sampling import SamplingParams
from pardec_cli.errors import ModelLoadError, PardecUsageError
from pardec_cli.heads.eagle import DraftCache, eagle3_feature_layers, load_eagle
from pardec_cli.heads.medusa import load_medusa
from pardec_cli.methods import registry
from tests.head_helpers import head_env, write_eagle1, write_eagle3, write_medusa
from tests.stats_helpers import chi_square_p_value
from tests.test_exactness import hf_greedy, random_prompt
from tests.test_sampling import exact_joint  # the brute-force joint distribution
from tests.tiny_models import peaked, tiny_llama

HEAD_CASES = [
    ("medusa", {}),
    ("medusa", {"tree": "prior", "width": 3, "nodes": 10}),
    ("eagle", {}),
    ("eagle", {"topk": 1, "depth": 4}),  # a chain
    ("eagle3", {"topk": 3, "depth": 3, "nodes": 8}),
]


@pytest.fixture
def heads_for(tmp_path):
    """heads_for(model, seed) -> {kind: directory} with random heads of every kind for `model`."""

    def make(model, seed: int = 0) -> dict:
        folders = {kind: tmp_path / f"{kind}-{seed}" for kind in ("medusa", "eagle", "eagle3")}
        write_medusa(folders["medusa"], model, seed=seed)
        write_eagle1(folders["eagle"], model, seed=seed)
        write_eagle3(folders["eagle3"], model, seed=seed)
        return folders

    return make


def run(method, options, model, folders, prompt, *, max_new_tokens, eos=(), sampling=SamplingParams()):
    env = head_env(model, folders)
    proposer = registry.create(method, options, env)
    events = list(decode(env.target, proposer, prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos, sampling=sampling))
    return [t for e in events for t in e.tokens], events


# --------------------------------------------------------------------- exactness


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sharp", [True, False], ids=["peaked", "flat"])
@pytest.mark.parametrize("method,options", HEAD_CASES, ids=str)
def test_greedy_with_random_heads_equals_plain_decoding(heads_for, method, options, seed, sharp):
    model = tiny_llama(seed)
    if sharp:
        model = peaked(model)
    prompt = random_prompt(seed)
    tokens, events = run(method, options, model, heads_for(model, seed), prompt, max_new_tokens=40)
    assert tokens == hf_greedy(model, prompt, 40)
    assert events[-1].finish_reason == FINISH_LENGTH
    assert sum(e.drafted for e in events) > 0, "the method drafted nothing: the test would not exercise verification"


@pytest.mark.parametrize("method,options", HEAD_CASES, ids=str)
def test_eos_and_token_limit_inside_a_tree(heads_for, method, options):
    model = peaked(tiny_llama(5))
    folders = heads_for(model, 5)
    prompt = random_prompt(5)
    free = hf_greedy(model, prompt, 40)
    eos = free[17]
    tokens, events = run(method, options, model, folders, prompt, max_new_tokens=40, eos=(eos,))
    assert tokens == free[: free.index(eos) + 1] and events[-1].finish_reason == FINISH_EOS
    for limit in (1, 2, 7):
        tokens, _ = run(method, options, model, folders, prompt, max_new_tokens=limit)
        assert tokens == free[:limit]


def test_one_proposer_serves_several_generations(heads_for):
    """State is per generation: a second prompt starts from a clean draft cache."""
    model = peaked(tiny_llama(3))
    env = head_env(model, heads_for(model, 3))
    for method in ("medusa", "eagle", "eagle3"):
        proposer = registry.create(method, {}, env)
        for seed in (3, 4):
            prompt = random_prompt(seed)
            events = decode(env.target, proposer, prompt, max_new_tokens=20)
            assert [t for e in events for t in e.tokens] == hf_greedy(model, prompt, 20)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_trees_equal_drafting_each_path_one_token_at_a_time(heads_for, method):
    """The tree's masks, positions and hidden-state routing: every expanded node's children are
    the draft's top-k after that node's path, best first, as one-token-at-a-time drafting gives."""
    from pardec_cli.engine.proposal import StartContext

    model = tiny_llama(2, layers=5)
    env = head_env(model, heads_for(model, 2))
    k = 3
    proposer = registry.create(method, {"topk": k, "depth": 4, "nodes": 1000}, env)  # keep every candidate
    prompt = random_prompt(2)
    context = prompt + hf_greedy(model, prompt, 12)
    n = len(context) - 1
    with torch.no_grad():
        features = env.target.forward_features(context[:-1], env.target.new_cache(), proposer.needs().feature_layers)[1]
    proposer.start(StartContext(env.target, tuple(prompt), SamplingParams(), None))
    proposer.prefilled(features)
    draft = proposer.propose(context, 10)
    assert len(proposer.cache) == n, "the tree's entries must be cropped from the draft cache"
    assert len(draft) == k + 3 * k * k  # level 1, then k expanded nodes x k children per level
    drafter, vocab = proposer.drafter, proposer.vocab
    children = {node: [c for c, p in enumerate(draft.parents) if p == node] for node in range(-1, len(draft))}
    expanded = [node for node, kids in children.items() if kids]
    assert len(expanded) == 1 + 3 * k  # the root, and k nodes at each of levels 1, 2 and 3

    def path_to(node):
        path = []
        while node >= 0:
            path.insert(0, draft.tokens[node])
            node = draft.parents[node]
        return path

    with torch.no_grad():
        stable = DraftCache()
        root = drafter(features[None], torch.tensor([context[1:]]), torch.arange(n)[None], cache=stable)[0, -1]
        for node in expanded:
            cache = DraftCache()
            cache.append(stable.keys, stable.values)
            out, score = root, 0.0
            for depth, token in enumerate(path_to(node)):
                log_probs, ids = vocab.top(drafter.head_input(out)[None], len(vocab))
                score += float(log_probs[0, ids[0].tolist().index(token)])
                out = drafter(out[None, None], torch.tensor([[token]]), torch.tensor([[n + depth]]), cache=cache)[0, -1]
            if node >= 0:
                assert proposer.last_scores[node] == pytest.approx(score, abs=1e-4), node
            best = vocab.top(drafter.head_input(out)[None], k)[1][0].tolist()
            assert [draft.tokens[c] for c in children[node]] == best, node


# ------------------------------------------------------------------ sampling

VOCAB = 4
PROMPT = [1, 3, 2, 3]


@pytest.mark.slow  # statistical
@pytest.mark.parametrize("method,options", [("medusa", {"width": 3, "nodes": 6}), ("eagle", {"topk": 3, "nodes": 6})], ids=str)
def test_sampling_keeps_the_target_distribution(tmp_path, method, options):
    model = peaked(tiny_llama(11, vocab=VOCAB, layers=2), scale=3.0)
    folders = {"medusa": tmp_path / "m", "eagle": tmp_path / "e"}
    write_medusa(folders["medusa"], model, heads=2, seed=1, scale=1.0)
    write_eagle1(folders["eagle"], model, seed=1)
    exact = exact_joint(model, 3)
    env = head_env(model, folders)
    proposer = registry.create(method, options, env)
    counts: Counter = Counter()
    drafted = 0
    for i in range(800):
        events = list(decode(env.target, proposer, PROMPT, max_new_tokens=3, sampling=SamplingParams(temperature=1.0, seed=i)))
        counts[tuple(t for e in events for t in e.tokens)] += 1
        drafted += sum(e.drafted > 1 for e in events)
    assert drafted > 0, "no step drafted several candidates: the multi-candidate rule was not exercised"
    assert chi_square_p_value(counts, exact) > 0.001


# ------------------------------------------------------------------ loading: Medusa


def test_medusa_layout_loads_and_computes_the_published_formula(tmp_path):
    model = tiny_llama(0)
    tensors = write_medusa(tmp_path, model, heads=3, config_heads=2)  # the config under-reports the heads
    heads = load_medusa(tmp_path, LanguageModel(model), "tiny")
    assert heads.num_heads == 3 and heads.num_layers == 1 and len(heads.vocabs) == 3
    h = torch.randn(model.config.hidden_size)
    for k in range(3):
        block = h + F.silu(tensors[f"{k}.0.linear.weight"] @ h + tensors[f"{k}.0.linear.bias"])
        expected = torch.topk(tensors[f"{k}.1.weight"].float() @ block, 5).indices
        assert heads.top(h, 5)[k].tolist() == expected.tolist()


def test_medusa_safetensors_and_prefixed_names_load(tmp_path):
    model = tiny_llama(0)
    write_medusa(tmp_path / "st", model, heads=2, safetensors=True)
    assert load_medusa(tmp_path / "st", LanguageModel(model), "tiny").num_heads == 2
    tensors = write_medusa(tmp_path / "prefixed", model, heads=2)
    torch.save({f"medusa_head.{k}": v for k, v in tensors.items()}, tmp_path / "prefixed" / "medusa_lm_head.pt")
    assert load_medusa(tmp_path / "prefixed", LanguageModel(model), "tiny").num_heads == 2


def test_medusa_heads_holding_the_targets_lm_head_share_it(tmp_path):
    """Heads trained with the LM head frozen carry copies of it (here in float16): one matrix is kept."""
    model = tiny_llama(0, vocab=96)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.lm_head.weight.half().float())  # exactly representable in float16
    write_medusa(tmp_path, model, heads=3, own_lm_heads=False)
    heads = load_medusa(tmp_path, LanguageModel(model), "tiny")
    assert len(heads.vocabs) == 1 and heads.vocabs[0].weight.data_ptr() == model.lm_head.weight.data_ptr()


@pytest.mark.parametrize("wrong,message", [
    (dict(hidden=48), "hidden size 48 in the heads, 32 in the model"),
    (dict(vocab=100), "vocabulary size 100 in the heads, 96 in the model"),
])  # fmt: skip
def test_medusa_heads_for_another_model_are_refused(tmp_path, wrong, message):
    other = tiny_llama(0, vocab=wrong.get("vocab", 96), hidden=wrong.get("hidden", 32))
    write_medusa(tmp_path, other)
    with pytest.raises(ModelLoadError, match=message):
        load_medusa(tmp_path, LanguageModel(tiny_llama(0)), "tiny")


# ------------------------------------------------------------------- loading: EAGLE


def _reference_layer(model, tensors, prefix: str):
    """transformers' own LlamaDecoderLayer with the head's weights (EAGLE-1: no input norm)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    layer = LlamaDecoderLayer(model.config, 0)
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({k[len(prefix) + 1 :]: v for k, v in tensors.items()
                           if k.startswith(prefix) and "rotary" not in k}, strict=False)  # fmt: skip
    return layer.eval(), LlamaRotaryEmbedding(config=model.config)


@pytest.mark.parametrize("pickle", [True, False], ids=["pytorch_model.bin", "model.safetensors"])
def test_eagle1_layout_loads_and_matches_a_llama_layer(tmp_path, pickle):
    """fc([embed(x[i+1]), h[i]]) through a Llama layer without its input norm, as EAGLE-1 defines it."""
    model = tiny_llama(0)
    tensors = write_eagle1(tmp_path, model, pickle=pickle)
    drafter = load_eagle(tmp_path, LanguageModel(model), "tiny")
    assert drafter.config.version == 1 and drafter.vocab.ids is None
    n = 6
    features, tokens = torch.randn(1, n, 32), torch.randint(0, 96, (1, n))
    positions = torch.arange(n)[None]
    with torch.no_grad():
        ours = drafter(features, tokens, positions)
        x = F.linear(torch.cat([model.model.embed_tokens(tokens), features], -1), tensors["fc.weight"], tensors["fc.bias"])
        layer, rotary = _reference_layer(model, tensors, "layers.0")
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        theirs = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary(x, positions))
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_eagle_cache_continues_a_sequence_exactly():
    """Feeding positions in pieces through the draft cache equals feeding them at once."""
    model = tiny_llama(0)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        write_eagle1(Path(tmp), model)
        drafter = load_eagle(Path(tmp), LanguageModel(model), "tiny")
    features, tokens = torch.randn(1, 9, 32), torch.randint(0, 96, (1, 9))
    with torch.no_grad():
        whole = drafter(features, tokens, torch.arange(9)[None])
        cache = DraftCache()
        parts = [drafter(features[:, a:b], tokens[:, a:b], torch.arange(a, b)[None], cache=cache) for a, b in ((0, 4), (4, 5), (5, 9))]
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-5, atol=1e-5)
    assert len(cache) == 9
    cache.crop(5)
    assert len(cache) == 5


def test_eagle3_layout_loads_and_computes_the_published_formula(tmp_path):
    model = tiny_llama(0, layers=5)
    tensors = write_eagle3(tmp_path, model, draft_vocab=40)
    drafter = load_eagle(tmp_path, LanguageModel(model), "tiny")
    assert drafter.config.version == 3 and len(drafter.vocab) == 40
    assert eagle3_feature_layers(5) == (2, 2, 2) and eagle3_feature_layers(32) == (2, 16, 29)
    features, token = torch.randn(1, 1, 96), torch.tensor([[7]])

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model.config.rms_norm_eps)

    with torch.no_grad():
        out = drafter(features, token, torch.zeros(1, 1, dtype=torch.long))
        # One position: attention returns its own value vector (rotary does not touch values).
        hidden = features @ tensors["fc.weight"].T
        joined = torch.cat([rms(model.model.embed_tokens(token), tensors["midlayer.input_layernorm.weight"]),
                            rms(hidden, tensors["midlayer.hidden_norm.weight"])], -1)  # fmt: skip
        v = joined @ tensors["midlayer.self_attn.v_proj.weight"].T  # [1, 1, kv * d]
        v = v.view(1, 1, 2, 8).repeat_interleave(2, dim=2).reshape(1, 1, 32)
        hidden = hidden + v @ tensors["midlayer.self_attn.o_proj.weight"].T
        normed = rms(hidden, tensors["midlayer.post_attention_layernorm.weight"])
        mlp = (F.silu(normed @ tensors["midlayer.mlp.gate_proj.weight"].T) * (normed @ tensors["midlayer.mlp.up_proj.weight"].T))
        hidden = hidden + mlp @ tensors["midlayer.mlp.down_proj.weight"].T
        torch.testing.assert_close(out, hidden, rtol=1e-5, atol=1e-5)
        scores = rms(hidden, tensors["norm.weight"]) @ tensors["lm_head.weight"].T
        best = int(scores.argmax())
        assert int(drafter.vocab.top(drafter.head_input(out[0]), 1)[1][0, 0]) == best + int(tensors["d2t"][best])


def test_eagle_heads_for_another_model_are_refused(tmp_path):
    write_eagle1(tmp_path / "narrow", tiny_llama(0), hidden=16)
    with pytest.raises(ModelLoadError, match="hidden size 16 in the heads, 32 in the model"):
        load_eagle(tmp_path / "narrow", LanguageModel(tiny_llama(0)), "tiny")
    write_eagle1(tmp_path / "vocab", tiny_llama(0, vocab=120))
    with pytest.raises(ModelLoadError, match="vocabulary size 120 in the heads, 96 in the model"):
        load_eagle(tmp_path / "vocab", LanguageModel(tiny_llama(0)), "tiny")
    tensors = write_eagle3(tmp_path / "d2t", tiny_llama(0), draft_vocab=10)
    tensors["d2t"][3] = 500
    torch.save(tensors, tmp_path / "d2t" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="outside the model's 96-token vocabulary"):
        load_eagle(tmp_path / "d2t", LanguageModel(tiny_llama(0)), "tiny")


class Payload:
    """Unpickling this would mean importing and running code from the head file."""

    def __reduce__(self):
        return (print, ("a pickle ran code",))


def test_a_pickle_that_holds_more_than_tensors_is_refused(tmp_path, capsys):
    """weights_only=True: a head file can never run code, and must hold tensors only."""
    write_medusa(tmp_path, tiny_llama(0), heads=1)
    torch.save({"0.0.linear.weight": Payload()}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ModelLoadError, match="cannot load .*medusa_lm_head.pt") as info:
        load_medusa(tmp_path, LanguageModel(tiny_llama(0)), "tiny")
    assert "weights_only" in info.value.hint and "a pickle ran code" not in capsys.readouterr().out
    torch.save({"0.0.linear.weight": [1.0, 2.0]}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ModelLoadError, match="does not hold a plain mapping of tensors"):
        load_medusa(tmp_path, LanguageModel(tiny_llama(0)), "tiny")


def test_broken_head_directories_get_one_clear_error(tmp_path):
    model = LanguageModel(tiny_llama(0))
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_medusa(tmp_path, model, "tiny")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    with pytest.raises(ModelLoadError, match="no weights in"):
        load_medusa(tmp_path, model, "tiny")
    (tmp_path / "medusa_lm_head.safetensors").write_bytes(b"\x05\x00\x00")
    with pytest.raises(ModelLoadError, match="cannot load"):
        load_medusa(tmp_path, model, "tiny")


def test_methods_explain_missing_or_mismatched_heads(tmp_path):
    model = tiny_llama(0)
    with pytest.raises(PardecUsageError, match="no Medusa heads are installed for tiny") as info:
        registry.create("medusa", {}, head_env(model, {}))
    assert "pardec train-heads --kind medusa" in info.value.hint
    write_eagle3(tmp_path / "e3", model)
    with pytest.raises(PardecUsageError, match="EAGLE-3 heads") as info:
        registry.create("eagle", {"heads": str(tmp_path / "e3")}, head_env(model, {}))
    assert info.value.hint == "use --method eagle3"
    with pytest.raises(PardecUsageError, match="no such directory"):
        registry.create("eagle", {"heads": str(tmp_path / "nowhere")}, head_env(model, {}))
    write_medusa(tmp_path / "m", model)
    with pytest.raises(PardecUsageError, match="ship no draft vocabulary"):
        registry.create("medusa", {"heads": str(tmp_path / "m"), "draft_vocab": 10}, head_env(model, {}))
    with pytest.raises(PardecUsageError, match="tree must be one of"):
        registry.create("medusa", {"heads": str(tmp_path / "m"), "tree": "bushy"}, head_env(model, {}))
