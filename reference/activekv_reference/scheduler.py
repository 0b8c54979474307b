"""Scheduler side: owns the block index and the admission policy, and decides
each step which blocks the workers load and save.

Loads: a request's leading full prompt blocks past vLLM's own prefix hit that
are visible in the index are loaded (never the block holding the last prompt
token: vLLM must compute at least one token). Their slots are pinned until the
workers report the load done.

Saves: after each step, every full block the step completes (prompt blocks, and
decode blocks if configured) is offered to the policy; an admitted block gets
a PENDING slot and a save op. It turns VISIBLE only when every worker reported
the save sealed (worker metadata), so a lookup never sees a half-written block.

Layer streaming (streaming.py): every step also names the blocks the workers
stage into the ring (what the step's attention reads and their homes hold) and
write back (what the step writes or loads), from every scheduled request's
block table, each with its home row (homes.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from .config import ActiveKVConfig
from .identity import BlockKey, block_keys
from .homes import HomeRows
from .index import BlockIndex
from .metadata import ActiveKVMetadata, ActiveKVWorkerMetadata, AsyncLoad, LoadOp, SaveOp
from .policy import AdmissionPolicy
from .stats import ActiveKVStats, Telemetry
from .streaming import cdiv


@dataclasses.dataclass
class _RequestState:
    request: Any  # vllm.v1.request.Request: its token ids grow as it decodes
    salt: str | None
    keys: list[BlockKey] = dataclasses.field(default_factory=list)
    block_ids: list[int] = dataclasses.field(default_factory=list)
    lookup_start: int = 0  # first block index past vLLM's own prefix hit
    lookup_tokens: int = 0  # what the last lookup could have served
    load_async: bool = False  # the last lookup's hit loads asynchronously
    sighted: bool = False
    save_cursor: int = 0  # blocks below it were already offered for saving
    blocks_written: int = 0
    unconfirmed_saves: int = 0


class SchedulerSide:
    def __init__(
        self,
        config: ActiveKVConfig,
        identity_digest: bytes,
        block_size: int,
        slot_bytes: int,
        num_slots: int,
        tp_size: int,
        num_blocks: int | None = None,
    ):
        self.config = config
        # Layer streaming (homes set), given vLLM's number of KV cache blocks:
        # the block table of every scheduled request, as vLLM grows it, and
        # the blocks' home rows.
        self._block_tables: dict[str, list[int]] = {}
        self.homes = HomeRows(num_blocks) if num_blocks is not None else None
        self.identity_digest = identity_digest
        self.block_size = block_size
        self.slot_bytes = slot_bytes
        self.tp_size = tp_size
        self.index = BlockIndex(num_slots)
        self.policy = AdmissionPolicy(config, slot_bytes)
        self.stats = Telemetry("scheduler")
        # Since start-up, for the hit ratio gauge.
        self._total_lookup_tokens = 0
        self._total_hit_tokens = 0
        self._requests: dict[str, _RequestState] = {}
        self._pending_loads: list[LoadOp] = []
        self._pending_async_loads: list[AsyncLoad] = []
        self._slot_owner: dict[int, str] = {}  # pending save slot -> request id
        self._confirmations: Counter[int] = Counter()  # save reports per slot
        self._load_reports: Counter[int] = Counter()
        self._finished_awaiting: dict[str, _RequestState] = {}
        self._notify_awaiting: list[str] = []

    # -- lookups ----------------------------------------------------------------
    def _state(self, request) -> _RequestState:
        st = self._requests.get(request.request_id)
        if st is None:
            st = _RequestState(request=request, salt=request.cache_salt)
            self._requests[request.request_id] = st
        return st

    def _keys_upto(self, st: _RequestState, num_blocks: int) -> list[BlockKey]:
        if len(st.keys) < num_blocks:
            tokens = st.request.all_token_ids[: num_blocks * self.block_size]
            st.keys = block_keys(self.identity_digest, st.salt, tokens, self.block_size, st.keys)
        return st.keys

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        if num_computed_tokens % self.block_size:
            if request.request_id in self._requests:
                self._requests[request.request_id].lookup_tokens = 0
                self._requests[request.request_id].load_async = False
            return 0, False
        st = self._state(request)
        first = num_computed_tokens // self.block_size
        limit = self._loadable_blocks(request)
        # What the store could serve at most: the full blocks from `first` below it.
        st.lookup_tokens = max(limit - first, 0) * self.block_size
        keys = self._keys_upto(st, limit)
        hits = 0
        for i in range(first, limit):
            if self.index.lookup(keys[i]) is None:
                break
            hits += 1
        st.lookup_start = first
        # At least async_load_min_tokens load while vLLM keeps the request out of the batch.
        async_tokens = self.config.async_load_min_tokens
        st.load_async = async_tokens > 0 and hits > 0 and hits * self.block_size >= async_tokens
        return hits * self.block_size, st.load_async

    def may_load_async(self, request) -> bool:
        """Whether the request's prompt could load asynchronously at all: its
        full blocks below the last token's reach async_load_min_tokens."""
        tokens = self.config.async_load_min_tokens
        return tokens > 0 and self._loadable_blocks(request) * self.block_size >= tokens

    def _loadable_blocks(self, request) -> int:
        """The prompt's blocks the store may serve: those below the one holding
        the last prompt token, which vLLM always computes."""
        return (request.num_prompt_tokens - 1) // self.block_size

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        st = self._state(request)
        self.stats.add("lookups", 1)
        self.stats.add("lookup_tokens", st.lookup_tokens)
        self._total_lookup_tokens += st.lookup_tokens
        st.lookup_tokens = 0
        if num_external_tokens <= 0:
            return
        block_ids = blocks.get_block_ids()[0]
        n = num_external_tokens // self.block_size
        loads = self._pending_loads
        if st.load_async:
            loads = []
            self._pending_async_loads.append(AsyncLoad(req_id=request.request_id, loads=loads))
        for i in range(st.lookup_start, st.lookup_start + n):
            slot = self.index.pin(st.keys[i])
            loads.append(LoadOp(slot=slot, block_id=block_ids[i], key=st.keys[i]))
        self.stats.add("hit_blocks", n)
        self.stats.add("hit_tokens", num_external_tokens)
        self._total_hit_tokens += num_external_tokens

    # -- per-step plan ------------------------------------------------------------
    def build_connector_meta(self, scheduler_output) -> ActiveKVMetadata:
        meta = ActiveKVMetadata(
            loads=self._pending_loads, async_loads=self._pending_async_loads, awaiting_free=self._notify_awaiting
        )
        self._pending_loads, self._pending_async_loads, self._notify_awaiting = [], [], []
        scheduled = scheduler_output.num_scheduled_tokens
        if self.homes is not None:
            self._plan_streaming(scheduler_output, meta)
        for new in scheduler_output.scheduled_new_reqs:
            st = self._requests.get(new.req_id)
            if st is None:  # not seen by get_num_new_matched_tokens: nothing to do
                continue
            st.block_ids = list(new.block_ids[0])
            st.save_cursor = 0
            if not st.sighted:
                prompt_blocks = st.request.num_prompt_tokens // self.block_size
                self.policy.sight(self._keys_upto(st, prompt_blocks))
                st.sighted = True
            self._plan_saves(new.req_id, st, new.num_computed_tokens + scheduled[new.req_id], meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._requests.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            # After preemption: a fresh block list (vLLM 0.34 has no such list:
            # it sends a resumed request again as a new one).
            if req_id in getattr(cached, "resumed_req_ids", ()):
                st.block_ids = list(new_ids[0]) if new_ids is not None else []
                st.save_cursor = 0
            elif new_ids is not None:
                st.block_ids.extend(new_ids[0])
            self._plan_saves(req_id, st, cached.num_computed_tokens[i] + scheduled[req_id], meta)
        return meta

    def _plan_streaming(self, scheduler_output, meta: ActiveKVMetadata) -> None:
        """The step's stage and write-back blocks, with their home rows. A
        request computed c tokens and computes s now: it touches the blocks
        holding tokens below c + s, and it writes the blocks holding tokens
        c .. c+s-1 (written back, with the loaded ones). Its fresh blocks (new
        content: appended to its table, or past its prefix hit) get home rows
        first (homes.py); they and the loaded ones are not staged, since their
        homes hold nothing of theirs. A written block's slots past the new
        tokens then keep the ring's earlier bytes, which no attention reads.
        A block with no row yet (a request never seen from its start) counts
        as fresh."""
        bs = self.block_size
        scheduled = scheduler_output.num_scheduled_tokens
        loaded = {op.block_id for op in meta.loads}
        steps = []

        def start_over(req_id: str, table: list[int], computed: int) -> None:
            self.homes.end_request(req_id)
            self._block_tables[req_id] = table
            hit = cdiv(computed, bs)
            fresh = [b for i, b in enumerate(table) if i >= hit or b in loaded or not self.homes.has_row(b)]
            self.homes.assign(req_id, fresh)
            steps.append((req_id, computed, scheduled[req_id], fresh))

        for new in scheduler_output.scheduled_new_reqs:
            start_over(new.req_id, list(new.block_ids[0]), new.num_computed_tokens)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            computed = cached.num_computed_tokens[i]
            if req_id in getattr(cached, "resumed_req_ids", ()) or req_id not in self._block_tables:
                start_over(req_id, list(new_ids[0]) if new_ids is not None else [], computed)
                continue
            fresh = list(new_ids[0]) if new_ids is not None else []
            self._block_tables[req_id].extend(fresh)
            self.homes.assign(req_id, fresh)
            steps.append((req_id, computed, scheduled[req_id], fresh))
        touched, written, not_staged = set(), set(), set(loaded)
        for req_id, computed, num_scheduled, fresh in steps:
            table = self._block_tables[req_id]
            touched.update(table[: cdiv(computed + num_scheduled, bs)])
            written.update(table[computed // bs : cdiv(computed + num_scheduled, bs)])
            not_staged.update(fresh)
        row = self.homes.row
        meta.stage_blocks = sorted(touched - not_staged, key=row)
        meta.stage_rows = [row(b) for b in meta.stage_blocks]
        meta.writeback_blocks = sorted(written | loaded, key=row)
        meta.writeback_rows = [row(b) for b in meta.writeback_blocks]

    def _plan_saves(self, req_id: str, st: _RequestState, computed: int, meta: ActiveKVMetadata):
        known = min(computed, len(st.request.all_token_ids), len(st.block_ids) * self.block_size)
        full = self.policy.savable_blocks(known // self.block_size, st.request.num_prompt_tokens, self.block_size)
        keys = self._keys_upto(st, full)
        prompt_blocks = st.request.num_prompt_tokens // self.block_size
        for i in range(st.save_cursor, full):
            key = keys[i]
            if i >= prompt_blocks:  # decode blocks are sighted when they fill
                self.policy.sight([key])
            if self.index.contains(key):
                self.index.touch(key)
                continue
            if not self.policy.admits(key):
                self.stats.add("rejected_threshold", 1)
                continue
            if not self.policy.within_request_cap(st.blocks_written):
                self.stats.add("rejected_request_cap", 1)
                continue
            slot, evicted = self.index.reserve(key)
            self.stats.add("evicted_blocks", len(evicted))
            if slot is None:
                self.stats.add("rejected_full", 1)
                continue
            meta.saves.append(SaveOp(slot=slot, block_id=st.block_ids[i], key=key, req_id=req_id))
            self._slot_owner[slot] = req_id
            st.blocks_written += 1
            st.unconfirmed_saves += 1
        st.save_cursor = max(st.save_cursor, full)

    # -- worker reports -----------------------------------------------------------
    def update_connector_output(self, connector_output) -> None:
        wm = connector_output.kv_connector_worker_meta
        if not isinstance(wm, ActiveKVWorkerMetadata):
            return
        for slot in wm.saved:
            self._confirmations[slot] += 1
            if self._confirmations[slot] == self.tp_size:  # every rank sealed it
                del self._confirmations[slot]
                self.index.commit(slot)
                self.stats.add("stored_blocks", 1)
                self._save_settled(slot)
        for slot in wm.failed_saves:
            self._confirmations.pop(slot, None)
            self.index.discard(slot)
            self._save_settled(slot)
        for slot in wm.quarantined:
            self._confirmations.pop(slot, None)
            self.index.retire(slot)
            self.stats.add("quarantined_fences", 1)
            self._save_settled(slot)
        self._load_reports.update(wm.loaded)
        for slot in list(self._load_reports):
            while self._load_reports[slot] >= self.tp_size:  # one load done on every rank
                self._load_reports[slot] -= self.tp_size
                self.index.unpin(slot)
            if self._load_reports[slot] == 0:
                del self._load_reports[slot]
        for slot in wm.failed_loads:  # the slot does not hold its block: drop it
            self.index.discard(slot)

    def _save_settled(self, slot: int) -> None:
        req_id = self._slot_owner.pop(slot, None)
        st = self._requests.get(req_id) or self._finished_awaiting.get(req_id)
        if st is None:
            return
        st.unconfirmed_saves -= 1
        if st.unconfirmed_saves == 0 and req_id in self._finished_awaiting:
            del self._finished_awaiting[req_id]
            self._notify_awaiting.append(req_id)

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        self._block_tables.pop(request.request_id, None)
        if self.homes is not None:
            self.homes.end_request(request.request_id)
        st = self._requests.pop(request.request_id, None)
        if st is None or st.unconfirmed_saves == 0:
            return False, None
        # Keep the device blocks until the saves reading them are done.
        self._finished_awaiting[request.request_id] = st
        return True, None

    def report_streaming(self, report) -> None:
        """The streaming geometry, reported once in the stats as gauges (its
        byte figures per worker times tp_size, as the store's)."""
        self.stats.set("streaming_streamed_layers", report.streamed_layers)
        self.stats.set("streaming_device_blocks", report.device_blocks)
        self.stats.set("streaming_device_blocks_without", report.device_blocks_without)
        self.stats.set("streaming_host_bytes", report.host_bytes * self.tp_size)
        self.stats.set("streaming_decode_step_bytes", report.decode_step_bytes * self.tp_size)

    def has_pending_work(self) -> bool:
        return bool(self._finished_awaiting or self._notify_awaiting)

    def take_stats(self) -> ActiveKVStats | None:
        """The counters since the last take, and the gauges that changed: the
        host store's occupancy (of every worker: its slots times slot_bytes
        times tp_size) and its hit ratio, read from the index now, and the
        streaming geometry once."""
        visible, free = self.index.occupancy()
        slot = self.slot_bytes * self.tp_size
        self.stats.set("store_blocks", visible)
        self.stats.set("store_used_bytes", (self.index.num_slots - free) * slot)
        self.stats.set("store_free_bytes", free * slot)
        self.stats.set("store_capacity_bytes", self.index.num_slots * slot)
        if self._total_lookup_tokens > 0:
            self.stats.set("store_hit_ratio", self._total_hit_tokens / self._total_lookup_tokens)
        return self.stats.take()
