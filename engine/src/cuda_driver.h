// The CUDA driver and NVRTC, found at run time (internal). The engine builds
// without a device toolkit, so their entry points are looked up in the
// libraries torch's CUDA build has loaded (libcuda.so.1; NVRTC beside the CUDA
// runtime torch loaded), and the few types used are declared as cuda.h and
// nvrtc.h give them.
#pragma once

#include <string>

namespace activekv::detail {

// From cuda.h: CUresult is an int.
using CUresult = int;
inline constexpr CUresult kCudaSuccess = 0;

// The driver's entry point `name` as of API `version` (e.g. 12080), or null
// when this process has no CUDA driver or the driver lacks it.
void* cuda_driver_symbol(const char* name, int version);

// "CUresult N (the driver's text)".
std::string cuda_error_text(CUresult rc);

// NVRTC's `name` (nvrtcCompileProgram, ...), or null when no NVRTC library is
// found: libnvrtc.so.13 or .12 beside the loaded CUDA runtime, then on the
// loader's path.
void* nvrtc_symbol(const char* name);

}  // namespace activekv::detail
