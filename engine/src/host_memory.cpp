#include "activekv/host_memory.h"

#include <charconv>
#include <fstream>
#include <sstream>

#include "activekv/config.h"

namespace activekv {

namespace {

// A limit file's number; nullopt for "max" (v2), v1's "no limit" (a page
// count near 2^63), a missing file or anything else.
std::optional<std::int64_t> read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value <= 0) return std::nullopt;
  if (value >= (std::int64_t{1} << 62)) return std::nullopt;
  return value;
}

// The smallest limit in `dir` (relative to `mount`) and its ancestors.
std::optional<HostMemory> smallest_up_from(const std::string& mount, std::string dir, const char* file) {
  std::optional<HostMemory> best;
  while (true) {
    const std::string path = mount + (dir == "/" ? "" : dir) + "/" + file;
    if (const auto limit = read_limit(path); limit && (!best || *limit < best->bytes)) {
      best = HostMemory{*limit, "the memory limit of this process's cgroup, " + path};
    }
    if (dir == "/" || dir.empty()) return best;
    const auto slash = dir.rfind('/');
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
}

}  // namespace

std::optional<HostMemory> cgroup_memory_limit(const std::string& proc_cgroup,
                                              const std::string& cgroup_root) {
  std::ifstream in(proc_cgroup);
  std::string line;
  std::optional<HostMemory> best;
  const auto keep = [&](const std::optional<HostMemory>& found) {
    if (found && (!best || found->bytes < best->bytes)) best = found;
  };
  while (std::getline(in, line)) {  // ID:CONTROLLERS:PATH
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string dir = line.substr(second + 1);
    if (dir.empty() || dir[0] != '/') continue;
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {  // the v2 hierarchy
      keep(smallest_up_from(cgroup_root, dir, "memory.max"));
      continue;
    }
    std::stringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) {
      if (name == "memory") keep(smallest_up_from(cgroup_root + "/memory", dir, "memory.limit_in_bytes"));
    }
  }
  return best;
}

HostMemory usable_host_memory(std::int64_t physical_bytes, const std::optional<HostMemory>& cgroup_limit) {
  if (cgroup_limit && cgroup_limit->bytes < physical_bytes) return *cgroup_limit;
  return {physical_bytes, "this host's memory"};
}

HostMemory usable_host_memory() { return usable_host_memory(physical_memory_bytes(), cgroup_memory_limit()); }

}  // namespace activekv
