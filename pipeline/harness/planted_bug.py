"""The reference connector with one bug planted (tests only, never shipped):
every load from the host store serves the bytes of another stored block, the
oldest one sealed, with the counts and the telemetry of a correct load.

The reload tests run against it too, marked to fail (tests/vllm/wrong_block.py):
an oracle that stays green while another request's KV is served proves nothing.

Load it in vLLM with kv_connector="WrongBlockReferenceConnector",
kv_connector_module_path="pipeline.harness.planted_bug".
"""

from __future__ import annotations

import itertools

from activekv_reference import ActiveKVReferenceConnector


class WrongBlockReferenceConnector(ActiveKVReferenceConnector):
    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        arena = self.worker_side.arena
        sealed_at: dict[int, int] = {}
        order = itertools.count()
        seal, read = arena.seal, arena.read

        def sealing(slot, key):
            sealed_at[slot] = next(order)
            seal(slot, key)

        def reading_another(slot, offset, nbytes):
            others = [s for s in sealed_at if s != slot and arena.key(s) is not None]
            return read(min(others, key=sealed_at.get) if others else slot, offset, nbytes)

        arena.seal, arena.read = sealing, reading_another
