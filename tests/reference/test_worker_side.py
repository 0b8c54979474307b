"""The worker side on real CPU tensors shaped like vLLM's CPU KV cache."""

from __future__ import annotations

import pytest
import torch
from activekv_reference.config import ActiveKVConfig
from activekv_reference.layout import KVLayout
from activekv_reference.metadata import ActiveKVMetadata, LoadOp, SaveOp
from activekv_reference.worker import WorkerSide

LAYOUT = KVLayout(
    layer_names=("l0", "l1", "l2"),
    block_size=32,
    num_kv_heads=2,
    head_size=32,
    dtype=torch.bfloat16,
)
NUM_DEVICE_BLOCKS = 12


def kv_caches(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (NUM_DEVICE_BLOCKS, 2, LAYOUT.block_size, LAYOUT.num_kv_heads * LAYOUT.head_size)
    return {n: torch.randn(shape, generator=g).to(torch.bfloat16) for n in LAYOUT.layer_names}


def step(worker: WorkerSide, kv, meta: ActiveKVMetadata) -> None:
    """One model step as vLLM drives it: load, then per layer wait and save."""
    worker.start_load_kv(meta)
    for name in LAYOUT.layer_names:
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, kv[name], meta)
    worker.wait_for_save(meta)


def make_worker(mode="exact", slots=8) -> tuple[WorkerSide, dict[str, torch.Tensor]]:
    worker = WorkerSide(ActiveKVConfig(mode=mode), LAYOUT, slots, tp_rank=0)
    kv = kv_caches(seed=1)
    worker.register_kv_caches(kv)
    return worker, kv


@pytest.mark.parametrize("mode", ["exact", "compressed"])
def test_saved_blocks_load_back_into_other_device_blocks(mode):
    worker, kv = make_worker(mode)
    saves = [SaveOp(slot=s, block_id=b, key=bytes([s]) * 32, req_id="r") for s, b in [(0, 3), (5, 7)]]
    step(worker, kv, ActiveKVMetadata(saves=saves))
    out = worker.take_worker_meta()
    assert out.saved == [0, 5] and out.failed_saves == []
    assert worker.stats.data["bytes_to_host"] == 2 * LAYOUT.slot_bytes(mode)

    loads = [LoadOp(slot=5, block_id=1, key=bytes([5]) * 32), LoadOp(slot=0, block_id=2, key=bytes([0]) * 32)]
    step(worker, kv, ActiveKVMetadata(loads=loads))
    for name in LAYOUT.layer_names:
        if mode == "exact":
            assert torch.equal(kv[name][1].view(torch.int16), kv[name][7].view(torch.int16))
            assert torch.equal(kv[name][2].view(torch.int16), kv[name][3].view(torch.int16))
        else:
            torch.testing.assert_close(kv[name][1], kv[name][7], atol=0.05, rtol=0.01)
    assert worker.take_worker_meta().loaded == [5, 0]
    assert worker.take_load_errors() == set()


def test_load_of_a_slot_holding_another_block_is_refused():
    worker, kv = make_worker()
    step(worker, kv, ActiveKVMetadata(saves=[SaveOp(slot=2, block_id=4, key=b"a" * 32, req_id="r")]))
    worker.take_worker_meta()
    before = kv["l0"][6].clone()
    step(worker, kv, ActiveKVMetadata(loads=[LoadOp(slot=2, block_id=6, key=b"b" * 32)]))
    assert worker.take_load_errors() == {6}
    assert worker.take_worker_meta().failed_loads == [2]
    assert torch.equal(kv["l0"][6], before)  # nothing was written


def test_layers_save_kv_layer_never_saw_are_saved_at_wait_for_save():
    # A full CUDA graph runs no hook: the registered cache holds the forward's
    # KV once it is done, so the store must hold what the hooks would have.
    saves = [SaveOp(slot=1, block_id=0, key=b"a" * 32, req_id="r")]
    hooked, hooked_kv = make_worker()
    step(hooked, hooked_kv, ActiveKVMetadata(saves=saves))
    worker, kv = make_worker()
    meta = ActiveKVMetadata(saves=saves)
    worker.save_kv_layer("l0", kv["l0"], meta)  # l1, l2: no hook
    worker.wait_for_save(meta)
    out = worker.take_worker_meta()
    assert out.saved == [1] and out.failed_saves == []
    assert worker.arena.key(1) == hooked.arena.key(1) is not None
    assert bytes(worker.arena.read(1, 0, worker.arena.slot_bytes).numpy()) == bytes(
        hooked.arena.read(1, 0, hooked.arena.slot_bytes).numpy()
    )


def test_loads_land_before_the_forward_when_no_layer_hook_runs():
    worker, kv = make_worker()
    step(worker, kv, ActiveKVMetadata(saves=[SaveOp(slot=3, block_id=5, key=b"c" * 32, req_id="r")]))
    worker.take_worker_meta()
    worker.start_load_kv(ActiveKVMetadata(loads=[LoadOp(slot=3, block_id=9, key=b"c" * 32)]), layer_hooks=False)
    for name in LAYOUT.layer_names:  # no wait_for_layer_load: already in the cache
        assert torch.equal(kv[name][9].view(torch.int16), kv[name][5].view(torch.int16))
    assert worker.take_worker_meta().loaded == [3]


def test_finished_request_released_once_notice_and_finish_arrived():
    worker, _ = make_worker()
    # The notice comes with the step's metadata, bound on every step; vLLM
    # 0.26.0 calls no wait_for_save on a step without a forward (an idle step).
    worker.check_plan(ActiveKVMetadata(awaiting_free=["r1"]))
    assert worker.get_finished(set()) == (None, None)
    assert worker.get_finished({"r1", "r2"}) == ({"r1"}, None)
    assert worker.get_finished({"r1"}) == (None, None)


def test_registering_caches_that_do_not_match_the_spec_fails():
    worker = WorkerSide(ActiveKVConfig(), LAYOUT, 4, tp_rank=0)
    kv = kv_caches(seed=0)
    del kv["l2"]
    with pytest.raises(ValueError, match="'l2'"):
        worker.register_kv_caches(kv)
    kv = {n: t[:, :, :16] for n, t in kv_caches(seed=0).items()}
    with pytest.raises(ValueError, match="do not match"):
        worker.register_kv_caches(kv)


def test_streamed_layers_find_their_own_bytes_in_the_shared_ring():
    from activekv_reference.config import StreamingConfig
    from activekv_reference.streaming import StreamingGeometry

    layout = KVLayout(
        layer_names=("l0", "l1", "l2", "l3"), block_size=32, num_kv_heads=2, head_size=32, dtype=torch.bfloat16
    )
    geometry = StreamingGeometry.plan(StreamingConfig(resident_layers=1, ring_size=2), layout.layer_names)
    worker = WorkerSide(ActiveKVConfig(), layout, 8, tp_rank=0, streaming=geometry)
    ring0 = torch.zeros(NUM_DEVICE_BLOCKS, 2, 32, 64, dtype=torch.bfloat16)
    kv = {"l0": torch.zeros_like(ring0), "l1": ring0, "l2": torch.zeros_like(ring0), "l3": ring0}
    worker.register_kv_caches(kv)
    written = {n: torch.randn(2, 2, 32, 64).to(torch.bfloat16) for n in kv}
    for step in range(2):
        # Home rows are not block ids (homes.py): blocks 4 and 3 live in the
        # two rows past the last block id, in row order.
        rows = [NUM_DEVICE_BLOCKS, NUM_DEVICE_BLOCKS + 1]
        meta = ActiveKVMetadata(
            stage_blocks=[4, 3],
            stage_rows=rows,
            writeback_blocks=[4, 3] if step == 0 else [],
            writeback_rows=rows if step == 0 else [],
        )
        worker.check_plan(meta)
        worker.start_load_kv(meta)
        for name in layout.layer_names:
            worker.wait_for_layer_load(name)
            if step == 0:
                kv[name][3:5] = written[name]
            elif name != "l0":  # l3 shares l1's buffer, yet reads its own home
                assert torch.equal(kv[name][3:5].view(torch.int16), written[name].view(torch.int16))
            worker.wait_for_layer_load(name)  # the second call (before attention) does nothing
            worker.save_kv_layer(name, kv[name], meta)
        worker.wait_for_save(meta)


def test_streaming_needs_the_rings_to_alias():
    from activekv_reference.config import StreamingConfig
    from activekv_reference.layout import UnsupportedLayoutError
    from activekv_reference.streaming import StreamingGeometry

    geometry = StreamingGeometry.plan(StreamingConfig(resident_layers=0, ring_size=2), LAYOUT.layer_names[:2] + ("l2",))
    worker = WorkerSide(ActiveKVConfig(), LAYOUT, 8, tp_rank=0, streaming=geometry)
    # A KV cache it cannot serve: the same class the native engine raises.
    with pytest.raises(UnsupportedLayoutError, match="'l2' is not a view of ring buffer 0"):
        worker.register_kv_caches(kv_caches(seed=1))
