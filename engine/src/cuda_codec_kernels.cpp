// The compressed codec's fused device kernels (cuda_codec_kernels.h).
#include "cuda_codec_kernels.h"

#include "cuda_driver.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace activekv::detail {
namespace {

// Compiled by NVRTC: no headers, only its built-in device functions.
constexpr const char* kSource = R"cuda(
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// float -> bf16, round half to even: the conversion torch's CUDA kernels use.
__device__ __forceinline__ u16 to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  const u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

__device__ __forceinline__ float from_bf16(u16 h) { return __uint_as_float(((u32)h) << 16); }

// torch's max for amax: a NaN wins.
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

struct alignas(16) Sixteen { u32 w[4]; };

// Row r of `rows` (int8 of the block, then a float scale per head) into ring
// block ids[r]: q * scale in float, one rounding to bf16.
extern "C" __global__ void activekv_decode_scatter(const unsigned char* __restrict__ rows, i64 n,
                                                   const i64* __restrict__ ids, u16* __restrict__ ring,
                                                   i64 block_elems, i64 head, i64 row_bytes, int wide) {
  for (i64 r = blockIdx.y; r < n; r += gridDim.y) {
    const unsigned char* src = rows + r * row_bytes;
    const float* scale = (const float*)(src + block_elems);
    u16* dst = ring + ids[r] * block_elems;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    if (wide) {  // 16 elements a thread: one 16-byte load, two 16-byte stores
      for (i64 e = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 16; e < block_elems; e += stride * 16) {
        const Sixteen q = *(const Sixteen*)(src + e);
        const signed char* qs = (const signed char*)&q;
        const float s = scale[e / head];
        Sixteen out[2];
        for (int k = 0; k < 8; ++k) {
          out[k / 4].w[k % 4] = (u32)to_bf16((float)qs[2 * k] * s) | ((u32)to_bf16((float)qs[2 * k + 1] * s) << 16);
        }
        ((Sixteen*)(dst + e))[0] = out[0];
        ((Sixteen*)(dst + e))[1] = out[1];
      }
    } else {
      const signed char* qs = (const signed char*)src;
      for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < block_elems; e += stride) {
        dst[e] = to_bf16((float)qs[e] * scale[e / head]);
      }
    }
  }
}

// Ring block ids[i] into row i: a warp per head row. amax = max |x|;
// scale = amax / 127 (1 where amax is not > 0); q = round half even of
// x / scale, clamped to +-127, as int8.
extern "C" __global__ void activekv_encode_gather(const u16* __restrict__ ring, const i64* __restrict__ ids, i64 n,
                                                  unsigned char* __restrict__ rows, i64 block_elems, i64 head,
                                                  i64 row_bytes) {
  const i64 heads = block_elems / head;
  const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n * heads) return;  // whole warps: blockDim is a multiple of 32
  const i64 i = warp / heads, h = warp % heads;
  const u16* x = ring + ids[i] * block_elems + h * head;
  float m = 0.0f;
  for (i64 k = lane; k < head; k += 32) m = nan_max(m, fabsf(from_bf16(x[k])));
  for (int off = 16; off > 0; off >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float s = m > 0.0f ? m / 127.0f : 1.0f;
  signed char* q = (signed char*)(rows + i * row_bytes) + h * head;
  for (i64 k = lane; k < head; k += 32) {
    float y = rintf(from_bf16(x[k]) / s);
    if (y == y) y = fminf(fmaxf(y, -127.0f), 127.0f);
    q[k] = (signed char)y;
  }
  if (lane == 0) ((float*)(rows + i * row_bytes + block_elems))[h] = s;
}
)cuda";

// From nvrtc.h and cuda.h.
using NvrtcResult = int;
using NvrtcProgram = void*;
constexpr int kComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kComputeCapabilityMinor = 76;
constexpr int kDriverVersion = 12000;

struct Nvrtc {
  NvrtcResult (*create)(NvrtcProgram*, const char*, const char*, int, const char* const*,
                        const char* const*) = nullptr;
  NvrtcResult (*compile)(NvrtcProgram, int, const char* const*) = nullptr;
  NvrtcResult (*log_size)(NvrtcProgram, std::size_t*) = nullptr;
  NvrtcResult (*log)(NvrtcProgram, char*) = nullptr;
  NvrtcResult (*cubin_size)(NvrtcProgram, std::size_t*) = nullptr;
  NvrtcResult (*cubin)(NvrtcProgram, char*) = nullptr;
  NvrtcResult (*destroy)(NvrtcProgram*) = nullptr;
  bool ok() const { return create && compile && log_size && log && cubin_size && cubin && destroy; }
};

struct Driver {
  CUresult (*device_get)(int*, int) = nullptr;
  CUresult (*attribute)(int*, int, int) = nullptr;
  CUresult (*load)(void**, const void*) = nullptr;
  CUresult (*function)(void**, void*, const char*) = nullptr;
  CUresult (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                     void**, void**) = nullptr;
  CUresult (*current_context)(void**) = nullptr;
  CUresult (*retain_primary)(void**, int) = nullptr;
  CUresult (*set_current)(void*) = nullptr;
  bool ok() const {
    return device_get && attribute && load && function && launch && current_context && retain_primary &&
           set_current;
  }
};

template <typename F>
void find(F& fn, void* symbol) {
  fn = reinterpret_cast<F>(symbol);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    find(out.device_get, cuda_driver_symbol("cuDeviceGet", kDriverVersion));
    find(out.attribute, cuda_driver_symbol("cuDeviceGetAttribute", kDriverVersion));
    find(out.load, cuda_driver_symbol("cuModuleLoadData", kDriverVersion));
    find(out.function, cuda_driver_symbol("cuModuleGetFunction", kDriverVersion));
    find(out.launch, cuda_driver_symbol("cuLaunchKernel", kDriverVersion));
    find(out.current_context, cuda_driver_symbol("cuCtxGetCurrent", kDriverVersion));
    find(out.retain_primary, cuda_driver_symbol("cuDevicePrimaryCtxRetain", kDriverVersion));
    find(out.set_current, cuda_driver_symbol("cuCtxSetCurrent", kDriverVersion));
    return out;
  }();
  return d;
}

struct Module {
  void* module = nullptr;
  void* decode = nullptr;
  void* encode = nullptr;
  std::string error;  // why there is none
};

// Compiled once per device and process, kept to its end (a module's
// functions must outlive every launch; the driver frees it with the context).
Module compile_for(int device_index) {
  const Driver& d = driver();
  if (!d.ok()) return {.error = "this process has no CUDA driver with the module API"};
  Nvrtc nv;
  find(nv.create, nvrtc_symbol("nvrtcCreateProgram"));
  find(nv.compile, nvrtc_symbol("nvrtcCompileProgram"));
  find(nv.log_size, nvrtc_symbol("nvrtcGetProgramLogSize"));
  find(nv.log, nvrtc_symbol("nvrtcGetProgramLog"));
  find(nv.cubin_size, nvrtc_symbol("nvrtcGetCUBINSize"));
  find(nv.cubin, nvrtc_symbol("nvrtcGetCUBIN"));
  find(nv.destroy, nvrtc_symbol("nvrtcDestroyProgram"));
  if (!nv.ok())
    return {.error =
                "no NVRTC library (libnvrtc.so.13 or .12) beside the CUDA runtime or on the loader's path"};
  int device = 0, major = 0, minor = 0;
  if (d.device_get(&device, device_index) != kCudaSuccess ||
      d.attribute(&major, kComputeCapabilityMajor, device) != kCudaSuccess ||
      d.attribute(&minor, kComputeCapabilityMinor, device) != kCudaSuccess) {
    return {.error =
                "the driver did not give device " + std::to_string(device_index) + "'s compute capability"};
  }
  // The module loads into the thread's current context, which must be the
  // device's primary one (torch's): made current here where torch has not
  // yet touched the device on this thread. Retained once per device, for the
  // process's life (a failed compile is tried again: module_for).
  static std::map<int, void*> primaries;  // under module_for's lock
  void* primary = nullptr;
  void* current = nullptr;
  CUresult rc = kCudaSuccess;
  if (const auto it = primaries.find(device); it != primaries.end()) {
    primary = it->second;
  } else if ((rc = d.retain_primary(&primary, device)) == kCudaSuccess) {
    primaries.emplace(device, primary);
  }
  if (rc == kCudaSuccess) rc = d.current_context(&current);
  if (rc == kCudaSuccess && current != primary) rc = d.set_current(primary);
  if (rc != kCudaSuccess) {
    return {.error =
                "no CUDA context for device " + std::to_string(device_index) + ": " + cuda_error_text(rc)};
  }
  NvrtcProgram program = nullptr;
  if (nv.create(&program, kSource, "activekv_codec.cu", 0, nullptr, nullptr) != 0) {
    return {.error = "nvrtcCreateProgram failed"};
  }
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor);
  // IEEE division and no flush to zero are NVRTC's defaults; said anyway, the
  // bytes depend on them.
  const char* options[] = {arch.c_str(), "--std=c++17", "--prec-div=true", "--ftz=false"};
  Module out;
  if (nv.compile(program, 4, options) != 0) {
    std::size_t size = 0;
    nv.log_size(program, &size);
    std::string log(size, '\0');
    nv.log(program, log.data());
    out.error =
        "NVRTC could not compile the codec kernels for " + arch.substr(arch.find('=') + 1) + ": " + log;
  } else {
    std::size_t size = 0;
    nv.cubin_size(program, &size);
    std::vector<char> cubin(size);
    nv.cubin(program, cubin.data());
    rc = d.load(&out.module, cubin.data());
    if (rc == kCudaSuccess) rc = d.function(&out.decode, out.module, "activekv_decode_scatter");
    if (rc == kCudaSuccess) rc = d.function(&out.encode, out.module, "activekv_encode_gather");
    if (rc != kCudaSuccess)
      out = Module{.error = "the driver could not load the codec kernels: " + cuda_error_text(rc)};
  }
  nv.destroy(&program);
  return out;
}

// A compiled module per device, kept; a failure is tried again next time.
Module module_for(int device_index) {
  static std::mutex mutex;
  static std::map<int, Module> modules;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = modules.find(device_index); it != modules.end()) return it->second;
  Module m = compile_for(device_index);
  if (m.module != nullptr) modules.emplace(device_index, m);
  return m;
}

void launch(void* fn, unsigned grid_x, unsigned grid_y, unsigned block, void* stream, void** args,
            const char* what) {
  const CUresult rc = driver().launch(fn, grid_x, grid_y, 1, block, 1, 1, 0, stream, args, nullptr);
  if (rc != kCudaSuccess)
    throw std::runtime_error(std::string(what) + " launch failed: " + cuda_error_text(rc));
}

constexpr unsigned kThreads = 256;

}  // namespace

std::unique_ptr<CudaCodecKernels> CudaCodecKernels::load(int device_index, const CompressedRows& rows,
                                                         std::string& why_not) {
  // The scales follow the int8 and are read as floats in place: 4-aligned.
  if (rows.head_size <= 0 || rows.block_elems % rows.head_size != 0 || rows.block_elems % 4 != 0 ||
      rows.row_bytes != rows.block_elems + rows.block_elems / rows.head_size * 4) {
    why_not = "the compressed rows' shape is not the codec's, or their scales are not 4-aligned";
    return nullptr;
  }
  const Module m = module_for(device_index);
  if (m.module == nullptr) {
    why_not = m.error;
    return nullptr;
  }
  std::unique_ptr<CudaCodecKernels> out(new CudaCodecKernels());
  out->shape_ = rows;
  out->wide_ = rows.row_bytes % 16 == 0 && rows.block_elems % 16 == 0 && rows.head_size % 16 == 0;
  out->decode_ = m.decode;
  out->encode_ = m.encode;
  return out;
}

CudaCodecKernels::~CudaCodecKernels() = default;

void CudaCodecKernels::decode_scatter(const void* rows, std::int64_t n, const std::int64_t* ids, void* ring,
                                      void* stream) const {
  if (n <= 0) return;
  const bool aligned =
      reinterpret_cast<std::uintptr_t>(rows) % 16 == 0 && reinterpret_cast<std::uintptr_t>(ring) % 16 == 0;
  int wide = wide_ && aligned ? 1 : 0;
  const std::int64_t per_thread = wide != 0 ? 16 : 1;
  const auto threads = (shape_.block_elems + per_thread - 1) / per_thread;
  const auto grid_x =
      static_cast<unsigned>(std::clamp<std::int64_t>((threads + kThreads - 1) / kThreads, 1, 1024));
  const auto grid_y = static_cast<unsigned>(std::min<std::int64_t>(n, 65535));
  std::int64_t block_elems = shape_.block_elems, head = shape_.head_size, row_bytes = shape_.row_bytes;
  void* args[] = {&rows, &n, &ids, &ring, &block_elems, &head, &row_bytes, &wide};
  launch(decode_, grid_x, grid_y, kThreads, stream, args, "activekv_decode_scatter");
}

void CudaCodecKernels::encode_gather(const void* ring, const std::int64_t* ids, std::int64_t n, void* rows,
                                     void* stream) const {
  if (n <= 0) return;
  std::int64_t block_elems = shape_.block_elems, head = shape_.head_size, row_bytes = shape_.row_bytes;
  const std::int64_t threads = n * (block_elems / head) * 32;
  const auto grid_x = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  void* args[] = {&ring, &ids, &n, &rows, &block_elems, &head, &row_bytes};
  launch(encode_, grid_x, 1, kThreads, stream, args, "activekv_encode_gather");
}

}  // namespace activekv::detail
