"""A tokenizer made offline for a random-weight model: one word a token id.

`vllm serve` and `vllm bench serve` want a tokenizer beside the model; the
benchmark's prompts are token ids, so any tokenizer whose ids cover the
vocabulary will do. Word i is "w<i>" (ids 0..3 are pad, bos, eos and unk), so
text and ids map one to one: the client needs no tokenizer of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def word(token_id: int) -> str:
    return SPECIALS[token_id] if token_id < len(SPECIALS) else f"w{token_id}"


def write_tokenizer(model_dir: Path, vocab_size: int) -> None:
    """tokenizer.json and tokenizer_config.json in `model_dir` (kept when
    they already describe this vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    config_path = model_dir / "tokenizer_config.json"
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 1 << 22,
        "add_bos_token": False,
        "activekv_vocab_size": vocab_size,
    }
    if (
        config_path.is_file()
        and json.loads(config_path.read_text()) == config
        and (model_dir / "tokenizer.json").is_file()
    ):
        return
    vocab = {word(i): i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    config_path.write_text(json.dumps(config, indent=1) + "\n")
