"""Admission policy: which full blocks a request may write to the host store."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from .config import ActiveKVConfig
from .identity import BlockKey

# Sighting counts are kept for this many distinct blocks (oldest forgotten first),
# so a long-running server does not grow the table without bound.
MAX_TRACKED_SIGHTINGS = 1 << 16


class AdmissionPolicy:
    def __init__(self, config: ActiveKVConfig, slot_bytes: int):
        self.threshold = config.store_threshold
        self.store_decode = config.store_blocks == "prompt_and_decode"
        # 0 = no cap; otherwise the number of whole blocks the byte cap allows.
        self.max_blocks_per_request = (
            None if config.max_bytes_per_request == 0 else config.max_bytes_per_request // slot_bytes
        )
        self._sightings: OrderedDict[BlockKey, int] = OrderedDict()

    def sight(self, keys: Iterable[BlockKey]) -> None:
        """Count one sighting of each block (once per request)."""
        for key in keys:
            self._sightings[key] = self._sightings.get(key, 0) + 1
            self._sightings.move_to_end(key)
            if len(self._sightings) > MAX_TRACKED_SIGHTINGS:
                self._sightings.popitem(last=False)

    def sightings(self, key: BlockKey) -> int:
        return self._sightings.get(key, 0)

    def admits(self, key: BlockKey) -> bool:
        return self.sightings(key) >= self.threshold

    def within_request_cap(self, blocks_written: int) -> bool:
        return self.max_blocks_per_request is None or blocks_written < self.max_blocks_per_request

    def savable_blocks(self, num_full_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
        """How many of the request's leading full blocks are in scope for saving."""
        if self.store_decode:
            return num_full_blocks
        return min(num_full_blocks, num_prompt_tokens // block_size)
