// The benchmarks' command lines (bench/bench_flags.h): a benchmark on a GPU
// takes minutes of a shared machine, so a bad flag must stop it, saying why.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench_flags.h"

namespace activekv::bench {
namespace {

struct Parsed {
  std::optional<int> stop;
  std::map<std::string, std::string> taken;
  std::string out, err;
};

// parse_flags over `args` with flags --iters (a whole number from 1),
// --kinds (decode or prefill), --timeline (a switch) and --name (any text).
Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "bench");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Parsed p;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  p.stop = parse_flags(static_cast<int>(argv.size()), argv.data(), "usage: bench [--iters 3]\n",
                       [&](const std::string& k, const std::string& v) {
                         if (k == "--iters")
                           p.taken[k] = std::to_string(whole_number(k, v, 1));
                         else if (k == "--kinds")
                           for (const auto& part : parts(k, v))
                             p.taken[k] += one_of(k, part, {"decode", "prefill"});
                         else if (k == "--timeline")
                           p.taken[k] = switch_on(k, v) ? "on" : "off";
                         else if (k == "--name")
                           p.taken[k] = v;
                         else
                           return false;
                         return true;
                       });
  p.out = testing::internal::GetCapturedStdout();
  p.err = testing::internal::GetCapturedStderr();
  return p;
}

TEST(BenchFlags, EveryPairIsTakenAndTheRunGoesOn) {
  const Parsed p = parse({"--iters", "5", "--kinds", "decode,,prefill", "--timeline", "0", "--name", "-x"});
  EXPECT_FALSE(p.stop);
  EXPECT_EQ(p.taken,
            (std::map<std::string, std::string>{
                {"--iters", "5"}, {"--kinds", "decodeprefill"}, {"--timeline", "off"}, {"--name", "-x"}}));
  EXPECT_EQ(p.err, "");
}

TEST(BenchFlags, HelpAnywherePrintsTheUsageAndStopsWithZero) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--iters", "5", "--help", "--frob"}, {"--name", "--help"}, {"-h"}}) {
    const Parsed p = parse(args);
    EXPECT_EQ(p.stop, 0) << args.back();
    EXPECT_EQ(p.out, "usage: bench [--iters 3]\n");
    EXPECT_TRUE(p.taken.empty()) << "nothing is taken before --help is seen";
  }
}

TEST(BenchFlags, ABadCommandLineStopsWithTwoSayingWhatWasWrong) {
  const std::map<std::vector<std::string>, std::string> said = {
      {{"--frob", "1"}, "unknown flag --frob"},
      {{"--iters", "5", "--frob"}, "unknown flag --frob"},
      {{"--iters", "5", "--kinds"}, "--kinds: no value given"},
      {{"--name", "--iters", "5"}, "--name: no value given"},
      {{"--kinds", "decode", "prefill"}, "unexpected prefill (flags are --name value)"},
      {{"--iters=5"}, "unknown flag --iters=5"},
      {{"--iters", "5x"}, "--iters 5x: not a whole number"},
      {{"--iters", ""}, "--iters : not a whole number"},
      {{"--iters", "0"}, "--iters 0: must be at least 1"},
      {{"--iters", "99999999999999999999"}, "--iters 99999999999999999999: too large"},
      {{"--kinds", "decode,decoding"}, "--kinds decoding: not one of decode, prefill"},
      {{"--kinds", ","}, "--kinds ',': an empty list"},
      {{"--timeline", "yes"}, "--timeline yes: 1 (on) or 0 (off)"},
  };
  for (const auto& [args, error] : said) {
    const Parsed p = parse(args);
    EXPECT_EQ(p.stop, 2) << error;
    EXPECT_EQ(p.err, error + "\nusage: bench [--iters 3]\n");
    EXPECT_EQ(p.out, "");
  }
}

TEST(BenchFlags, NumbersAboveZero) {
  EXPECT_DOUBLE_EQ(positive_number("--host-gib", "1.5"), 1.5);
  EXPECT_THROW(positive_number("--host-gib", "0"), BadFlag);
  EXPECT_THROW(positive_number("--host-gib", "nan"), BadFlag);
  EXPECT_THROW(positive_number("--host-gib", "inf"), BadFlag);
  EXPECT_THROW(positive_number("--host-gib", "1e400"), BadFlag);
  EXPECT_THROW(positive_number("--host-gib", "2 GiB"), BadFlag);
}

}  // namespace
}  // namespace activekv::bench
