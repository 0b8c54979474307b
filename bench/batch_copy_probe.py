"""Can the copy engine alone scatter a step's blocks between pinned homes and the ring?

A probe for layer streaming on a CUDA machine (no vLLM, no engine): the driver's
batched copy (cuMemcpyBatchAsync, CUDA 12.8 and later) takes thousands of
block-sized copies in one call and runs them on the copy engines, so no SM
work would be left in a step's staging. It answers, each figure beside the
pinned peak of one large copy:

- how fast batches of N-byte copies cross, home rows in order and ring blocks
  in a random order, both ways (64 KiB is a Llama-3-8B block of one layer,
  33 KiB its compressed rows);
- what the batch costs the host (the call itself);
- whether the copies and a compute-bound attention (a prefill chunk's) run
  side by side: each alone, then both at once;
- whether a write-back (device to host: a prefill chunk's 8 MiB a layer)
  slows the staging beside it (host to device: 56-504 MiB a layer, a 16k to
  128k context), 32 layers: each alone, then both at once.

    python -m bench.batch_copy_probe [--mib 512] [--duplex-only]

Prints one line per figure and a final "RESULT {json}" line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import torch

CUDA_SUCCESS = 0
# CUmemcpySrcAccessOrder, CUmemLocationType, CUmemcpyFlags (cuda.h, 12.8).
ORDER_STREAM, ORDER_ANY = 1, 3
LOC_DEVICE, LOC_HOST = 1, 2
FLAG_PREFER_OVERLAP = 1


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", MemLocation),
        ("dstLocHint", MemLocation),
        ("flags", ctypes.c_uint),
    ]


def batch_copy_fn():
    """cuMemcpyBatchAsync in its CUDA 12.8 form (with failIdx), from the driver."""
    driver = ctypes.CDLL("libcuda.so.1")
    get = driver.cuGetProcAddress_v2
    get.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int),
    ]
    fn = ctypes.c_void_p()
    status = ctypes.c_int()
    rc = get(b"cuMemcpyBatchAsync", ctypes.byref(fn), 12080, 0, ctypes.byref(status))
    if rc != CUDA_SUCCESS or not fn.value:
        raise SystemExit(f"cuMemcpyBatchAsync not in this driver (cuGetProcAddress {rc}, status {status.value})")
    proto = ctypes.CFUNCTYPE(
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        ctypes.POINTER(MemcpyAttributes),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p,
    )
    return proto(fn.value)


class Batch:
    """One batch of copies, its descriptor arrays made once (as a step would)."""

    def __init__(self, fn, dsts, srcs, size, order, flags, to_device):
        n = len(dsts)
        self.fn, self.n = fn, n
        self.dsts = (ctypes.c_uint64 * n)(*dsts)
        self.srcs = (ctypes.c_uint64 * n)(*srcs)
        self.sizes = (ctypes.c_size_t * n)(*([size] * n))
        host, dev = MemLocation(LOC_HOST, 0), MemLocation(LOC_DEVICE, 0)
        self.attrs = MemcpyAttributes(order, host if to_device else dev, dev if to_device else host, flags)
        self.idx = (ctypes.c_size_t * 1)(0)
        self.fail = ctypes.c_size_t(0)

    def issue(self, stream):
        rc = self.fn(
            self.dsts,
            self.srcs,
            self.sizes,
            self.n,
            ctypes.byref(self.attrs),
            self.idx,
            1,
            ctypes.byref(self.fail),
            ctypes.c_void_p(stream.cuda_stream),
        )
        if rc != CUDA_SUCCESS:
            raise SystemExit(f"cuMemcpyBatchAsync: CUresult {rc} at copy {self.fail.value}")


def timed(stream, work, iters):
    """Mean ms of `work` on `stream` over iters, after one warm-up."""
    with torch.cuda.stream(stream):
        work()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            work()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="bytes a batch moves")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--duplex-only", action="store_true", help="only the two directions at once")
    args = parser.parse_args()
    torch.cuda.init()
    if args.duplex_only:
        result: dict = {"gpu": torch.cuda.get_device_name()}
        duplex(result)
        print("RESULT " + json.dumps(result))
        return
    total = args.mib << 20
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 255)
    ring = torch.empty(total, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    result = {"gpu": torch.cuda.get_device_name(), "mib": args.mib}
    gen = torch.Generator().manual_seed(0)
    peaks(host, ring, stream, args.iters, result)
    fn = batch_copy_fn()
    batches(fn, host, ring, stream, args.iters, gen, result)
    beside_attention(fn, host, ring, stream, gen, result)
    duplex(result)
    print("RESULT " + json.dumps(result))


def peaks(host, ring, stream, iters: int, result: dict) -> None:
    """One copy of the whole buffer each way: the bus's peak."""
    total, mib = host.numel(), host.numel() >> 20
    peak_ms = timed(stream, lambda: ring.copy_(host, non_blocking=True), iters)
    result["peak_gbps"] = total / peak_ms / 1e6
    print(f"one {mib} MiB copy, host to device: {result['peak_gbps']:.1f} GB/s")
    down_ms = timed(stream, lambda: host.copy_(ring, non_blocking=True), iters)
    result["peak_d2h_gbps"] = total / down_ms / 1e6
    print(f"one {mib} MiB copy, device to host: {result['peak_d2h_gbps']:.1f} GB/s")


def batches(fn, host, ring, stream, iters: int, gen, result: dict) -> None:
    """The buffer as one batch of scattered copies, per copy size, direction
    and ordering flag: the bus's rate against its peak, and the call's time."""
    total = host.numel()
    result["batches"] = []
    for size in (16 << 10, 33 << 10, 64 << 10, 256 << 10, 1 << 20):
        n = total // size
        perm = torch.randperm(n, generator=gen).tolist()
        rows = [host.data_ptr() + i * size for i in range(n)]
        blocks = [ring.data_ptr() + p * size for p in perm]
        for to_device in (True, False):
            for order, flags, name in (
                (ORDER_STREAM, 0, "stream"),
                (ORDER_ANY, 0, "any"),
                (ORDER_STREAM, FLAG_PREFER_OVERLAP, "stream+overlap"),
            ):
                if not to_device and order == ORDER_ANY:
                    continue
                b = (
                    Batch(fn, blocks, rows, size, order, flags, True)
                    if to_device
                    else Batch(fn, rows, blocks, size, order, flags, False)
                )
                ms = timed(stream, lambda b=b: b.issue(stream), iters)
                t = time.perf_counter()
                for _ in range(iters):
                    b.issue(stream)
                call_us = (time.perf_counter() - t) / iters * 1e6
                stream.synchronize()
                gbps = total / ms / 1e6
                row = {
                    "bytes": size,
                    "copies": n,
                    "to_device": to_device,
                    "order": name,
                    "gbps": gbps,
                    "x_peak": gbps / result["peak_gbps" if to_device else "peak_d2h_gbps"],
                    "call_us": call_us,
                }
                result["batches"].append(row)
                print(
                    f"{n:6d} copies of {size >> 10:5d} KiB {'h->d' if to_device else 'd->h'} {name:15s}"
                    f" {gbps:6.1f} GB/s ({row['x_peak']:.3f} of peak), the call {call_us:8.0f} us"
                )


def beside_attention(fn, host, ring, stream, gen, result: dict) -> None:
    """Copies beside a compute-bound attention: 2048 queries x 32 heads over
    16k keys (a prefill chunk), by the batched copy and by the engine's gather
    method (the copy engine reads the rows into a piece, an SM kernel scatters
    the piece into the ring)."""
    q = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 32, 16384, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    compute = torch.cuda.Stream()
    attn_reps = 8

    def attention():
        for _ in range(attn_reps):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)

    size = 64 << 10
    n = host.numel() // size
    perm = torch.randperm(n, generator=gen).tolist()
    dsts = [ring.data_ptr() + p * size for p in perm]
    srcs = [host.data_ptr() + i * size for i in range(n)]
    batch = Batch(fn, dsts, srcs, size, ORDER_STREAM, 0, True)
    overlap = Batch(fn, dsts, srcs, size, ORDER_STREAM, FLAG_PREFER_OVERLAP, True)
    piece = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    ring_blocks = ring.view(n, size)
    ids = torch.tensor(perm, device="cuda")
    rows_per_piece = piece.numel() // size

    def piece_and_scatter():
        for first in range(0, n, rows_per_piece):
            piece.copy_(host[first * size : (first + rows_per_piece) * size], non_blocking=True)
            ring_blocks.index_copy_(0, ids[first : first + rows_per_piece], piece.view(rows_per_piece, size))

    attn_ms = timed(compute, attention, 2)
    variants = (
        ("batched copy", lambda: batch.issue(stream)),
        ("batched copy, prefer overlap", lambda: overlap.issue(stream)),
        ("piece + SM scatter", piece_and_scatter),
    )
    for name, work in variants:
        copy_ms = timed(stream, work, 2)
        both_ms = both_at_once(compute, stream, attention, work)
        row = {
            "copies": name,
            "attention_ms": attn_ms,
            "copy_ms": copy_ms,
            "both_ms": both_ms,
            "x_longer": both_ms / max(attn_ms, copy_ms),
        }
        result.setdefault("beside_attention", []).append(row)
        print(
            f"beside attention, {name}: attention {attn_ms:.1f} ms, copies {copy_ms:.1f} ms, "
            f"both {both_ms:.1f} ms ({row['x_longer']:.3f}x the longer)"
        )


def both_at_once(compute, stream, attention, work) -> float:
    """Milliseconds from the two streams' common start to both ends."""
    torch.cuda.synchronize()
    # Both streams wait behind a sleeping kernel while the host issues their
    # work (a batch call takes milliseconds), so both start at its end.
    with torch.cuda.stream(compute):
        torch.cuda._sleep(100_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(compute)
    stream.wait_event(start)
    with torch.cuda.stream(compute):
        attention()
    with torch.cuda.stream(stream):
        work()
    compute.wait_stream(stream)
    end.record(compute)
    end.synchronize()
    return start.elapsed_time(end)


def duplex(result: dict) -> None:
    """Staging and write-backs crossing the bus's two directions at once."""
    up, down = torch.cuda.Stream(), torch.cuda.Stream()
    d_out = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    h_out = torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True)
    for stage_mib in (56, 248, 504):
        h_in = torch.empty(stage_mib << 20, dtype=torch.uint8, pin_memory=True)
        d_in = torch.empty(stage_mib << 20, dtype=torch.uint8, device="cuda")

        def best_ms(h2d: bool, d2h: bool, h_in=h_in, d_in=d_in) -> float:
            out = []
            for _ in range(7):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(32):
                    if h2d:
                        with torch.cuda.stream(up):
                            d_in.copy_(h_in, non_blocking=True)
                    if d2h:
                        with torch.cuda.stream(down):
                            h_out.copy_(d_out, non_blocking=True)
                torch.cuda.synchronize()
                out.append(1000 * (time.perf_counter() - t))
            return min(out)

        alone, back, both = best_ms(True, False), best_ms(False, True), best_ms(True, True)
        row = {
            "stage_mib": stage_mib,
            "writeback_mib": 8,
            "h2d_ms": alone,
            "d2h_ms": back,
            "both_ms": both,
            "x_h2d_alone": both / alone,
        }
        result.setdefault("duplex", []).append(row)
        print(
            f"stage {stage_mib} MiB + write-back 8 MiB a layer, x32: host to device alone {alone:.2f} ms, "
            f"device to host alone {back:.2f} ms, both {both:.2f} ms ({row['x_h2d_alone']:.4f}x the first)"
        )
        del h_in, d_in


if __name__ == "__main__":
    main()
