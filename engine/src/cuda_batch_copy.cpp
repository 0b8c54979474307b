// The CUDA driver's batched copy, found at run time (cuda_batch_copy.h).
#include "cuda_batch_copy.h"

#include "cuda_driver.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace activekv::detail {
namespace {

// From cuda.h (CUDA 12.8).
constexpr int kSrcAccessOrderStream = 1;  // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
constexpr int kLocationDevice = 1;        // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kLocationHost = 2;          // CU_MEM_LOCATION_TYPE_HOST
// The version whose signature is declared below: 12.8's, with failIdx (13.0
// dropped it, and its driver still answers for 12.8).
constexpr int kBatchCopyVersion = 12080;

struct MemLocation {  // CUmemLocation
  int type;
  int id;
};
struct MemcpyAttributes {  // CUmemcpyAttributes
  int src_access_order;
  MemLocation src_location_hint;
  MemLocation dst_location_hint;
  unsigned int flags;
};

using MemcpyBatchAsync = CUresult (*)(std::uint64_t* dsts, std::uint64_t* srcs, std::size_t* sizes,
                                      std::size_t count, MemcpyAttributes* attrs, std::size_t* attr_indices,
                                      std::size_t num_attrs, std::size_t* fail_index, void* stream);

MemcpyBatchAsync batch_copy_fn() {
  static const auto fn =
      reinterpret_cast<MemcpyBatchAsync>(cuda_driver_symbol("cuMemcpyBatchAsync", kBatchCopyVersion));
  return fn;
}

}  // namespace

bool cuda_batch_copy_available() { return batch_copy_fn() != nullptr; }

void cuda_batch_copy(CopyBatch& batch, void* stream, bool to_device, std::size_t first_call) {
  if (batch.sizes.empty()) return;
  const MemcpyBatchAsync copy = batch_copy_fn();
  if (copy == nullptr) throw std::runtime_error("cuMemcpyBatchAsync is not in this CUDA driver");
  // The location hints matter only for managed memory; they say what the
  // addresses are.
  const MemLocation host{kLocationHost, 0};
  const MemLocation device{kLocationDevice, 0};
  MemcpyAttributes attrs{kSrcAccessOrderStream, to_device ? host : device, to_device ? device : host, 0};
  const std::size_t n = batch.sizes.size();
  std::size_t call = first_call == 0 ? n : first_call;
  for (std::size_t first = 0; first < n; first += call, call *= 2) {
    const std::size_t count = std::min(call, n - first);
    std::size_t first_attr = 0;
    std::size_t failed = 0;
    const CUresult rc = copy(batch.dsts.data() + first, batch.srcs.data() + first, batch.sizes.data() + first,
                             count, &attrs, &first_attr, 1, &failed, stream);
    if (rc != kCudaSuccess) {
      throw std::runtime_error("cuMemcpyBatchAsync of " + std::to_string(count) + " copies failed at copy " +
                               std::to_string(first + failed) + " of " + std::to_string(n) + ": " +
                               cuda_error_text(rc));
    }
  }
}

}  // namespace activekv::detail
