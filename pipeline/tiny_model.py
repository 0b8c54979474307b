"""A tiny random-weight Llama, generated on demand into a cache directory.

Deterministic (fixed seed), bf16, 4 layers, hidden 128, 2 KV heads, vocab 512.
A larger init range than transformers' default makes the logits peaked, so
greedy decoding does not hinge on bf16 rounding ties.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CONFIG = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "initializer_range": 0.2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}
SEED = 0
DTYPE = "bfloat16"
# Token ids the prompts may use (0..2 are pad, bos and eos).
FIRST_TOKEN, VOCAB = 3, CONFIG["vocab_size"]


def head_size() -> int:
    return CONFIG["hidden_size"] // CONFIG["num_attention_heads"]


def tiny_llama(cache_root: Path) -> Path:
    """Path of the generated model; made once per configuration."""
    tag = hashlib.sha256(json.dumps([CONFIG, SEED, DTYPE], sort_keys=True).encode()).hexdigest()
    path = cache_root / f"tiny-llama-{tag[:12]}"
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(getattr(torch, DTYPE))
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tmp.rename(path)  # atomic: a half-written model is never picked up
    return path
