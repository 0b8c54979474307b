"""The engines a served sweep compares: each is `vllm serve` with one KV tier,
given the same host bytes, on the same server flags otherwise.

plain               vLLM with its GPU prefix cache only (what every peer adds to)
activekv-exact      ActiveKV's host store, bit for bit vLLM's own KV
activekv-exact-async  the same, hits of 2048+ tokens loaded while vLLM parks the request
                    (async_load_min_tokens; not in the default sweep until it is the default)
activekv-compressed ActiveKV's host store, compressed homes
activekv-streaming  ActiveKV with layer streaming (long contexts past the GPU's budget)
vllm-offloading     vLLM's OffloadingConnector (its CPU tier; --kv-offloading-backend native)
lmcache             LMCache's in-process connector (LMCacheConnectorV1) on its local CPU tier
null-connector      a connector that does nothing (null_connector.py): vLLM's connector
                    path alone, to tell its cost from a tier's (not in the default sweep)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

GIB = 1 << 30
ACTIVEKV = "ActiveKVHostConnector"


@dataclass(frozen=True)
class Engine:
    name: str
    connector: str | None = None
    extra: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    module: str | None = None  # kv_connector_module_path: a connector vLLM does not register

    # host_bytes is the server's total over its workers; each tier takes it
    # as its configuration counts: vLLM's cpu_bytes_to_use is the total,
    # ActiveKV's capacity_bytes and LMCache's local CPU size are per worker.
    def server_args(self, host_bytes: int, workers: int = 1) -> list[str]:
        if not self.connector:
            return []
        extra = {
            k: (
                {"HOST_BYTES": host_bytes, "WORKER_BYTES": host_bytes // workers}.get(v, v) if isinstance(v, str) else v
            )
            for k, v in self.extra.items()
        }
        config = {"kv_connector": self.connector, "kv_role": "kv_both", "kv_connector_extra_config": extra}
        if self.module:
            config["kv_connector_module_path"] = self.module
        return ["--kv-transfer-config", json.dumps(config)]

    def server_env(self, host_bytes: int, workers: int = 1) -> dict[str, str]:
        return {k: (f"{host_bytes / workers / GIB:g}" if v == "WORKER_GIB" else v) for k, v in self.env.items()}


EXACT = {"mode": "exact", "capacity_bytes": "WORKER_BYTES"}

ENGINES: dict[str, Engine] = {
    e.name: e
    for e in [
        Engine("plain"),
        Engine("activekv-exact", ACTIVEKV, EXACT),
        Engine("activekv-exact-async", ACTIVEKV, {**EXACT, "async_load_min_tokens": 2048}),
        Engine("activekv-compressed", ACTIVEKV, {"mode": "compressed", "capacity_bytes": "WORKER_BYTES"}),
        # R resident layers and the ring as the streaming figures in
        # docs/benchmarks/history.md ran them on a 16 GiB budget; --engine-option overrides.
        Engine(
            "activekv-streaming",
            ACTIVEKV,
            {"capacity_bytes": "WORKER_BYTES", "streaming": {"resident_layers": 14, "ring_size": 2}},
        ),
        Engine("vllm-offloading", "OffloadingConnector", {"cpu_bytes_to_use": "HOST_BYTES"}),
        Engine("null-connector", "NullConnector", module="bench.served.null_connector"),
        # LMCache keys its chunks with Python's hash(): without a fixed seed each
        # process keys differently (its docs: 0% hits).
        Engine(
            "lmcache",
            "LMCacheConnectorV1",
            {},
            {
                "PYTHONHASHSEED": "0",
                "LMCACHE_LOCAL_CPU": "True",
                "LMCACHE_MAX_LOCAL_CPU_SIZE": "WORKER_GIB",
                "LMCACHE_CHUNK_SIZE": "256",
                "LMCACHE_TRACK_USAGE": "false",
            },
        ),
    ]
}

DEFAULT_SWEEP = ["plain", "activekv-exact", "activekv-compressed", "vllm-offloading", "lmcache"]


def with_options(engine: Engine, options: dict) -> Engine:
    """The engine with connector options changed (--engine-option key=value)."""
    if not options:
        return engine
    if not engine.connector:
        raise ValueError(f"engine {engine.name} has no connector to take options {sorted(options)}")
    return replace(engine, extra={**engine.extra, **options})  # every other field kept as it is
