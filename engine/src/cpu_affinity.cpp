// CPUs beside the forward (cpu_affinity.h).
#include "cpu_affinity.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#ifdef __linux__
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

namespace activekv::detail {

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.find_first_not_of(" \n\t") == std::string::npos) continue;
    const auto dash = item.find('-');
    try {
      const int first = std::stoi(item.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(item.substr(dash + 1));
      for (int c = first; c <= last; ++c) out.push_back(c);
    } catch (const std::exception&) {
      return {};  // not a cpulist: no CPUs known
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

#ifdef __linux__
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool has(const cpu_set_t& set, int cpu) {
  return cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(static_cast<std::size_t>(cpu), &set);
}

// The CPUs a /proc status file (a process's or a thread's) says it may use.
std::vector<int> allowed_list_of(const std::string& status_path) {
  std::ifstream status(status_path);
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) return parse_cpu_list(line.substr(line.find(':') + 1));
  }
  return {};
}

std::vector<int> cpus_of(const cpu_set_t& set) {
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (has(set, c)) out.push_back(c);
  }
  return out;
}

}  // namespace

std::vector<int> forward_cpus() {
  // Every thread's CPUs but a copy thread's: vLLM binds the forward's threads
  // as torch loads, before the process starts any other, so the others share
  // the forward's CPUs (unbound, all of them: no CPU is left beside).
  std::vector<int> all;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (const dirent* entry = readdir(tasks)) {
      const std::string task = std::string("/proc/self/task/") + entry->d_name;
      if (entry->d_name[0] == '.' || read_line(task + "/comm") == kCopyThreadName) continue;
      const auto cpus = allowed_list_of(task + "/status");
      all.insert(all.end(), cpus.begin(), cpus.end());
    }
    closedir(tasks);
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

std::vector<int> cpus_beside(const std::vector<int>& forward) {
  const auto in_forward = [&](int c) { return std::binary_search(forward.begin(), forward.end(), c); };
  // The forward's NUMA nodes' CPUs: a copy from another node's core would
  // cross the interconnect, and there the CPU may be another worker's.
  // Without the node files (no NUMA in the kernel), every online CPU.
  std::vector<int> near;
  if (DIR* nodes = opendir("/sys/devices/system/node")) {
    while (const dirent* entry = readdir(nodes)) {
      const std::string name = entry->d_name;
      if (name.size() <= 4 || name.rfind("node", 0) != 0 ||
          name.find_first_not_of("0123456789", 4) != std::string::npos) {
        continue;
      }
      const auto cpus = parse_cpu_list(read_line("/sys/devices/system/node/" + name + "/cpulist"));
      if (std::any_of(cpus.begin(), cpus.end(), in_forward))
        near.insert(near.end(), cpus.begin(), cpus.end());
    }
    closedir(nodes);
  }
  if (near.empty()) near = parse_cpu_list(read_line("/sys/devices/system/cpu/online"));
  // A hyperthread sibling shares its core's units with the forward's thread.
  std::vector<int> taken(forward);
  for (const int c : forward) {
    const auto siblings = parse_cpu_list(
        read_line("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/thread_siblings_list"));
    taken.insert(taken.end(), siblings.begin(), siblings.end());
  }
  std::sort(taken.begin(), taken.end());
  // A container's cpuset (cgroup v2), where one is in force.
  const auto allowed = parse_cpu_list(read_line("/sys/fs/cgroup/cpuset.cpus.effective"));
  // The parent's CPUs: vllm serve's worker is a child of a process that keeps
  // the affinity it was started with (taskset, numactl -C), which the
  // worker's own bound threads no longer show.
  const auto parents = allowed_list_of("/proc/" + std::to_string(getppid()) + "/status");
  const auto within = [](const std::vector<int>& set, int c) {
    return set.empty() || std::binary_search(set.begin(), set.end(), c);  // empty: not known, no limit
  };
  std::vector<int> out;
  for (const int c : near) {
    if (std::binary_search(taken.begin(), taken.end(), c) || !within(allowed, c) || !within(parents, c))
      continue;
    out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> pin_caller_to(const std::vector<int>& cpus) {
  pthread_setname_np(pthread_self(), kCopyThreadName);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(static_cast<std::size_t>(c), &set);
  }
  if (CPU_COUNT(&set) == 0 || sched_setaffinity(0, sizeof(set), &set) != 0) return {};
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  return cpus_of(set);
}
#else
std::vector<int> forward_cpus() { return {}; }
std::vector<int> cpus_beside(const std::vector<int>&) { return {}; }
std::vector<int> pin_caller_to(const std::vector<int>&) { return {}; }
#endif

}  // namespace activekv::detail
