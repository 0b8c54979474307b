// The device check's scenarios (internal), each returning what it covered
// when it passed; runner.cpp lists them and runs them.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "activekv/config.h"
#include "fixtures.h"

namespace activekv::device_check {

// The host store (store_scenarios.cpp): saves and loads, fences, the codec.
// small_ring: the loads cross a ring of two one-block staging buffers
// (WorkerSide::set_load_staging), so each buffer is reused within the step.
// async_loads: the loads are a request's asynchronous loads (StepPlan::async_loads).
std::string save_load(c10::Device device, Mode mode, Findings& f, bool layer_hooks = true,
                      bool small_ring = false, bool async_loads = false);
std::string save_fences_complete(c10::Device device, Findings& f);
std::string fence_timeout_quarantines(c10::Device device, Findings& f);
std::string compressed_decode(c10::Device device, Findings& f);

// Layer streaming (streaming_scenarios.cpp): the ring, its fences, steps back to back.
std::string streaming_ring(c10::Device device, Findings& f, Mode homes);
std::string streaming_fence_timeout_poisons(c10::Device device, Findings& f);
std::string streaming_back_to_back(c10::Device device, Findings& f, Mode homes);

}  // namespace activekv::device_check
