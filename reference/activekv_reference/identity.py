"""Block identity: a hash chain over full blocks of token ids, bound to the model.

A block's key commits to every token before it (the chain), to the model
identity (model, dtype, layer geometry, block size, tensor-parallel layout) and
to the request's ``cache_salt``. KV of another model, layout or tenant never
shares a key, so it is never served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Sequence

BlockKey = bytes  # 32-byte SHA-256 digest


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelIdentity:
    model: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    tp_size: int

    def digest(self) -> bytes:
        """Stable digest of the identity (same bytes in every process)."""
        text = "|".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))
        return hashlib.sha256(b"activekv-identity-v1|" + text.encode()).digest()


def chain_root(identity_digest: bytes, cache_salt: str | None) -> BlockKey:
    """Key that precedes block 0: binds the chain to the model and the tenant."""
    salt = b"" if cache_salt is None else b"salt:" + cache_salt.encode()
    return hashlib.sha256(identity_digest + struct.pack("<Q", len(salt)) + salt).digest()


def next_key(parent: BlockKey, block_tokens: Sequence[int]) -> BlockKey:
    """Key of the block holding ``block_tokens``, following ``parent``."""
    payload = struct.pack(f"<{len(block_tokens)}q", *block_tokens)
    return hashlib.sha256(parent + payload).digest()


def block_keys(
    identity_digest: bytes,
    cache_salt: str | None,
    token_ids: Sequence[int],
    block_size: int,
    prev: Sequence[BlockKey] = (),
) -> list[BlockKey]:
    """Keys of every full block in ``token_ids``.

    ``prev`` holds keys already computed for the first ``len(prev)`` blocks, so
    a growing sequence is hashed once per block.
    """
    keys = list(prev)
    parent = keys[-1] if keys else chain_root(identity_digest, cache_salt)
    for i in range(len(keys), len(token_ids) // block_size):
        parent = next_key(parent, token_ids[i * block_size : (i + 1) * block_size])
        keys.append(parent)
    return keys
