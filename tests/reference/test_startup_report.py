"""The streaming start-up report's numbers and line (the engine's test_streaming_geometry.cpp
checks its own against the same figures)."""

from __future__ import annotations

from activekv_reference.config import StreamingConfig
from activekv_reference.streaming import StartupReport, StreamingGeometry

LAYERS = ("l0", "l1", "l2", "l3", "l4")


def report(homes: str, layer_bytes: int) -> StartupReport:
    geometry = StreamingGeometry.plan(StreamingConfig(resident_layers=1, ring_size=2, homes=homes), LAYERS)
    return StartupReport.of(geometry, num_blocks=100, block_size=32, layer_bytes=layer_bytes, max_model_len=1000)


def test_exact_homes_line():
    r = report("exact", 8192)
    assert (r.device_blocks_without, r.host_bytes, r.decode_step_bytes) == (60, 112 * 4 * 8192, 32 * 4 * 8192)
    assert r.line() == (
        "ActiveKV layer streaming: 1 resident + 4 streamed layers, ring of 2; the device "
        "holds 100 blocks (3200 tokens), 60 blocks (1920 tokens) without streaming; host "
        "memory reserved for the streamed layers 3670016 bytes per worker; a full-context "
        "decode step moves 1048576 bytes host->device per worker"
    )


def test_compressed_homes_line_says_so():
    r = report("compressed", 4608)
    assert r.host_bytes == 112 * 4 * 4608
    assert r.line().endswith("; the homes are compressed (int8 + scales, lossy within the codec's bound)")
    assert r.line().startswith("ActiveKV layer streaming: 1 resident + 4 streamed layers")
