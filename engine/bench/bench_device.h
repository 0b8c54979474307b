// What the benchmarks share: waiting for a device's current stream, and where
// the host side runs (Linux: sysfs and the NVIDIA driver's /proc entries).
#pragma once

#include <dirent.h>
#include <sched.h>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace activekv::bench {

// Empty when `device` names an accelerator this process can use; else what is
// wrong. The benchmarks measure the bus between pinned host memory and an
// accelerator: without one, torch cannot even pin the host memory.
inline std::string accelerator_problem(const std::string& device) {
  c10::Device d(c10::DeviceType::CPU);
  try {
    d = c10::Device(device);
  } catch (const c10::Error&) {
    return "--device " + device + ": not a device torch knows (e.g. cuda, cuda:1, xpu)";
  }
  if (d.is_cpu())
    return "--device cpu: this benchmark measures the bus to an accelerator; name one (cuda, xpu)";
  const std::string type = c10::DeviceTypeName(d.type(), /*lower_case=*/true);
  if (!c10::impl::hasDeviceGuardImpl(d.type()))
    return "--device " + device + ": this torch was built without " + type;
  const auto count = c10::impl::getDeviceGuardImpl(d.type())->deviceCount();
  if (count == 0)
    return "no " + type +
           " device here: run it on a machine with one (ci/gpu-engine-check.sh builds it there)";
  if (d.has_index() && d.index() >= count) {
    return "--device " + device + ": this machine has " + std::to_string(count) + " " + type + " device(s)";
  }
  return {};
}

// Returns once every kernel and copy queued so far on the device's current
// stream has finished.
inline void sync_current_stream(c10::Device device) {
  const c10::impl::VirtualGuardImpl impl(device.type());
  c10::Event done(device.type());
  done.record(impl.getStream(device));
  done.synchronize();
}

namespace detail {

inline std::string first_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

constexpr const char* kNvidiaGpus = "/proc/driver/nvidia/gpus";

// The PCI bus id of each NVIDIA GPU listed under `driver`, in bus order.
// POSIX, not std::filesystem (temp_dir.h says why): the engine's tests run
// this on the GPU machine too.
inline std::vector<std::string> gpu_buses(const std::string& driver = kNvidiaGpus) {
  std::vector<std::string> buses;
  if (DIR* dir = ::opendir(driver.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") buses.push_back(name);
    }
    ::closedir(dir);
  }
  std::sort(buses.begin(), buses.end());
  return buses;
}

// The NUMA node of each NVIDIA GPU the driver lists, in bus order (-1: the
// platform does not say).
inline std::vector<int> gpu_numa_nodes() {
  std::vector<int> nodes;
  for (const auto& bus : gpu_buses()) {
    const std::string node = first_line(std::filesystem::path("/sys/bus/pci/devices") / bus / "numa_node");
    nodes.push_back(node.empty() ? -1 : std::stoi(node));
  }
  return nodes;
}

// Each NVIDIA GPU's model as the driver names it ("NVIDIA H200"), in bus
// order: the "Model:" line of each GPU's information file under `driver`.
inline std::vector<std::string> gpu_models(const std::string& driver = kNvidiaGpus) {
  std::vector<std::string> models;
  for (const auto& bus : gpu_buses(driver)) {
    std::ifstream in(driver + "/" + bus + "/information");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Model:", 0) != 0) continue;
      const auto first = line.find_first_not_of(" \t", 6);
      const auto last = line.find_last_not_of(" \t\r");
      if (first != std::string::npos) models.push_back(line.substr(first, last - first + 1));
      break;
    }
  }
  return models;
}

inline int cpu_numa_node(int cpu) {
  std::error_code ec;
  const auto dir = std::filesystem::path("/sys/devices/system/cpu") / ("cpu" + std::to_string(cpu));
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) == 0) return std::stoi(name.substr(4));
  }
  return -1;
}

}  // namespace detail

// One line for a benchmark's header: the CPU this thread runs on and its NUMA
// node, how many CPUs the process may use, and each NVIDIA GPU's NUMA node.
// Runs on different machine starts differ by the host's placement (the
// host's time to issue a layer's copies), so the line is printed with the
// figures.
inline std::string host_placement() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int allowed_count = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : -1;
  const int cpu = sched_getcpu();
  std::ostringstream out;
  out << "host: cpu " << cpu << " (numa node " << detail::cpu_numa_node(cpu) << "), " << allowed_count
      << " cpus allowed; gpu numa nodes:";
  const auto nodes = detail::gpu_numa_nodes();
  if (nodes.empty()) out << " unknown";
  for (const int node : nodes) out << " " << node;
  return out.str();
}

// The host's GPU models, for a run's raw output (the figures of an H100 and
// an H200 differ, and a report must not mix them unawares): each model once,
// with its count where several ("NVIDIA H100 80GB HBM3 x8"); empty where the
// driver lists none. The device machines hold one GPU, or several of a kind.
inline std::string gpu_model_names(const std::string& driver = detail::kNvidiaGpus) {
  std::vector<std::pair<std::string, int>> counted;
  for (const auto& model : detail::gpu_models(driver)) {
    const auto it =
        std::find_if(counted.begin(), counted.end(), [&](const auto& c) { return c.first == model; });
    if (it == counted.end()) {
      counted.emplace_back(model, 1);
    } else {
      ++it->second;
    }
  }
  std::string out;
  for (const auto& [model, n] : counted) {
    out += (out.empty() ? "" : ", ") + model + (n > 1 ? " x" + std::to_string(n) : "");
  }
  return out;
}

// Pins this process to the CPUs of the first NVIDIA GPU's NUMA node (before
// any allocation, so pinned host memory is first touched there too). Returns
// what it did, or why it did not.
inline std::string pin_to_gpu_node() {
  const auto nodes = detail::gpu_numa_nodes();
  if (nodes.empty() || nodes.front() < 0) return "not pinned: the GPU's NUMA node is unknown";
  const std::string list =
      detail::first_line("/sys/devices/system/node/node" + std::to_string(nodes.front()) + "/cpulist");
  cpu_set_t set;
  CPU_ZERO(&set);
  std::stringstream ranges(list);
  for (std::string range; std::getline(ranges, range, ',');) {
    const auto dash = range.find('-');
    const int first = std::stoi(range.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
    for (int c = first; c <= last; ++c) CPU_SET(static_cast<std::size_t>(c), &set);
  }
  if (CPU_COUNT(&set) == 0 || sched_setaffinity(0, sizeof set, &set) != 0) {
    return "not pinned: node " + std::to_string(nodes.front()) + "'s cpus (" + list + ") refused";
  }
  return "pinned to numa node " + std::to_string(nodes.front()) + " (cpus " + list + ")";
}

}  // namespace activekv::bench
