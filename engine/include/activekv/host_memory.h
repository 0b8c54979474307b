// The memory a host store may take: the host's physical memory, or less where
// this process's cgroup caps it (a container's --memory, a systemd unit's
// MemoryMax). The kernel does not refuse an allocation past a cgroup's limit:
// it kills the process mid-serving, so start-up checks capacity_bytes against
// the smaller of the two.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace activekv {

struct HostMemory {
  std::int64_t bytes;
  std::string what;  // what the figure is, for an error: "this host's memory", or the cgroup file
};

// The cgroup memory limit of the process whose /proc/PID/cgroup is
// `proc_cgroup`, under the cgroup file systems mounted at `cgroup_root`: the
// smallest limit on its cgroup and every ancestor (cgroup v2 memory.max, v1
// memory/.../memory.limit_in_bytes), naming the file that set it; nullopt
// where none is set or none can be read.
std::optional<HostMemory> cgroup_memory_limit(const std::string& proc_cgroup = "/proc/self/cgroup",
                                              const std::string& cgroup_root = "/sys/fs/cgroup");

// The smaller of the physical memory and the cgroup limit.
HostMemory usable_host_memory(std::int64_t physical_bytes, const std::optional<HostMemory>& cgroup_limit);
HostMemory usable_host_memory();

}  // namespace activekv
