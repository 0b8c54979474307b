// Small helpers the worker side and the layer streamer share (internal).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <cstdint>

namespace activekv::detail {

// Microseconds since construction, for the telemetry's *_us counters.
class Stopwatch {
 public:
  std::int64_t us() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The stream vLLM's kernels run on (the current one of the device).
inline c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace activekv::detail
