"""One host store shared by two vLLM instances (processes) that name the same
store_path: a block one saved is found by the other, cache_salt isolation holds
across them, and one killed with kill -9 in the middle of its saves neither
stops the other nor gets a wrong block served. Native engine only.

The other instance is a child process driven over its stdin; this process is
the in-process instance. The oracle of a reload is this engine's own prefix
hit on KV it computed itself, under a cache_salt of its own: a salt changes
the blocks' keys, not the computation, so those runs never touch the other
instance's blocks and have the shapes of a whole reload."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from tests.vllm.test_store_file import store_llm

pytestmark = pytest.mark.vllm

PROMPTS = [h.random_tokens(random.Random(400 + i), (3 + i % 3) * h.BLOCK_SIZE + 7) for i in range(3)]
# What the child saves in a loop until it is killed: 3-5 blocks each, in a
# store of STORE_BLOCKS, so its saves evict all the time and a kill lands in
# the middle of one.
STORM_PROMPTS = [h.random_tokens(random.Random(500 + i), (3 + i % 3) * h.BLOCK_SIZE + 3) for i in range(8)]
STORE_BLOCKS = 40

# The other instance: answers "gen <prompt> <salt or ->" with a result line,
# "storm" with a "done <i>" line per request until it is killed.
OTHER = """
import json, sys
from pathlib import Path
from pipeline.vllm_driver import llm as h
from tests.vllm.test_shared_store import PROMPTS, STORM_PROMPTS
from tests.vllm.test_store_file import store_llm
llm = store_llm(Path(sys.argv[1]), Path(sys.argv[2]), capacity_bytes=int(sys.argv[3]))
print("ready", flush=True)
while line := sys.stdin.readline():
    cmd, *args = line.split()
    if cmd == "gen":
        salt = None if args[1] == "-" else args[1]
        with h.TelemetryDelta(llm) as delta:
            got = h.generate(llm, [PROMPTS[int(args[0])]], salt=salt)[0]
        print("result " + json.dumps({"hit_tokens": delta["hit_tokens"], "tokens": got.tokens}), flush=True)
    elif cmd == "storm":
        i = 0
        while True:
            h.generate(llm, [STORM_PROMPTS[i % len(STORM_PROMPTS)]])
            print("done", i, flush=True)
            i += 1
"""


class OtherInstance:
    """A vLLM with ActiveKV in a child process, on the same store."""

    def __init__(self, model, path, capacity):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OTHER, str(model), str(path), str(capacity)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, **h.SAME_THREADS),
        )
        self.expect("ready")

    def expect(self, prefix: str) -> str:
        while True:
            line = self.proc.stdout.readline()  # vLLM's own log lines come here too
            assert line, "the other vLLM instance stopped by itself"
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    def generate(self, prompt: int, salt: str | None = None) -> dict:
        self.proc.stdin.write(f"gen {prompt} {salt or '-'}\n")
        self.proc.stdin.flush()
        return json.loads(self.expect("result "))

    def kill_during_a_save_storm(self, rng: random.Random) -> None:
        self.proc.stdin.write("storm\n")
        self.proc.stdin.flush()
        for _ in range(3 + rng.randrange(4)):  # some requests complete, then a kill at a random point
            self.expect("done ")
        time.sleep(rng.uniform(0, 0.05))
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def oracle(llm, prompt):
    """This engine's cold answer and own prefix hits, under a salt of its own."""
    cold = h.generate(llm, [prompt], salt="oracle")[0]
    return cold, h.own_prefix_hits(llm, [prompt], salt="oracle")


def test_two_vllm_instances_share_one_store(tiny_model, tmp_path, capfd, figures):
    path = tmp_path / "store"
    capacity = STORE_BLOCKS * h.exact_block_bytes()
    reusable = [h.reusable_tokens(len(p)) for p in PROMPTS]
    other = OtherInstance(tiny_model, path, capacity)  # the first: it makes the store
    llm = None
    try:
        saved_by_other = other.generate(0)
        tenant_b = other.generate(1, salt="tenant-b")
        assert saved_by_other["hit_tokens"] == 0 and tenant_b["hit_tokens"] == 0
        with h.StartupLines() as lines:
            llm = store_llm(tiny_model, path, capacity_bytes=capacity)
        started = "\n".join(lines) + "".join(capfd.readouterr())
        assert f"ActiveKV host store {path}: shared with 1 running vLLM instance(s)" in started, started[-3000:]
        assert "joined the running vLLM instance(s)" in started, started[-3000:]

        # A block the other saved is found here, bit for bit this engine's own prefix hit.
        cold, own_hits = oracle(llm, PROMPTS[0])
        with h.TelemetryDelta(llm) as delta:
            got = h.generate(llm, [PROMPTS[0]])[0]
        assert delta["hit_tokens"] == reusable[0], "a block the other instance saved was not found"
        assert got.num_cached_tokens == reusable[0]
        assert not comparison.check_reloads([got], own_hits)
        assert list(got.tokens) == saved_by_other["tokens"] and got.tokens == cold.tokens

        # cache_salt holds across instances.
        with h.TelemetryDelta(llm) as stranger:
            h.generate(llm, [PROMPTS[1]], salt="tenant-a")
        with h.TelemetryDelta(llm) as same_tenant:
            tenant = h.generate(llm, [PROMPTS[1]], salt="tenant-b")[0]
        assert stranger["hit_tokens"] == 0, "another tenant's blocks were served across instances"
        assert same_tenant["hit_tokens"] == reusable[1] and list(tenant.tokens) == tenant_b["tokens"]

        # And the other way: saved here, found there.
        mine = h.generate(llm, [PROMPTS[2]])[0]
        found = other.generate(2)
        assert found["hit_tokens"] == reusable[2], "a block this instance saved was not found by the other"
        assert found["tokens"] == list(mine.tokens)

        # The other is killed in the middle of a save storm; this one goes on.
        storm_oracles = {i: oracle(llm, p) for i, p in enumerate(STORM_PROMPTS)}
        other.kill_during_a_save_storm(random.Random(11))
        served = whole = 0
        with h.TelemetryDelta(llm) as after_kill:
            for i in reversed(range(len(STORM_PROMPTS))):  # newest first: the store holds the last ones
                with h.TelemetryDelta(llm) as delta:
                    got = h.generate(llm, [STORM_PROMPTS[i]])[0]
                cold, own_hits = storm_oracles[i]
                what = f"storm prompt {i}, {delta['hit_tokens']} tokens from the store"
                assert got.tokens == cold.tokens, f"{what}: other tokens than its cold run"
                if delta["hit_tokens"] == h.reusable_tokens(len(STORM_PROMPTS[i])):
                    whole += 1
                    assert not comparison.check_reloads([got], own_hits), what
                served += delta["loaded_blocks"]
            # Where the other saved every storm prompt before it died, they are all hits
            # here: a prompt nobody ran must still be saved.
            h.generate(llm, [h.random_tokens(random.Random(600), 4 * h.BLOCK_SIZE + 3)])
        assert after_kill["failed_loads"] == 0, "a block was served from a slot that did not hold it"
        assert after_kill["stored_blocks"] > 0, "this instance stopped saving after the other was killed"
        assert served > 0, "nothing the killed instance saved was served"
    finally:
        other.close()
        if llm is not None:
            h.shutdown(llm)
    figures.append(
        f"shared store: cross hits both ways, salt isolation across instances; after a kill -9 "
        f"mid-storm the survivor served {served} of the killed one's blocks ({whole} prompts "
        f"whole, bit for bit its own prefix hit), every answer its cold run's"
    )
