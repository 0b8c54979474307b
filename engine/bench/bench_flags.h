// The benchmarks' command lines: `--name value` pairs, --help, and a clear
// error for a flag they do not know, a flag left without its value or a value
// that is not a number. A benchmark on a GPU takes minutes of a shared machine;
// a typo must stop it at once, not run the wrong measurement.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace activekv::bench {

// What a flag's handler throws for a value it cannot take.
struct BadFlag : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// `value` as a whole number of at least `least`.
inline std::int64_t whole_number(const std::string& flag, const std::string& value, std::int64_t least = 0) {
  std::size_t used = 0;
  std::int64_t n = 0;
  try {
    n = std::stoll(value, &used);
  } catch (const std::out_of_range&) {
    throw BadFlag(flag + " " + value + ": too large");
  } catch (const std::invalid_argument&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) throw BadFlag(flag + " " + value + ": not a whole number");
  if (n < least) throw BadFlag(flag + " " + value + ": must be at least " + std::to_string(least));
  return n;
}

// `value` as a finite number above zero.
inline double positive_number(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) throw BadFlag(flag + " " + value + ": not a number");
  if (!(x > 0) || !std::isfinite(x)) throw BadFlag(flag + " " + value + ": must be a finite number above 0");
  return x;
}

// `value` as a switch: 1 on, 0 off.
inline bool switch_on(const std::string& flag, const std::string& value) {
  if (value != "0" && value != "1") throw BadFlag(flag + " " + value + ": 1 (on) or 0 (off)");
  return value == "1";
}

// `value`, which must be one of `names`.
inline std::string one_of(const std::string& flag, const std::string& value,
                          const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (value == name) return value;
  }
  std::string known;
  for (const std::string& name : names) known += (known.empty() ? "" : ", ") + name;
  throw BadFlag(flag + " " + value + ": not one of " + known);
}

// A comma-separated list's parts, empty parts dropped; a list with none is
// refused (an empty --only would otherwise mean every part).
inline std::vector<std::string> parts(const std::string& flag, const std::string& value) {
  std::vector<std::string> out;
  std::stringstream ss(value);
  for (std::string part; std::getline(ss, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  if (out.empty()) throw BadFlag(flag + " '" + value + "': an empty list");
  return out;
}

// Hands each `--name value` pair to `take`, which returns false for a name it
// does not know and throws BadFlag for a value it cannot take. Returns the exit
// code when the program should stop: 0 after --help anywhere (the usage
// printed), 2 after a bad command line (what was wrong, then the usage, on
// stderr).
inline std::optional<int> parse_flags(
    int argc, char** argv, const char* usage,
    const std::function<bool(const std::string&, const std::string&)>& take) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", usage);
      return 0;
    }
  }
  const auto bad = [&](const std::string& error) {
    std::fprintf(stderr, "%s\n%s", error.c_str(), usage);
    return 2;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (name.rfind("--", 0) != 0) return bad("unexpected " + name + " (flags are --name value)");
    // A flag last, or followed by another flag, has no value: say so only for
    // a flag the program knows.
    const bool has_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
    try {
      if (!take(name, has_value ? argv[i + 1] : "")) return bad("unknown flag " + name);
      if (!has_value) return bad(name + ": no value given");
    } catch (const BadFlag& e) {
      return bad(has_value ? e.what() : name + ": no value given");
    }
  }
  return std::nullopt;
}

}  // namespace activekv::bench
