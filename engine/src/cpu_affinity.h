// Which CPUs a helper thread may use beside the forward (internal): the CPU
// layer streamer's copy thread (StreamingTuning::cpu_copy_thread).
//
// vLLM's CPU worker binds its forward's OpenMP threads to its cores (all to
// one set of CPUs, or one to each with Intel's or GNU's OpenMP preloaded) and
// leaves a core to its engine core, one more with a KV connector. A copy
// thread on the forward's cores, or on their hyperthread siblings, would take
// turns with the forward; on a core it leaves, it runs beside it.
#pragma once

#include <string>
#include <vector>

namespace activekv::detail {

// What pin_caller_to names the calling thread (its /proc comm).
inline constexpr const char* kCopyThreadName = "activekv-copy";

// The CPUs the forward may run on: those of every thread of the process but a
// copy thread (each forward thread may be bound to a CPU of its own);
// ascending. Empty off Linux.
std::vector<int> forward_cpus();

// CPUs on `forward`'s NUMA nodes that are neither in `forward` nor a
// hyperthread sibling of one, and that both the process's cgroup cpuset and
// its parent process's affinity allow; ascending. Empty where the forward may
// run on all of them (unbound), or off Linux. The parent's affinity keeps
// vllm serve's worker within a taskset or numactl -C its server was started
// under; a process started so itself (vLLM in-process) is not seen that way:
// its forward's bound threads hide the rest.
std::vector<int> cpus_beside(const std::vector<int>& forward);

// Names the calling thread kCopyThreadName and restricts it to `cpus`;
// returns those it may run on now (the kernel drops CPUs the process's
// cpuset excludes), empty where it failed.
std::vector<int> pin_caller_to(const std::vector<int>& cpus);

// "0-3,8,10-11" (the kernel's cpulist format) as CPU numbers.
std::vector<int> parse_cpu_list(const std::string& text);

}  // namespace activekv::detail
