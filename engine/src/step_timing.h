// Small helpers the worker side and the layer streamer share (internal).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

namespace activekv::detail {

// Microseconds since construction, for the telemetry's *_us counters.
class Stopwatch {
 public:
  std::int64_t us() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The stream vLLM's kernels run on (the current one of the device).
inline c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

// Waits until `fence` completed (true), or `deadline` passed or the fence
// reported an error (false: the copies behind it may or may not have landed).
inline bool fence_done_by(const c10::Event& fence, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    try {
      if (fence.query()) return true;
    } catch (const c10::Error&) {
      return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
}

// Without waiting: true where `fence` completed, false where its outcome is
// unknown (it reported an error, or still runs past `deadline`), nothing
// while it runs within its deadline.
inline std::optional<bool> fence_outcome_now(const c10::Event& fence,
                                             std::chrono::steady_clock::time_point deadline) {
  try {
    if (fence.query()) return true;
  } catch (const c10::Error&) {
    return false;
  }
  if (std::chrono::steady_clock::now() >= deadline) return false;
  return std::nullopt;
}

}  // namespace activekv::detail
