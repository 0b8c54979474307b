// The CUDA driver and NVRTC, found at run time (cuda_driver.h).
#include "cuda_driver.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace activekv::detail {
namespace {

using GetProcAddress = CUresult (*)(const char* symbol, void** fn, int cuda_version, std::uint64_t flags,
                                    int* symbol_status);
using GetErrorString = CUresult (*)(CUresult error, const char** text);

void* driver_library() {
  // torch has loaded the driver by the time a CUDA tensor exists; never unloaded.
  static void* const lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib;
}

// The folder of the loaded CUDA runtime (torch's wheel keeps NVRTC there).
std::string cuda_runtime_folder() {
  std::string out;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        const std::string_view path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        const auto slash = path.rfind('/');
        if (slash != std::string_view::npos && path.substr(slash + 1).starts_with("libcudart.so")) {
          *static_cast<std::string*>(data) = std::string(path.substr(0, slash));
          return 1;
        }
        return 0;
      },
      &out);
  return out;
}

void* nvrtc_library() {
  static void* const lib = [] {
    const std::string folder = cuda_runtime_folder();
    std::vector<std::string> candidates;
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12"}) {
      if (!folder.empty()) candidates.push_back(folder + "/" + name);
      candidates.emplace_back(name);
    }
    candidates.emplace_back("libnvrtc.so");
    for (const auto& c : candidates) {
      if (void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    }
    return static_cast<void*>(nullptr);
  }();
  return lib;
}

}  // namespace

void* cuda_driver_symbol(const char* name, int version) {
  void* lib = driver_library();
  if (lib == nullptr) return nullptr;
  static const auto get = reinterpret_cast<GetProcAddress>(::dlsym(lib, "cuGetProcAddress_v2"));
  if (get == nullptr) return nullptr;
  void* fn = nullptr;
  int status = 0;
  if (get(name, &fn, version, 0, &status) != kCudaSuccess) return nullptr;
  return fn;
}

std::string cuda_error_text(CUresult rc) {
  const char* text = nullptr;
  if (void* lib = driver_library()) {
    if (auto f = reinterpret_cast<GetErrorString>(::dlsym(lib, "cuGetErrorString"))) f(rc, &text);
  }
  return "CUresult " + std::to_string(rc) +
         (text != nullptr ? std::string(" (") + text + ")" : std::string());
}

void* nvrtc_symbol(const char* name) {
  void* lib = nvrtc_library();
  return lib == nullptr ? nullptr : ::dlsym(lib, name);
}

}  // namespace activekv::detail
