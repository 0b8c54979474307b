"""What passes between the scheduler and the workers: plain, picklable data."""

from __future__ import annotations

import dataclasses

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclasses.dataclass(frozen=True)
class LoadOp:
    slot: int  # host slot to read
    block_id: int  # device block to fill
    key: bytes  # block key the slot must hold


@dataclasses.dataclass(frozen=True)
class SaveOp:
    slot: int  # host slot to write (pending until the save is reported)
    block_id: int  # device block to read
    key: bytes
    req_id: str


@dataclasses.dataclass(frozen=True)
class AsyncLoad:
    """A request's loads that cross while vLLM keeps the request out of the
    batch (WAITING_FOR_REMOTE_KVS): the workers name it in get_finished's
    receiving set once every one of them landed, failed or not."""

    req_id: str
    loads: list[LoadOp]


@dataclasses.dataclass
class ActiveKVMetadata(KVConnectorMetadata):
    """Scheduler -> workers, one per step."""

    # Loads that land inside this step's forward, before their layers' attention.
    loads: list[LoadOp] = dataclasses.field(default_factory=list)
    # Loads that land outside the forwards, each request's on its own.
    async_loads: list[AsyncLoad] = dataclasses.field(default_factory=list)
    saves: list[SaveOp] = dataclasses.field(default_factory=list)
    # Finished requests whose device blocks stay allocated until the workers
    # report (get_finished) that none of their saves is still running.
    awaiting_free: list[str] = dataclasses.field(default_factory=list)
    # Layer streaming (streaming.py): blocks the step's attention reads and
    # whose home holds their bytes (staged from their homes), and blocks the
    # step writes or loads (copied back to their homes); each list with its
    # blocks' home rows (homes.py), in row order.
    stage_blocks: list[int] = dataclasses.field(default_factory=list)
    stage_rows: list[int] = dataclasses.field(default_factory=list)
    writeback_blocks: list[int] = dataclasses.field(default_factory=list)
    writeback_rows: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ActiveKVWorkerMetadata(KVConnectorWorkerMetadata):
    """Workers -> scheduler, one per step, summed over tensor-parallel ranks."""

    saved: list[int] = dataclasses.field(default_factory=list)  # slots written
    failed_saves: list[int] = dataclasses.field(default_factory=list)
    loaded: list[int] = dataclasses.field(default_factory=list)  # slots read (ok or not)
    failed_loads: list[int] = dataclasses.field(default_factory=list)
    # Saves whose copy has an unknown outcome (the native engine's fences; the
    # reference copies synchronously and never reports one): never reused.
    quarantined: list[int] = dataclasses.field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> ActiveKVWorkerMetadata:
        if not isinstance(other, ActiveKVWorkerMetadata):
            raise TypeError(f"cannot aggregate {type(other).__name__} into ActiveKV metadata")
        return ActiveKVWorkerMetadata(
            saved=self.saved + other.saved,
            failed_saves=self.failed_saves + other.failed_saves,
            loaded=self.loaded + other.loaded,
            failed_loads=self.failed_loads + other.failed_loads,
            quarantined=self.quarantined + other.quarantined,
        )
