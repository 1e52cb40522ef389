"""EAGLE draft heads: one decoder layer that predicts the target's next hidden state.

EAGLE-1/2 (Li et al. 2024; the yuhuili/EAGLE-* repos): the draft input at position i is
``fc([embed(x[i+1]), h[i]])`` -- the token *after* position i, embedded with the
target's embedding, next to the target's final (post-norm) hidden state at i -- run
through one Llama decoder layer whose input norm is left out. Its output approximates
h[i+1]; the target's own LM head turns it into a guess for x[i+2]. Published files:
config.json (a one-layer Llama config), ``fc.weight`` [h, 2h] (+ ``fc.bias`` unless the
config says ``"bias": false``), ``layers.0.*`` (no ``input_layernorm``), optionally a copy
of the target's ``embed_tokens.weight``; in pytorch_model.bin or model.safetensors.

EAGLE-3 (Li et al. 2025): the features are three of the target's hidden states -- the
inputs of layers 2, n // 2 and n - 3 -- concatenated and projected by ``fc.weight``
[h, 3h]; the layer (``midlayer.*``) attends over ``[input_layernorm(embed), hidden_norm(h)]``
(so its q/k/v projections take 2h inputs), then ``norm`` and its own ``lm_head`` score a
draft vocabulary of ``draft_vocab_size`` tokens, draft token j being target token
``j + d2t[j]``.

When drafting deeper than one token, the draft feeds its own output in place of the
target's hidden state (both versions). It keeps its own KV cache (`DraftCache`), one
entry per position whose target state it has seen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from pardec_cli.errors import ModelLoadError
from pardec_cli.heads.files import expect_shape, find_weights, load_tensors, mismatch, read_config, save_tensors
from pardec_cli.heads.vocab import DraftVocab

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.bin", "pytorch_model.pt")
# Buffers older checkpoints saved that a rotary embedding recomputes anyway.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def eagle3_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The target hidden states EAGLE-3 reads: the inputs of layers 2, n // 2 and n - 3 (low, middle, high)."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class EagleConfig:
    """The shape of an EAGLE head, from its config.json."""

    version: int  # 1 (EAGLE-1/2) or 3
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    vocab_size: int
    target_hidden_size: int
    draft_vocab_size: int = 0  # EAGLE-3 only
    fc_bias: bool = True  # EAGLE-1 heads have one, EAGLE-3 heads none
    qkv_bias: bool = False
    raw: Mapping[str, Any] | None = None  # the whole config.json, for the rotary embedding

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], version: int, what: str) -> EagleConfig:
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            return cls(
                version=version,
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                hidden_act=str(raw.get("hidden_act", "silu")),
                vocab_size=int(raw["vocab_size"]),
                target_hidden_size=int(raw.get("target_hidden_size") or hidden),
                draft_vocab_size=int(raw.get("draft_vocab_size") or raw["vocab_size"]) if version == 3 else 0,
                fc_bias=bool(raw.get("bias", version == 1)),  # EAGLE-3's fc has none
                qkv_bias=bool(raw.get("qkv_bias", raw.get("attention_bias", False))),
                raw=dict(raw),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{what}: config.json lacks or garbles {exc}") from None

    def to_json(self) -> dict[str, Any]:
        """A config.json in the published layout (a one-layer Llama config)."""
        data = dict(self.raw or {})
        data.update({
            "architectures": ["LlamaForCausalLMEagle3" if self.version == 3 else "LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": self.hidden_act,
            "vocab_size": self.vocab_size,
        })  # fmt: skip
        if self.version == 3:
            data["draft_vocab_size"] = self.draft_vocab_size
            if self.target_hidden_size != self.hidden_size:
                data["target_hidden_size"] = self.target_hidden_size
        else:
            data["bias"] = self.fc_bias
        return data

    def rotary(self) -> nn.Module:
        """The rotary embedding the layer's config describes (rope_theta, rope_scaling...)."""
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        known = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "partial_rotary_factor")
        extra = {k: v for k, v in (self.raw or {}).items() if k in known and v is not None}
        config = LlamaConfig(
            hidden_size=self.hidden_size, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, **extra,
        )  # fmt: skip
        return LlamaRotaryEmbedding(config=config)


class DraftCache:
    """The draft layer's keys and values, [1, kv_heads, length, head_dim] each; cropped back after drafting."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[-2])

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=-2)
            self.values = torch.cat([self.values, values], dim=-2)
        return self.keys, self.values

    def crop(self, length: int) -> None:
        """Keep the first `length` positions."""
        if self.keys is not None and self.values is not None and length < len(self):
            self.keys, self.values = self.keys[..., :length, :], self.values[..., :length, :]


class RMSNorm(nn.Module):
    """Llama's RMS norm (computed in float32)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DraftAttention(nn.Module):
    """Llama attention whose q/k/v read `in_size` features (h for EAGLE-1, 2h for EAGLE-3)."""

    def __init__(self, config: EagleConfig, in_size: int) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(in_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(in_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(in_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: DraftCache | None, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """x [B, n, in] -> [B, n, h]. mask: bool [B|1, 1, n, past + n] (True: attend), None: causal."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, n, d]
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, n, d]
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in rope)  # [B|1, 1, n, d]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.append(k, v)
        if self.num_kv_heads != self.num_heads:
            k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
            v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        causal = mask is None and n > 1
        if causal and k.shape[-2] != n:  # new positions after cached ones: causal, offset by the past
            past = k.shape[-2] - n
            mask = torch.ones(n, past + n, dtype=torch.bool, device=x.device).tril(past)[None, None]
            causal = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)  # [B, H, n, d]
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))


class DraftMLP(nn.Module):
    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """EAGLE-1's layer 0 (no input norm) or EAGLE-3's midlayer (norms its two inputs, attends over both)."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.version = config.version
        h = config.hidden_size
        self.self_attn = DraftAttention(config, 2 * h if config.version == 3 else h)
        self.mlp = DraftMLP(config)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        if config.version == 3:
            self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
            self.hidden_norm = RMSNorm(h, config.rms_norm_eps)

    def forward(
        self, embeds: torch.Tensor | None, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
        cache: DraftCache | None, mask: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        residual = hidden
        if self.version == 3:
            assert embeds is not None
            hidden = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = residual + self.self_attn(hidden, rope, cache, mask)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleDrafter(nn.Module):
    """An EAGLE head bound to its target's token embedding (and, for EAGLE-1, LM head).

    `forward(features, tokens, positions)` runs the draft layer; `vocab` scores its
    output (`head_input` first applies EAGLE-3's final norm).
    """

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        in_features = 2 * h if config.version == 1 else 3 * config.target_hidden_size
        self.fc = nn.Linear(in_features, h, bias=config.fc_bias)
        if config.version == 1:
            self.layers = nn.ModuleList([DraftLayer(config)])
        else:
            self.midlayer = DraftLayer(config)
            self.norm = RMSNorm(h, config.rms_norm_eps)
            self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = config.rotary()
        # The target's embedding: shared, frozen, never saved with the head (a plain
        # tensor, not a Parameter, so the module does not own it).
        self.embed_weight = embed_weight.detach()
        self.vocab: DraftVocab | None = None

    @property
    def layer(self) -> DraftLayer:
        return self.layers[0] if self.config.version == 1 else self.midlayer

    def forward(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        cache: DraftCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One draft-layer pass.

        features: [B, n, F], the target's features at each position (EAGLE-1: its final
        state, F = h; EAGLE-3: three states, F = 3h) or the draft's own earlier outputs
        ([B, n, h], when drafting deeper);
        tokens: [B, n] the token after each position; positions: [B|1, n].
        mask: bool [B|1, 1, n, len(cache) + n] (True: may attend), None: causal.
        Returns the draft's outputs [B, n, h] (its guess of the next position's state).
        """
        embeds = F.embedding(tokens, self.embed_weight).to(features.dtype)
        if self.config.version == 1:
            hidden, embeds_for_layer = self.fc(torch.cat([embeds, features], dim=-1)), None
        else:
            hidden = self.fc(features) if features.shape[-1] != self.config.hidden_size else features
            embeds_for_layer = embeds
        cos, sin = self.rotary(hidden, positions)
        return self.layer(embeds_for_layer, hidden, (cos.to(hidden.dtype), sin.to(hidden.dtype)), cache, mask)

    def head_input(self, output: torch.Tensor) -> torch.Tensor:
        """What the draft vocabulary scores: EAGLE-3 norms the output first; EAGLE-1 scores it as is."""
        return self.norm(output) if self.config.version == 3 else output

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The tensors of the published file (no embedding, no rotary buffers)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}


# ----------------------------------------------------------------------- loading


def detect_version(raw: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> int:
    """3 when the head has EAGLE-3's midlayer, 1 for EAGLE-1/2's layers.0."""
    if any(k.startswith("midlayer.") for k in tensors):
        return 3
    if any(k.startswith("layers.0.") for k in tensors):
        return 1
    raise ModelLoadError("EAGLE heads: the weights have neither layers.0.* (EAGLE-1/2) nor midlayer.* (EAGLE-3)")


def load_eagle(folder: Path, target: Any, model_name: str, *, draft_vocab: list[int] | None = None) -> EagleDrafter:
    """An EAGLE head from `folder`, checked against and bound to `target` (a LanguageModel).

    Mismatched heads (hidden size, vocabulary, layer count) are refused with a message
    naming the difference. `draft_vocab` (EAGLE-1 only): target ids to draft from
    instead of the whole vocabulary.
    """
    what = f"EAGLE heads in {folder}"
    raw = read_config(folder, what)
    tensors = {k: v for k, v in load_tensors(find_weights(folder, WEIGHT_FILES, what), what).items()
               if not k.endswith(_IGNORED_SUFFIXES)}  # fmt: skip
    version = detect_version(raw, tensors)
    # Biases as the tensors have them (configs disagree on how to say so: "bias", "qkv_bias").
    layer = "layers.0" if version == 1 else "midlayer"
    config = dataclasses.replace(
        EagleConfig.from_json(raw, version, what),
        fc_bias="fc.bias" in tensors, qkv_bias=f"{layer}.self_attn.q_proj.bias" in tensors,
    )  # fmt: skip
    model_config = target.config
    target_hidden, target_layers = int(model_config.hidden_size), int(model_config.num_hidden_layers)
    vocab = target.vocab_size
    if int(raw.get("num_hidden_layers", 1)) != 1:
        raise ModelLoadError(f"{what}: config.json has {raw['num_hidden_layers']} layers; EAGLE heads have one")
    if config.target_hidden_size != target_hidden:
        raise mismatch("EAGLE heads", "hidden size", config.target_hidden_size, target_hidden, model_name)
    if config.vocab_size != vocab and config.vocab_size != int(model_config.vocab_size):
        raise mismatch("EAGLE heads", "vocabulary size", config.vocab_size, vocab, model_name)
    if version == 3 and target_layers < 4:
        raise ModelLoadError(f"EAGLE-3 heads need a model with at least 4 layers; {model_name} has {target_layers}")
    embed = target.model.get_input_embeddings().weight
    own_embed = tensors.pop("embed_tokens.weight", None)
    if own_embed is not None and own_embed.shape[-1] != config.hidden_size:
        raise ModelLoadError(f"{what}: embed_tokens.weight has width {own_embed.shape[-1]}, the head {config.hidden_size}")
    if config.hidden_size != embed.shape[-1]:
        if own_embed is None:
            raise mismatch("EAGLE heads", "hidden size", config.hidden_size, int(embed.shape[-1]), model_name)
        embed = own_embed.to(device=target.device, dtype=target.dtype)  # a head narrower than its target brings its own
    drafter = EagleDrafter(config, embed)
    expected = drafter.trainable_state()
    for name, tensor in expected.items():
        expect_shape(tensors, name, tensor.shape, what)
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise ModelLoadError(f"{what}: unexpected tensor {extra[0]!r} (not an EAGLE-{version} layout)")
    drafter.load_state_dict(tensors, strict=False)
    drafter.to(device=target.device, dtype=target.dtype)
    if version == 3:
        ids = torch.arange(config.draft_vocab_size, device=target.device) + drafter.d2t
        if int(ids.max()) >= vocab or int(ids.min()) < 0:
            raise ModelLoadError(f"{what}: d2t maps draft tokens outside the model's {vocab}-token vocabulary")
        drafter.vocab = DraftVocab(drafter.lm_head.weight, ids)
    else:
        drafter.vocab = DraftVocab.restricted(target.model.get_output_embeddings().weight, draft_vocab)
    return drafter.eval().requires_grad_(False)


def save_eagle(drafter: EagleDrafter, folder: Path, *, base_model: str, extra_config: Mapping[str, Any] | None = None) -> None:
    """Write `drafter` in the published layout: config.json + model.safetensors."""
    import json

    config = drafter.config.to_json()
    config["base_model_name_or_path"] = base_model
    config.update(extra_config or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    save_tensors(drafter.trainable_state(), folder / "model.safetensors")


def new_eagle_config(target_config: Any, version: int = 1, draft_vocab_size: int = 0) -> EagleConfig:
    """The config of a fresh head for a target: its layer shape, one layer."""
    raw = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    keep = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "rms_norm_eps", "hidden_act",
            "intermediate_size", "num_key_value_heads", "head_dim", "pad_token_id", "bos_token_id", "eos_token_id")
    base = {k: raw[k] for k in keep if raw.get(k) is not None}
    base.update(hidden_size=hidden, num_attention_heads=heads, vocab_size=int(raw["vocab_size"]), num_hidden_layers=1)
    if version == 3:
        base["draft_vocab_size"] = draft_vocab_size or int(raw["vocab_size"])
    return EagleConfig.from_json(base, version, "new EAGLE head")


def init_scale(module: nn.Module) -> None:
    """Small random init (std 0.02, zero biases), like the reference training code."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=0.02)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
