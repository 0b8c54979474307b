// What the benchmarks share: waiting for a device's current stream.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace activekv::bench {

// Returns once every kernel and copy queued so far on the device's current
// stream has finished.
inline void sync_current_stream(c10::Device device) {
  const c10::impl::VirtualGuardImpl impl(device.type());
  c10::Event done(device.type());
  done.record(impl.getStream(device));
  done.synchronize();
}

}  // namespace activekv::bench
