// activekv-serve: vLLM's OpenAI-compatible server with ActiveKV on, as one
// native executable. It embeds the CPython of the environment it is installed
// in (it lives in that environment's bin/, beside python), turns its own flags
// (or a JSON config file) into vLLM's --kv-transfer-config, and runs vLLM's
// server module with the user's remaining arguments:
//
//   activekv-serve [--activekv-mode exact|compressed] [--activekv-capacity BYTES]
//                  [--activekv-streaming RESIDENT[,RING]]
//                  [--activekv-config FILE.json] [--] VLLM_SERVER_ARGS...
//
// The ActiveKV connector registers itself through its vllm.general_plugins
// entry point; nothing here is Python of ours. The flags are checked by the
// engine's own rules (activekv/config.h, built here without torch) before
// vLLM starts; the keys of a config file, by the engine when vLLM starts.
#include <Python.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "activekv/config.h"

namespace {

constexpr const char* kServerModule = "vllm.entrypoints.openai.api_server";

int usage(const char* program, const std::string& problem) {
  std::fprintf(stderr,
               "%s: %s\n"
               "usage: %s [--activekv-mode exact|compressed] [--activekv-capacity BYTES]\n"
               "          [--activekv-streaming RESIDENT[,RING]]\n"
               "          [--activekv-config FILE.json] [--] VLLM_SERVER_ARGS...\n"
               "  --activekv-streaming  layer streaming: RESIDENT layers keep their KV on the\n"
               "                     device, the others pass through a ring of RING buffers\n"
               "                     (default %lld); needs vLLM with ActiveKV's patch series\n"
               "  --activekv-config  a JSON object of kv_connector_extra_config keys\n"
               "                     (mode, capacity_bytes, store_threshold, streaming, ...);\n"
               "                     flags win\n",
               program, problem.c_str(), program,
               static_cast<long long>(activekv::StreamingConfig{}.ring_size));
  return 2;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// The directory of this executable: the environment's bin/.
std::string own_dir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  std::string path(buf.data(), static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/'));
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = "activekv-serve";
  std::string mode, capacity, streaming, config_json = "{}";
  std::vector<std::string> vllm_args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      return i + 1 < argc ? argv[++i] : (usage(program, std::string(flag) + " needs a value"), nullptr);
    };
    if (arg == "--") {
      for (++i; i < argc; ++i) vllm_args.emplace_back(argv[i]);
    } else if (arg == "--help-activekv") {
      usage(program, "help");
      return 0;
    } else if (arg == "--activekv-mode") {
      const char* v = value("--activekv-mode");
      if (v == nullptr) return 2;
      mode = v;
      if (!activekv::mode_named(mode)) {
        std::string accepted;
        for (const auto& [name, m] : activekv::kModes)
          accepted += (accepted.empty() ? "" : ", ") + std::string(name);
        return usage(program,
                     "--activekv-mode: '" + mode + "' is not accepted; accepted values: " + accepted);
      }
    } else if (arg == "--activekv-capacity") {
      const char* v = value("--activekv-capacity");
      if (v == nullptr) return 2;
      // A whole number in range; reprinted: JSON numbers have no leading zeros.
      std::int64_t bytes = 0;
      const char* end = v + std::strlen(v);
      const auto parsed = std::from_chars(v, end, bytes);
      if (parsed.ec != std::errc{} || parsed.ptr != end || !activekv::capacity_in_range(bytes)) {
        return usage(program,
                     std::string("--activekv-capacity: '") + v + "' is not " + activekv::kCapacityAccepts);
      }
      capacity = std::to_string(bytes);
    } else if (arg == "--activekv-streaming") {
      const char* v = value("--activekv-streaming");
      if (v == nullptr) return 2;
      const std::string s = v;
      const auto comma = s.find(',');
      const std::string resident = s.substr(0, comma);
      const bool ring_given = comma != std::string::npos;
      const std::string ring = ring_given ? s.substr(comma + 1) : "0";
      if (!all_digits(resident) || !all_digits(ring) || resident.size() > 6 || ring.size() > 6) {
        return usage(program,
                     "--activekv-streaming: '" + s +
                         "' is not RESIDENT[,RING] (two whole numbers: resident layers, ring buffers)");
      }
      // The range checks (ring >= 2, fewer resident layers than the model has)
      // are the engine's, with the key named, when vLLM starts, as is the
      // ring's default where none is given. Reprinted: JSON numbers have no
      // leading zeros.
      streaming = "{\"resident_layers\": " + std::to_string(std::stoi(resident)) +
                  (ring_given ? ", \"ring_size\": " + std::to_string(std::stoi(ring)) : "") + "}";
    } else if (arg == "--activekv-config") {
      const char* v = value("--activekv-config");
      if (v == nullptr) return 2;
      std::ifstream in(v);
      if (!in) return usage(program, std::string("--activekv-config: cannot read ") + v);
      std::stringstream text;
      text << in.rdbuf();
      config_json = text.str();
      const auto first = config_json.find_first_not_of(" \t\r\n");
      const auto last = config_json.find_last_not_of(" \t\r\n");
      if (first == std::string::npos || config_json[first] != '{' || config_json[last] != '}') {
        return usage(program, std::string("--activekv-config: ") + v + " is not a JSON object");
      }
      config_json = config_json.substr(first, last - first + 1);
    } else if (arg.rfind("--activekv", 0) == 0) {
      return usage(program, "unknown flag " + arg);
    } else if (arg == "--kv-transfer-config") {
      return usage(program, "--kv-transfer-config is set by activekv-serve; use its --activekv-* flags");
    } else {
      vllm_args.push_back(arg);
    }
  }
  // Flags win over the file: keys appended later override earlier ones in the
  // JSON object (Python's json keeps the last of duplicate keys).
  std::string extra = config_json.substr(0, config_json.size() - 1);  // open: no closing brace
  bool has_keys = extra.find_first_not_of(" \t\r\n", 1) != std::string::npos;
  auto add = [&](const std::string& key, const std::string& v) {
    extra += (has_keys ? ", " : "") + json_string(key) + ": " + v;
    has_keys = true;
  };
  if (!mode.empty()) add("mode", json_string(mode));
  if (!capacity.empty()) add("capacity_bytes", capacity);
  if (!streaming.empty()) add("streaming", streaming);
  extra += "}";
  const std::string transfer =
      "{\"kv_connector\": \"ActiveKVHostConnector\", \"kv_role\": \"kv_both\", "
      "\"kv_connector_extra_config\": " +
      extra + "}";

  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.parse_argv = 0;  // the arguments are vLLM's (sys.argv), not the interpreter's options
  const std::string python = own_dir() + "/python";
  // The environment's interpreter: sys.prefix and site-packages come from its
  // pyvenv.cfg, and vLLM's spawned workers start it, not this launcher.
  PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, python.c_str());
  if (!PyStatus_Exception(status)) {
    status = PyConfig_SetBytesString(&config, &config.executable, python.c_str());
  }
  if (!PyStatus_Exception(status)) {
    status = PyConfig_SetBytesString(&config, &config.run_module, kServerModule);
  }
  std::vector<std::string> args = {kServerModule};
  args.insert(args.end(), vllm_args.begin(), vllm_args.end());
  args.push_back("--kv-transfer-config");
  args.push_back(transfer);
  std::vector<char*> raw;
  for (auto& a : args) raw.push_back(a.data());
  if (!PyStatus_Exception(status)) {
    status = PyConfig_SetBytesArgv(&config, static_cast<Py_ssize_t>(raw.size()), raw.data());
  }
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) Py_ExitStatusException(status);
  return Py_RunMain();
}
