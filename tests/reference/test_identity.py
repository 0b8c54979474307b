from __future__ import annotations

import dataclasses

from activekv_reference.identity import ModelIdentity, block_keys

IDENTITY = ModelIdentity(
    model="tiny",
    dtype="bfloat16",
    num_layers=4,
    num_kv_heads=2,
    head_size=32,
    block_size=4,
    tp_size=1,
)
TOKENS = list(range(10, 30))  # 5 full blocks of 4


def keys(tokens=TOKENS, identity=IDENTITY, salt=None, prev=()):
    return block_keys(identity.digest(), salt, tokens, identity.block_size, prev)


def test_one_key_per_full_block_and_partial_block_ignored():
    assert len(keys()) == 5
    assert keys(TOKENS + [1, 2, 3]) == keys()
    assert len(set(keys())) == 5


def test_key_commits_to_every_earlier_token():
    changed = list(TOKENS)
    changed[1] += 1  # a token in block 0
    assert all(a != b for a, b in zip(keys(), keys(changed), strict=False))
    changed = list(TOKENS)
    changed[13] += 1  # a token in block 3
    assert keys()[:3] == keys(changed)[:3]
    assert all(a != b for a, b in zip(keys()[3:], keys(changed)[3:], strict=False))


def test_salt_and_every_identity_field_separate_keys():
    base = keys()
    assert keys(salt="a") != base and keys(salt="a") != keys(salt="b")
    assert keys(salt="") != base  # empty salt is still a salt
    for field in dataclasses.fields(ModelIdentity):
        value = getattr(IDENTITY, field.name)
        other = value + "x" if isinstance(value, str) else value + 1
        changed = dataclasses.replace(IDENTITY, **{field.name: other})
        if field.name == "block_size":
            continue  # a different block size chunks the tokens differently
        assert keys(identity=changed)[0] != base[0], field.name


def test_extending_from_previous_keys_matches_hashing_from_scratch():
    assert keys(prev=keys(TOKENS[:8])) == keys()
