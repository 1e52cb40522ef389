"""Tiny random models for fast, exact tests (no download, no tokenizer needed)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(
    seed: int = 0, *, vocab: int = 96, layers: int = 4, hidden: int = 32, max_positions: int = 512
) -> LlamaForCausalLM:
    """A random float32 Llama small enough that a forward takes well under a millisecond.

    Random weights give nearly uniform next-token distributions, so greedy output has
    few repeats; the `peaked` variant below makes drafts that actually get accepted.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return model


def peaked(model: LlamaForCausalLM, scale: float = 8.0) -> LlamaForCausalLM:
    """Sharpen the LM head so greedy text falls into repetitive loops (high acceptance)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")


def save_with_real_tokenizer(make: Callable[[int], LlamaForCausalLM], tokenizer_dir: Path, path: Path) -> Path:
    """Save `make(vocab)` (a tiny model over the real tokenizer's vocabulary) to `path`,
    next to the tokenizer and chat template copied from `tokenizer_dir`: a model folder
    that pardec loads like any other, in well under a second."""
    for file in tokenizer_dir.iterdir():
        if file.is_file() and file.name.startswith(TOKENIZER_FILES):
            shutil.copy(file, path / file.name)
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    make(vocab).save_pretrained(path)
    return path


WORDS = tuple(f"w{i}" for i in range(3, 96))  # ids 3..95; 0-2 are <unk>, <s>, </s>
WORD_CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}> {{ m.content }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def word_level_tokenizer() -> Any:
    """A 96-token word-level tokenizer built in memory: '<unk>' '<s>' '</s>' (EOS), then
    'w3' ... 'w95'; words split on whitespace and punctuation, anything unknown is '<unk>'.
    It decodes by joining words with spaces, and has a small chat template (the role
    tags are single '<unk>' pieces), so prompts, stop strings and templates behave as
    with a real tokenizer, at no cost."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{word: i for i, word in enumerate(WORDS, start=3)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    word_level.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>")
    tokenizer.chat_template = WORD_CHAT_TEMPLATE
    return tokenizer


def save_word_level_model(path: Path, *, seed: int = 0, layers: int = 2, max_positions: int = 512) -> Path:
    """A complete model folder at `path`: a peaked tiny Llama over `word_level_tokenizer()`,
    float32 safetensors, loadable by `pardec gen -m PATH` in a fraction of a second."""
    word_level_tokenizer().save_pretrained(path)
    peaked(tiny_llama(seed, vocab=len(WORDS) + 3, layers=layers, max_positions=max_positions)).save_pretrained(path)
    return path
