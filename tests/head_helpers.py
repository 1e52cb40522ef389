"""Random heads written in the published layouts, for tiny models (tests only)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pardec_cli.engine.model import LanguageModel
from pardec_cli.methods.base import MethodEnv
from tests.test_exactness import FakeTokenizer


def llama_head_config(model, **extra) -> dict:
    """An EAGLE config.json: the target's layer shape, one layer (as yuhuili's repos ship it)."""
    c = model.config
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": "silu", "vocab_size": c.vocab_size, "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": 10000.0, "torch_dtype": "float16",
    }  # fmt: skip
    config.update(extra)
    return config


def _layer_tensors(prefix: str, hidden: int, inner: int, heads: int, kv_heads: int, in_size: int, gen) -> dict:
    s = 0.2
    head_dim = hidden // heads
    return {
        f"{prefix}.self_attn.q_proj.weight": torch.randn(heads * head_dim, in_size, generator=gen) * s,
        f"{prefix}.self_attn.k_proj.weight": torch.randn(kv_heads * head_dim, in_size, generator=gen) * s,
        f"{prefix}.self_attn.v_proj.weight": torch.randn(kv_heads * head_dim, in_size, generator=gen) * s,
        f"{prefix}.self_attn.o_proj.weight": torch.randn(hidden, heads * head_dim, generator=gen) * s,
        f"{prefix}.mlp.gate_proj.weight": torch.randn(inner, hidden, generator=gen) * 0.2,
        f"{prefix}.mlp.up_proj.weight": torch.randn(inner, hidden, generator=gen) * 0.2,
        f"{prefix}.mlp.down_proj.weight": torch.randn(hidden, inner, generator=gen) * 0.2,
        f"{prefix}.post_attention_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
    }


def write_eagle1(folder: Path, model, *, seed: int = 0, pickle: bool = True, hidden: int | None = None) -> dict:
    """EAGLE-1 heads as yuhuili publishes them: pytorch_model.bin with fc, layers.0 (no input norm), embed_tokens."""
    gen = torch.Generator().manual_seed(seed)
    c = model.config
    h = hidden or c.hidden_size
    tensors = {
        "fc.weight": torch.randn(h, 2 * h, generator=gen) * 0.2,
        "fc.bias": torch.randn(h, generator=gen) * 0.1,
        "embed_tokens.weight": model.model.embed_tokens.weight.detach().clone()[:, :h],
        "layers.0.self_attn.rotary_emb.inv_freq": torch.ones(h // c.num_attention_heads // 2),
        **_layer_tensors("layers.0", h, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, h, gen),
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(llama_head_config(model, hidden_size=h)))
    if pickle:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def write_eagle3(folder: Path, model, *, seed: int = 0, draft_vocab: int = 40) -> dict:
    """EAGLE-3 heads: midlayer (q/k/v over 2h), fc over 3h, norm, its own lm_head, d2t/t2d."""
    gen = torch.Generator().manual_seed(seed)
    c = model.config
    h = c.hidden_size
    used = torch.randperm(c.vocab_size, generator=gen)[:draft_vocab].sort().values
    tensors = {
        "fc.weight": torch.randn(h, 3 * h, generator=gen) * 0.2,
        "midlayer.input_layernorm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
        "midlayer.hidden_norm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
        **_layer_tensors("midlayer", h, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, 2 * h, gen),
        "norm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
        "lm_head.weight": torch.randn(draft_vocab, h, generator=gen),
        "d2t": used - torch.arange(draft_vocab),
        "t2d": torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, used, True),
    }
    folder.mkdir(parents=True, exist_ok=True)
    config = llama_head_config(model, draft_vocab_size=draft_vocab, architectures=["LlamaForCausalLMEagle3"])
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(tensors, folder / "pytorch_model.bin")
    return tensors


def write_medusa(folder: Path, model, *, heads: int = 3, layers: int = 1, seed: int = 0, config_heads: int | None = None,
                 own_lm_heads: bool = True, safetensors: bool = False, scale: float = 0.5) -> dict:  # fmt: skip
    """Medusa heads as FasterDecoding publishes them: {head}.{layer}.linear.*, {head}.{layers}.weight."""
    gen = torch.Generator().manual_seed(seed)
    h, vocab = model.config.hidden_size, model.config.vocab_size
    tensors = {}
    for head in range(heads):
        for layer in range(layers):
            tensors[f"{head}.{layer}.linear.weight"] = torch.randn(h, h, generator=gen) * scale
            tensors[f"{head}.{layer}.linear.bias"] = torch.randn(h, generator=gen) * scale
        lm = torch.randn(vocab, h, generator=gen) if own_lm_heads else model.lm_head.weight.detach().clone()
        tensors[f"{head}.{layers}.weight"] = lm.to(torch.float16)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": config_heads or heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny/model"}
    (folder / "config.json").write_text(json.dumps(config))
    if safetensors:
        from safetensors.torch import save_file

        save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(tensors, folder / "medusa_lm_head.pt")
    return tensors


def head_env(model, folders: dict[str, Path], target: LanguageModel | None = None) -> MethodEnv:
    """A MethodEnv whose installed heads are `folders` (kind -> directory); the target is
    `target` (a runner over `model`) or an eager LanguageModel."""
    return MethodEnv(target or LanguageModel(model), FakeTokenizer(model.config.vocab_size), None, folders.get, "tiny")
