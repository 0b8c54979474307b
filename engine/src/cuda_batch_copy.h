// The CUDA driver's batched copy (internal): thousands of copies in one call,
// run by the copy engines, so a layer's scattered blocks cross the bus with no
// SM work. The engine builds without a device toolkit, so the driver's entry
// point is found at run time (libcuda.so.1, cuMemcpyBatchAsync, CUDA 12.8 and
// later) and its few types are declared here as cuda.h gives them.
//
// Measured on an H200 (docs/benchmarks/history.md, 2026-12-04; bench/
// batch_copy_probe.py): 64 KiB copies from pinned rows to scattered device
// blocks cross at 0.999 of one large copy's peak, both ways, and beside a
// compute-bound attention take no longer than alone (an SM scatter: 1.11x);
// 16 KiB copies reach only 0.25 of the peak. The host pays about 0.5 us a
// copy in the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace activekv::detail {

// Copies smaller than this cross the bus slower by batch than by a gather
// kernel (16 KiB: a quarter of the peak; 33 KiB: the peak).
inline constexpr std::int64_t kMinBatchCopyBytes = std::int64_t{32} << 10;

// One batch's copies, as the driver takes them: device addresses (pinned host
// memory's own under unified addressing) and byte counts.
struct CopyBatch {
  std::vector<std::uint64_t> dsts;
  std::vector<std::uint64_t> srcs;
  std::vector<std::size_t> sizes;
  void clear() {
    dsts.clear();
    srcs.clear();
    sizes.clear();
  }
  void add(std::uint64_t dst, std::uint64_t src, std::size_t bytes) {
    dsts.push_back(dst);
    srcs.push_back(src);
    sizes.push_back(bytes);
  }
};

// Whether this process's CUDA driver has the batched copy (looked up once).
bool cuda_batch_copy_available();

// Issues the batch on `stream` (a cudaStream_t), in its order: each copy reads
// its source after the stream's earlier work. The caller's thread must have
// the device's context current (a c10 device or stream guard sets it).
// Throws std::runtime_error naming the driver's error and the copy.
// `first_call` > 0 hands the driver the copies in calls of first_call,
// 2 first_call, 4 first_call, ... copies: the copy engines start once the
// first call is issued, not the whole batch (at about 0.5 us a copy, 4 ms for
// a 128k context's layer), and each call is issued while the last one's
// copies cross (64 KiB takes 1.2 us on the bus). 0: one call.
void cuda_batch_copy(CopyBatch& batch, void* stream, bool to_device, std::size_t first_call);

}  // namespace activekv::detail
