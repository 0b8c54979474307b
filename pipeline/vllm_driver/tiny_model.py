"""A tiny random-weight Llama, generated on demand into a cache directory.

Deterministic (fixed seed), bf16, 4 layers, hidden 128, 2 KV heads, vocab 512.

Random weights alone put greedy decoding on near-ties: the top two of 512
random logits are often a bf16 rounding step apart, so the CPU's kernels, the
batch and the prefill's shape flip tokens (seen on an AMX host). The weights
are therefore shaped so that every greedy step has a clear margin:

- the lm_head row of token v is the unit embedding of the token whose
  successor is v (a fixed permutation of the prompt tokens), plus a small
  random part: the logit of the current token's successor stands well above
  the rest (SHAPE["head_alignment"]);
- the layers' output projections (o_proj, down_proj) are scaled down, so the
  context moves the logits (every logprob depends on the KV cache: that is
  what the same-shape oracles compare bit for bit) but does not overturn the
  successor.

The margin is still checked along every oracle's greedy path
(llm.require_clear_margins), so a near-tie is reported as one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
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
# How the random weights are shaped (see the module's doc); part of the cache key.
SHAPE = {
    "head_alignment": 4.0,  # weight of the successor's embedding in each lm_head row
    "head_noise": 0.2,  # what is kept of the random lm_head
    "layer_output_scale": 0.01,  # o_proj and down_proj, against the residual stream
}
# Token ids the prompts may use (0..2 are pad, bos and eos).
FIRST_TOKEN, VOCAB = 3, CONFIG["vocab_size"]


def head_size() -> int:
    return CONFIG["hidden_size"] // CONFIG["num_attention_heads"]


def successor(seed: int = SEED):
    """The permutation of prompt tokens that greedy decoding follows (a tensor)."""
    import torch

    order = torch.randperm(VOCAB - FIRST_TOKEN, generator=torch.Generator().manual_seed(seed + 1))
    return torch.cat([torch.arange(FIRST_TOKEN), FIRST_TOKEN + order])


def _shape(model) -> None:
    import torch

    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        unit = emb / emb.norm(dim=1, keepdim=True).clamp_min(1e-3)  # row 0 (pad) is zero
        nxt = successor()
        source = torch.empty_like(nxt)
        source[nxt] = torch.arange(VOCAB)  # source[v]: the token whose successor is v
        head = SHAPE["head_noise"] * model.lm_head.weight
        head[FIRST_TOKEN:] += SHAPE["head_alignment"] * unit[source[FIRST_TOKEN:]]
        model.lm_head.weight.copy_(head)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(SHAPE["layer_output_scale"])
            layer.mlp.down_proj.weight.mul_(SHAPE["layer_output_scale"])


# Layer streaming needs a deeper model: with R resident layers and a ring of
# K, a budget holds L / (R + K) times more blocks (8x at 16 layers, R=0, K=2).
STREAMING_LAYERS = 16


def tiny_llama(cache_root: Path, num_layers: int | None = None, geometry: dict | None = None) -> Path:
    """Path of the generated model (CONFIG's layers, or `num_layers`; CONFIG's
    geometry with `geometry`'s keys replaced, e.g. a head size of 128); made
    once per configuration."""
    config = dict(CONFIG, **(geometry or {}))
    config["num_hidden_layers"] = num_layers or config["num_hidden_layers"]
    key = [config, SEED, DTYPE, SHAPE]
    tag = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_root / f"tiny-llama-{tag[:12]}"
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**config))
    _shape(model)  # in float32, before the cast
    model = model.to(getattr(torch, DTYPE))
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    try:
        tmp.rename(path)  # atomic: a half-written model is never picked up
    except OSError:  # another process (a test phase beside this one) made it first
        if not (path / "config.json").exists():
            raise
        shutil.rmtree(tmp)
    return path
