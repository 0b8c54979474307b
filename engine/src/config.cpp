#include "activekv/config.h"

#include <unistd.h>

#include <array>
#include <functional>

namespace activekv {
namespace {

constexpr std::array<const char*, 9> kKeys = {"async_load_min_tokens",
                                              "capacity_bytes",
                                              "fence_timeout_ms",
                                              "max_bytes_per_request",
                                              "mode",
                                              "store_blocks",
                                              "store_path",
                                              "store_threshold",
                                              "streaming"};
constexpr const char* kStreamingWhere = "kv_connector_extra_config['streaming']";

std::string where(const std::string& key) { return "kv_connector_extra_config['" + key + "']"; }

Status bad(std::string message) { return {ErrorCode::kInvalidConfig, std::move(message)}; }

// `place` is where the key is, as messages name it.
Status read_int_at(const std::string& place, const ConfigValue& v, std::int64_t& out,
                   const std::function<bool(std::int64_t)>& in_range, const char* accepts) {
  if (v.kind != ConfigValue::Kind::kInt) {
    return bad(place + ": expected an integer, got " + v.type_name + " " + v.repr);
  }
  if (!in_range(v.int_value)) {
    return bad(place + ": " + v.repr + " is out of range; expected " + accepts);
  }
  out = v.int_value;
  return Status::Ok();
}

Status read_int(const std::string& key, const ConfigValue& v, std::int64_t& out,
                const std::function<bool(std::int64_t)>& in_range, const char* accepts) {
  return read_int_at(where(key), v, out, in_range, accepts);
}

template <class E, std::size_t N>
Status read_choice_at(const std::string& place, const ConfigValue& v,
                      const std::array<std::pair<const char*, E>, N>& choices, E& out) {
  if (v.kind == ConfigValue::Kind::kString) {
    for (const auto& [name, value] : choices) {
      if (v.string_value == name) {
        out = value;
        return Status::Ok();
      }
    }
  }
  std::string accepted;
  for (const auto& [name, value] : choices) {
    accepted += (accepted.empty() ? "'" : ", '") + std::string(name) + "'";
  }
  return bad(place + ": " + v.repr + " is not accepted; accepted values: " + accepted);
}

// The `streaming` table, key by key in sorted order (as config.py's _streaming).
Result<StreamingConfig> read_streaming(const ConfigValue& v) {
  const std::string at = kStreamingWhere;
  if (v.kind != ConfigValue::Kind::kTable) {
    return bad(at + ": expected a table {'resident_layers': R, 'ring_size': K}, got " + v.type_name + " " +
               v.repr);
  }
  for (const auto& [key, value] : v.table) {
    if (key != "homes" && key != "resident_layers" && key != "ring_size") {
      return bad(at + ": unknown key '" + key + "'; accepted keys: homes, resident_layers, ring_size");
    }
  }
  StreamingConfig out;
  for (const auto& [key, value] : v.table) {
    const std::string place = at + "['" + key + "']";
    const Status s = key == "homes" ? read_choice_at(place, value, kModes, out.homes)
                     : key == "resident_layers"
                         ? read_int_at(
                               place, value, out.resident_layers, [](auto x) { return x >= 0; },
                               "an integer >= 0 (layers kept on the device)")
                         : read_int_at(
                               place, value, out.ring_size, [](auto x) { return x >= 2; },
                               "an integer >= 2 (staging buffers on the device)");
    if (!s.ok()) return s;
  }
  return out;
}

}  // namespace

const char* mode_name(Mode mode) { return mode == Mode::kExact ? "exact" : "compressed"; }

std::optional<Mode> mode_named(std::string_view name) {
  for (const auto& [n, mode] : kModes) {
    if (name == n) return mode;
  }
  return std::nullopt;
}

std::int64_t physical_memory_bytes() {
  return static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<std::int64_t>(sysconf(_SC_PAGE_SIZE));
}

Result<std::int64_t> Config::store_slots(std::int64_t slot_bytes, const HostMemory& host) const {
  const std::string at = where("capacity_bytes") + "=" + std::to_string(capacity_bytes);
  const std::int64_t slots = capacity_bytes / slot_bytes;
  if (slots == 0) {
    return bad(at + " holds no block; one block takes " + std::to_string(slot_bytes) + " bytes in " +
               mode_name(mode) + " mode");
  }
  if (capacity_bytes > host.bytes) {
    return bad(at + " exceeds " + host.what + " (" + std::to_string(host.bytes) + " bytes); ask for less");
  }
  return slots;
}

Result<Config> Config::parse(const std::map<std::string, ConfigValue>& extra) {
  for (const auto& [key, value] : extra) {  // std::map: sorted, like the reference
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    if (!known) {
      std::string accepted;
      for (const char* k : kKeys) accepted += (accepted.empty() ? "" : ", ") + std::string(k);
      return bad("kv_connector_extra_config: unknown key '" + key + "'; accepted keys: " + accepted);
    }
  }
  Config c;
  for (const auto& [key, v] : extra) {
    Status s;
    if (key == "streaming") {
      continue;  // a table: read after every other key, as the reference does
    } else if (key == "mode") {
      s = read_choice_at(where(key), v, kModes, c.mode);
    } else if (key == "store_blocks") {
      constexpr std::array<std::pair<const char*, StoreScope>, 2> kScopes = {
          {{"prompt", StoreScope::kPrompt}, {"prompt_and_decode", StoreScope::kPromptAndDecode}}};
      s = read_choice_at(where(key), v, kScopes, c.store_blocks);
    } else if (key == "store_path") {
      if (v.kind != ConfigValue::Kind::kString || v.string_value.empty()) {
        s = bad(where(key) + ": expected a file path (a non-empty string), got " + v.type_name + " " +
                v.repr);
      }
      c.store_path = v.string_value;
    } else if (key == "async_load_min_tokens") {
      s = read_int(
          key, v, c.async_load_min_tokens, [](auto x) { return x >= 0; },
          "an integer >= 0 (0 = every load inside its step)");
    } else if (key == "capacity_bytes") {
      s = read_int(key, v, c.capacity_bytes, capacity_in_range, kCapacityAccepts);
    } else if (key == "fence_timeout_ms") {
      s = read_int(
          key, v, c.fence_timeout_ms, [](auto x) { return x >= 1; }, "a positive number of milliseconds");
    } else if (key == "store_threshold") {
      s = read_int(key, v, c.store_threshold, [](auto x) { return x >= 1; }, "an integer >= 1");
    } else {
      s = read_int(
          key, v, c.max_bytes_per_request, [](auto x) { return x >= 0; }, "an integer >= 0 (0 = no cap)");
    }
    if (!s.ok()) return s;
  }
  if (const auto it = extra.find("streaming");
      it != extra.end() && it->second.kind != ConfigValue::Kind::kNone) {
    auto streaming = read_streaming(it->second);
    if (!streaming.ok()) return streaming.status();
    c.streaming = streaming.value();
    if (c.async_load_min_tokens > 0) {
      return bad(where("async_load_min_tokens") + ": " + std::to_string(c.async_load_min_tokens) +
                 " asks for asynchronous loads, but layer streaming lands loads inside the forward; "
                 "leave async_load_min_tokens at 0 with streaming");
    }
  }
  return c;
}

}  // namespace activekv
