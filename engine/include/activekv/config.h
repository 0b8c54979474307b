// ActiveKV configuration, read from vLLM's kv_connector_extra_config. Same keys,
// defaults and messages as the Python reference (config.py).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "activekv/host_memory.h"
#include "activekv/status.h"

namespace activekv {

enum class Mode { kExact, kCompressed };
enum class StoreScope { kPrompt, kPromptAndDecode };

// The rules of the keys a user names most, shared by Config::parse and the
// launcher (activekv-serve checks its --activekv-* flags by them before vLLM
// starts). This file and config.cpp use no torch, so the launcher can build
// them without it.
inline constexpr std::array<std::pair<const char*, Mode>, 2> kModes = {
    {{"exact", Mode::kExact}, {"compressed", Mode::kCompressed}}};
// The mode of this name, or nothing if no mode has it.
std::optional<Mode> mode_named(std::string_view name);
// capacity_bytes accepts a positive number of bytes.
inline constexpr const char* kCapacityAccepts = "a positive number of bytes";
constexpr bool capacity_in_range(std::int64_t bytes) { return bytes > 0; }

// One value of the extra config as Python gave it.
struct ConfigValue {
  enum class Kind { kInt, kBool, kString, kOther, kNone, kTable };
  Kind kind = Kind::kOther;
  std::int64_t int_value = 0;
  std::string string_value;
  std::string type_name;                     // Python type name, for messages
  std::string repr;                          // Python repr(), for messages
  std::map<std::string, ConfigValue> table;  // kTable: a dict's entries, by key
};

// Layer streaming (layer_streaming.h): the first `resident_layers` layers keep
// their KV on the device; the others live in host memory and take turns in a
// ring of `ring_size` device buffers, one layer's worth of blocks each.
// `homes`: how the host holds the streamed layers (kv_codec.h; compressed is
// lossy within the codec's bound and re-encoded at each write-back).
struct StreamingConfig {
  std::int64_t resident_layers = 0;
  std::int64_t ring_size = 2;
  Mode homes = Mode::kExact;
};

struct Config {
  Mode mode = Mode::kExact;
  std::int64_t capacity_bytes = std::int64_t{1} << 30;
  std::int64_t store_threshold = 1;
  std::int64_t max_bytes_per_request = 0;  // 0 = no cap
  StoreScope store_blocks = StoreScope::kPrompt;
  // How long wait_for_save waits for a save's copies; past it their slots are
  // quarantined (the copies' outcome is unknown).
  std::int64_t fence_timeout_ms = 30000;
  // Absent (or None in Python): every layer's KV stays on the device.
  std::optional<StreamingConfig> streaming;
  // A hit of at least this many tokens loads asynchronously: vLLM parks the
  // request (WAITING_FOR_REMOTE_KVS) while its blocks cross, and the other
  // requests' steps run meanwhile instead of waiting for the copies. 0 (the
  // default): every load lands inside the step that computes the request.
  // Refused with streaming, which lands loads inside the forward.
  std::int64_t async_load_min_tokens = 0;
  // A file that holds the host store across restarts (store_file.h; a path
  // in /dev/shm or on a disk). Empty: the store lives in process memory.
  std::string store_path;

  // Validates every key; the error names the key and what it accepts.
  static Result<Config> parse(const std::map<std::string, ConfigValue>& extra);

  // The host store's size in blocks of `slot_bytes` (one block over all
  // layers in this config's mode): capacity_bytes / slot_bytes. An error
  // naming capacity_bytes when that is no block, or when capacity_bytes is
  // more than `host` (usable_host_memory() on a real host), naming it.
  Result<std::int64_t> store_slots(std::int64_t slot_bytes, const HostMemory& host) const;
};

const char* mode_name(Mode mode);

// This host's physical memory in bytes.
std::int64_t physical_memory_bytes();

}  // namespace activekv
