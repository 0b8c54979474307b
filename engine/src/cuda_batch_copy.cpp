// The CUDA driver's batched copy, found at run time (cuda_batch_copy.h).
#include "cuda_batch_copy.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace activekv::detail {
namespace {

// From cuda.h (CUDA 12.8): CUresult is an int, CUstream an opaque pointer.
using CUresult = int;
constexpr CUresult kCudaSuccess = 0;
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

using GetProcAddress = CUresult (*)(const char* symbol, void** fn, int cuda_version, std::uint64_t flags,
                                    int* symbol_status);
using MemcpyBatchAsync = CUresult (*)(std::uint64_t* dsts, std::uint64_t* srcs, std::size_t* sizes,
                                      std::size_t count, MemcpyAttributes* attrs, std::size_t* attr_indices,
                                      std::size_t num_attrs, std::size_t* fail_index, void* stream);
using GetErrorString = CUresult (*)(CUresult error, const char** text);

struct Driver {
  MemcpyBatchAsync batch_copy = nullptr;
  GetErrorString error_string = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    // torch has loaded the driver by the time a CUDA tensor exists; never unloaded.
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return out;
    auto get = reinterpret_cast<GetProcAddress>(::dlsym(lib, "cuGetProcAddress_v2"));
    if (get == nullptr) return out;
    void* fn = nullptr;
    int status = 0;
    if (get("cuMemcpyBatchAsync", &fn, kBatchCopyVersion, 0, &status) == kCudaSuccess && fn != nullptr) {
      out.batch_copy = reinterpret_cast<MemcpyBatchAsync>(fn);
    }
    out.error_string = reinterpret_cast<GetErrorString>(::dlsym(lib, "cuGetErrorString"));
    return out;
  }();
  return d;
}

}  // namespace

bool cuda_batch_copy_available() { return driver().batch_copy != nullptr; }

void cuda_batch_copy(CopyBatch& batch, void* stream, bool to_device) {
  if (batch.sizes.empty()) return;
  const Driver& d = driver();
  if (d.batch_copy == nullptr) throw std::runtime_error("cuMemcpyBatchAsync is not in this CUDA driver");
  // The location hints matter only for managed memory; they say what the
  // addresses are.
  const MemLocation host{kLocationHost, 0};
  const MemLocation device{kLocationDevice, 0};
  MemcpyAttributes attrs{kSrcAccessOrderStream, to_device ? host : device, to_device ? device : host, 0};
  std::size_t first_attr = 0;
  std::size_t failed = 0;
  const CUresult rc = d.batch_copy(batch.dsts.data(), batch.srcs.data(), batch.sizes.data(), batch.sizes.size(),
                                   &attrs, &first_attr, 1, &failed, stream);
  if (rc == kCudaSuccess) return;
  const char* text = nullptr;
  if (d.error_string != nullptr) d.error_string(rc, &text);
  throw std::runtime_error("cuMemcpyBatchAsync of " + std::to_string(batch.sizes.size()) + " copies failed at copy " +
                           std::to_string(failed) + ": CUresult " + std::to_string(rc) +
                           (text != nullptr ? std::string(" (") + text + ")" : std::string()));
}

}  // namespace activekv::detail
