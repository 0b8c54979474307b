// Which CPUs a helper thread may use beside the calling thread (internal):
// the CPU layer streamer's copy thread (StreamingTuning::cpu_copy_thread).
//
// vLLM's CPU worker binds its OpenMP threads, the forward's, one to a core and
// leaves a core for its engine core process, which mostly waits for the
// worker. A copy thread on the forward's cores would take turns with the
// forward; on a left core it runs beside it.
#pragma once

#include <string>
#include <vector>

namespace activekv::detail {

// CPUs on the calling thread's NUMA nodes that the calling thread's affinity
// excludes, ascending; empty where it may run on all of them (unbound), or
// off Linux.
std::vector<int> cpus_beside_caller();

// Restricts the calling thread to `cpus`; returns those it may run on now (the
// kernel drops CPUs the process's cpuset excludes), empty where it failed.
std::vector<int> pin_caller_to(const std::vector<int>& cpus);

// "0-3,8,10-11" (the kernel's cpulist format) as CPU numbers.
std::vector<int> parse_cpu_list(const std::string& text);

}  // namespace activekv::detail
