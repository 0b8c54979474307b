"""The reference connector with a bug planted (tests only, never shipped),
with the counts and the telemetry of a correct load:
- WrongBlockReferenceConnector: every load from the host store serves the
  bytes of another stored block, the oldest one sealed;
- SwappedBlocksReferenceConnector: every load serves the block sealed next to
  it (the 1st and 2nd sealed swapped, the 3rd and 4th, ...): a request's own
  bytes, each at another position, so an oracle that compares the blocks as a
  set stays green.

The reload tests run against it too, marked to fail (tests/vllm/wrong_block.py):
an oracle that stays green while another request's KV is served proves nothing.

Load one in vLLM with kv_connector="WrongBlockReferenceConnector",
kv_connector_module_path="pipeline.vllm_driver.planted_bug".
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


class SwappedBlocksReferenceConnector(ActiveKVReferenceConnector):
    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        arena = self.worker_side.arena
        sealed: list[int] = []
        seal, read = arena.seal, arena.read

        def sealing(slot, key):
            sealed.append(slot)
            seal(slot, key)

        def reading_its_neighbour(slot, offset, nbytes):
            i = sealed.index(slot) if slot in sealed else -1
            if i >= 0 and (i ^ 1) < len(sealed):
                slot = sealed[i ^ 1]
            return read(slot, offset, nbytes)

        arena.seal, arena.read = sealing, reading_its_neighbour
