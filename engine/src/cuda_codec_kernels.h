// The compressed codec's device side for layer streaming on CUDA (internal):
// two fused kernels, compiled at run time by NVRTC (the engine builds without
// a device toolkit), that replace the codec's ATen operations where a step
// stages or writes back compressed homes.
//
//   decode_scatter: compressed rows [n, row_bytes] -> ring blocks ids[0..n)
//   encode_gather:  ring blocks ids[0..n) -> compressed rows [n, row_bytes]
//
// Why: a prefill chunk's attention (cuDNN's flash attention, a persistent
// kernel) holds every SM until it ends, so the copy stream's kernels run
// between two layers' attention and add their time to the step. The codec's
// ATen operations are about fifteen kernels a layer, some 0.6 ms at a 16k
// prefill chunk on an H200; these two take about 0.05 ms (docs/benchmarks/history.md,
// "Compressed homes by fused kernels").
//
// The bytes are the codec's (kv_codec.cpp, the reference's codec.py), bit for
// bit: the same float operations in the same order, IEEE division, round half
// to even, bf16 by the device's own conversion (as torch's CUDA kernels do).
// bf16 KV only; other dtypes keep the ATen operations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace activekv::detail {

struct CompressedRows {
  std::int64_t block_elems = 0;  // KV elements of one block (of one layer)
  std::int64_t head_size = 0;    // elements sharing one scale
  std::int64_t row_bytes = 0;    // block_elems int8, then block_elems / head_size float scales
};

class CudaCodecKernels {
 public:
  // Compiles the kernels for CUDA device `device_index`, or returns null and
  // says why in `why_not` (no NVRTC library, a compile or load error).
  static std::unique_ptr<CudaCodecKernels> load(int device_index, const CompressedRows& rows,
                                                std::string& why_not);
  ~CudaCodecKernels();
  CudaCodecKernels(const CudaCodecKernels&) = delete;
  CudaCodecKernels& operator=(const CudaCodecKernels&) = delete;

  // Device pointers; `ids` are int64 block ids; `stream` a cudaStream_t.
  // Throws std::runtime_error naming the driver's error.
  void decode_scatter(const void* rows, std::int64_t n, const std::int64_t* ids, void* ring,
                      void* stream) const;
  void encode_gather(const void* ring, const std::int64_t* ids, std::int64_t n, void* rows,
                     void* stream) const;

 private:
  CudaCodecKernels() = default;
  CompressedRows shape_;
  bool wide_ = false;  // 16-byte loads (rows, heads and blocks all allow them)
  void* decode_ = nullptr;
  void* encode_ = nullptr;
};

}  // namespace activekv::detail
