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

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
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

// What the command line asked for: ActiveKV's settings and vLLM's own arguments.
struct Request {
  std::string mode, capacity, streaming, config_json = "{}";
  std::vector<std::string> vllm_args;
};

// A flag's value checked and reprinted as JSON, or the problem to print.
struct Parsed {
  std::string json;
  std::string problem;
};

Parsed parse_mode(const std::string& v) {
  if (activekv::mode_named(v)) return {v, ""};
  std::string accepted;
  for (const auto& [name, m] : activekv::kModes) {
    if (!accepted.empty()) accepted += ", ";
    accepted += name;
  }
  return {"", "--activekv-mode: '" + v + "' is not accepted; accepted values: " + accepted};
}

Parsed parse_capacity(const std::string& v) {
  // A whole number in range; reprinted: JSON numbers have no leading zeros.
  std::int64_t bytes = 0;
  const auto parsed = std::from_chars(v.data(), v.data() + v.size(), bytes);
  if (parsed.ec != std::errc{} || parsed.ptr != v.data() + v.size() || !activekv::capacity_in_range(bytes)) {
    return {"", "--activekv-capacity: '" + v + "' is not " + activekv::kCapacityAccepts};
  }
  return {std::to_string(bytes), ""};
}

Parsed parse_streaming(const std::string& s) {
  const auto comma = s.find(',');
  const std::string resident = s.substr(0, comma);
  const bool ring_given = comma != std::string::npos;
  const std::string ring = ring_given ? s.substr(comma + 1) : "0";
  if (!all_digits(resident) || !all_digits(ring) || resident.size() > 6 || ring.size() > 6) {
    return {"", "--activekv-streaming: '" + s +
                    "' is not RESIDENT[,RING] (two whole numbers: resident layers, ring buffers)"};
  }
  // The range checks (ring >= 2, fewer resident layers than the model has)
  // are the engine's, with the key named, when vLLM starts, as is the ring's
  // default where none is given. Reprinted: JSON numbers have no leading zeros.
  return {"{\"resident_layers\": " + std::to_string(std::stoi(resident)) +
              (ring_given ? ", \"ring_size\": " + std::to_string(std::stoi(ring)) : "") + "}",
          ""};
}

Parsed read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {"", "--activekv-config: cannot read " + path};
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  const auto first = json.find_first_not_of(" \t\r\n");
  const auto last = json.find_last_not_of(" \t\r\n");
  if (first == std::string::npos || json[first] != '{' || json[last] != '}') {
    return {"", "--activekv-config: " + path + " is not a JSON object"};
  }
  return {json.substr(first, last - first + 1), ""};
}

// The command line read into `out`; an exit status where the launcher stops
// here (0: help printed, 2: a usage error printed), nothing where vLLM starts.
std::optional<int> read_command_line(const char* program, int argc, char** argv, Request& out) {
  using Parser = Parsed (*)(const std::string&);
  const std::pair<const char*, std::pair<Parser, std::string Request::*>> flags[] = {
      {"--activekv-mode", {parse_mode, &Request::mode}},
      {"--activekv-capacity", {parse_capacity, &Request::capacity}},
      {"--activekv-streaming", {parse_streaming, &Request::streaming}},
      {"--activekv-config", {read_config_file, &Request::config_json}},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) out.vllm_args.emplace_back(argv[i]);
      break;
    }
    if (arg == "--help-activekv") {
      usage(program, "help");
      return 0;
    }
    if (arg == "--kv-transfer-config") {
      return usage(program, "--kv-transfer-config is set by activekv-serve; use its --activekv-* flags");
    }
    if (arg.rfind("--activekv", 0) != 0) {
      out.vllm_args.push_back(arg);
      continue;
    }
    const auto* flag =
        std::find_if(std::begin(flags), std::end(flags), [&](const auto& f) { return arg == f.first; });
    if (flag == std::end(flags)) return usage(program, "unknown flag " + arg);
    if (i + 1 >= argc) return usage(program, arg + " needs a value");
    const auto [parse, field] = flag->second;
    Parsed parsed = parse(argv[++i]);
    if (!parsed.problem.empty()) return usage(program, parsed.problem);
    out.*field = std::move(parsed.json);
  }
  return std::nullopt;
}

// vLLM's --kv-transfer-config: the config file's keys, then the flags'. Flags
// win: keys appended later override earlier ones in the JSON object (Python's
// json keeps the last of duplicate keys).
std::string transfer_config(const Request& r) {
  std::string extra = r.config_json.substr(0, r.config_json.size() - 1);  // open: no closing brace
  bool has_keys = extra.find_first_not_of(" \t\r\n", 1) != std::string::npos;
  auto add = [&](const std::string& key, const std::string& v) {
    extra += (has_keys ? ", " : "") + json_string(key) + ": " + v;
    has_keys = true;
  };
  if (!r.mode.empty()) add("mode", json_string(r.mode));
  if (!r.capacity.empty()) add("capacity_bytes", r.capacity);
  if (!r.streaming.empty()) add("streaming", r.streaming);
  extra += "}";
  return "{\"kv_connector\": \"ActiveKVHostConnector\", \"kv_role\": \"kv_both\", "
         "\"kv_connector_extra_config\": " +
         extra + "}";
}

// Runs vLLM's server module in the embedded interpreter with `args` as its
// sys.argv[1:]; returns its exit status.
int run_vllm_server(const std::vector<std::string>& server_args) {
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
  args.insert(args.end(), server_args.begin(), server_args.end());
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

}  // namespace

int main(int argc, char** argv) {
  Request request;
  if (const auto stop = read_command_line("activekv-serve", argc, argv, request)) return *stop;
  std::vector<std::string> server_args = request.vllm_args;
  server_args.push_back("--kv-transfer-config");
  server_args.push_back(transfer_config(request));
  return run_vllm_server(server_args);
}
