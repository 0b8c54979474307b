#include <gtest/gtest.h>

#include "activekv/config.h"

namespace activekv {
namespace {

ConfigValue integer(std::int64_t v) { return {ConfigValue::Kind::kInt, v, "", "int", std::to_string(v), {}}; }
ConfigValue text(const std::string& s) {
  return {ConfigValue::Kind::kString, 0, s, "str", "'" + s + "'", {}};
}
ConfigValue table(std::map<std::string, ConfigValue> entries, const std::string& repr) {
  return {ConfigValue::Kind::kTable, 0, "", "dict", repr, std::move(entries)};
}
ConfigValue none() { return {ConfigValue::Kind::kNone, 0, "", "NoneType", "None", {}}; }

TEST(Config, DefaultsWhenEmpty) {
  const auto c = Config::parse({});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.value().mode, Mode::kExact);
  EXPECT_EQ(c.value().capacity_bytes, std::int64_t{1} << 30);
  EXPECT_EQ(c.value().store_threshold, 1);
}

TEST(Config, ReadsEveryKey) {
  const auto c = Config::parse({{"mode", text("compressed")},
                                {"capacity_bytes", integer(4096)},
                                {"store_threshold", integer(3)},
                                {"max_bytes_per_request", integer(100)},
                                {"store_blocks", text("prompt_and_decode")}});
  ASSERT_TRUE(c.ok()) << c.status().error();
  EXPECT_EQ(c.value().mode, Mode::kCompressed);
  EXPECT_EQ(c.value().capacity_bytes, 4096);
  EXPECT_EQ(c.value().store_threshold, 3);
  EXPECT_EQ(c.value().max_bytes_per_request, 100);
  EXPECT_EQ(c.value().store_blocks, StoreScope::kPromptAndDecode);
}

void expect_error(const std::map<std::string, ConfigValue>& extra, const std::string& fragment) {
  const auto c = Config::parse(extra);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().error_code(), ErrorCode::kInvalidConfig);
  EXPECT_NE(c.status().error().find(fragment), std::string::npos) << c.status().error();
}

TEST(Config, BadValuesNameTheKey) {
  expect_error({{"capacity", integer(1)}}, "unknown key 'capacity'");
  expect_error({{"capacity_bytes", text("1G")}}, "['capacity_bytes']: expected an integer, got str '1G'");
  expect_error({{"capacity_bytes", integer(-1)}}, "expected a positive number of bytes");
  expect_error({{"store_threshold", integer(0)}}, "['store_threshold']");
  expect_error({{"mode", text("lossy")}}, "accepted values: 'exact', 'compressed'");
  ConfigValue flag{ConfigValue::Kind::kBool, 0, "", "bool", "True", {}};
  expect_error({{"capacity_bytes", flag}}, "got bool True");
  expect_error({{"store_path", integer(3)}},
               "['store_path']: expected a file path (a non-empty string), got int 3");
  expect_error({{"store_path", text("")}}, "['store_path']: expected a file path");
}

TEST(Config, AsyncLoadsAreOffUnlessAsked) {
  EXPECT_EQ(Config::parse({}).value().async_load_min_tokens, 0);
  EXPECT_EQ(Config::parse({{"async_load_min_tokens", integer(16)}}).value().async_load_min_tokens, 16);
  const Config off_with_streaming =
      Config::parse({{"async_load_min_tokens", integer(0)},
                     {"streaming", table({{"resident_layers", integer(1)}}, "{'resident_layers': 1}")}})
          .value();
  EXPECT_EQ(off_with_streaming.async_load_min_tokens, 0);
}

TEST(Config, AsyncLoadsAreRefusedWithStreamingByName) {
  expect_error({{"async_load_min_tokens", integer(-1)}},
               "['async_load_min_tokens']: -1 is out of range; expected an integer >= 0");
  expect_error({{"async_load_min_tokens", integer(64)},
                {"streaming", table({{"resident_layers", integer(1)}}, "{'resident_layers': 1}")}},
               "['async_load_min_tokens']: 64 asks for asynchronous loads, but layer streaming lands loads "
               "inside the forward");
}

TEST(Config, AStorePathIsKeptAsGiven) {
  EXPECT_EQ(Config::parse({}).value().store_path, "");
  EXPECT_EQ(Config::parse({{"store_path", text("/dev/shm/activekv")}}).value().store_path,
            "/dev/shm/activekv");
}

TEST(Config, StreamingIsOffUnlessATableIsGiven) {
  EXPECT_FALSE(Config::parse({}).value().streaming);
  const auto off = Config::parse({{"streaming", none()}});
  ASSERT_TRUE(off.ok()) << off.status().error();
  EXPECT_FALSE(off.value().streaming);
  const auto defaults = Config::parse({{"streaming", table({}, "{}")}});
  ASSERT_TRUE(defaults.ok()) << defaults.status().error();
  ASSERT_TRUE(defaults.value().streaming);
  EXPECT_EQ(defaults.value().streaming->resident_layers, 0);
  EXPECT_EQ(defaults.value().streaming->ring_size, 2);
  const auto set = Config::parse(
      {{"streaming", table({{"resident_layers", integer(3)}, {"ring_size", integer(4)}}, "{...}")}});
  ASSERT_TRUE(set.ok()) << set.status().error();
  EXPECT_EQ(set.value().streaming->resident_layers, 3);
  EXPECT_EQ(set.value().streaming->ring_size, 4);
}

void expect_exact_error(const std::map<std::string, ConfigValue>& extra, const std::string& message) {
  const auto c = Config::parse(extra);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().error(), message);
}

TEST(Config, StreamingErrorsNameTheKeyInTheReferenceWords) {
  const std::string at = "kv_connector_extra_config['streaming']";
  expect_exact_error({{"streaming", integer(2)}},
                     at + ": expected a table {'resident_layers': R, 'ring_size': K}, got int 2");
  expect_exact_error({{"streaming", table({{"rings", integer(2)}}, "{'rings': 2}")}},
                     at + ": unknown key 'rings'; accepted keys: homes, resident_layers, ring_size");
  expect_exact_error({{"streaming", table({{"homes", text("int4")}}, "")}},
                     at + "['homes']: 'int4' is not accepted; accepted values: 'exact', 'compressed'");
  expect_exact_error({{"streaming", table({{"homes", integer(1)}, {"ring_size", integer(1)}}, "")}},
                     at + "['homes']: 1 is not accepted; accepted values: 'exact', 'compressed'");
  expect_exact_error({{"streaming", table({{"ring_size", text("2")}}, "")}},
                     at + "['ring_size']: expected an integer, got str '2'");
  expect_exact_error({{"streaming", table({{"ring_size", integer(1)}}, "")}},
                     at + "['ring_size']: 1 is out of range; expected an integer >= 2 (staging "
                          "buffers on the device)");
  expect_exact_error(
      {{"streaming", table({{"resident_layers", integer(-1)}, {"ring_size", integer(1)}}, "")}},
      at + "['resident_layers']: -1 is out of range; expected an integer >= 0 "
           "(layers kept on the device)");
  // Every other key is checked before the table, as in the reference.
  expect_exact_error({{"streaming", integer(2)}, {"store_threshold", integer(0)}},
                     "kv_connector_extra_config['store_threshold']: 0 is out of range; expected "
                     "an integer >= 1");
  expect_exact_error({{"bogus", integer(1)}},
                     "kv_connector_extra_config: unknown key 'bogus'; accepted keys: "
                     "async_load_min_tokens, capacity_bytes, fence_timeout_ms, max_bytes_per_request, mode, "
                     "store_blocks, store_path, store_threshold, streaming");
}

TEST(Config, ModesAreFoundByTheirNamesOnly) {
  EXPECT_EQ(mode_named("exact"), Mode::kExact);
  EXPECT_EQ(mode_named("compressed"), Mode::kCompressed);
  EXPECT_FALSE(mode_named("lossy"));
  EXPECT_FALSE(mode_named("Exact"));
  EXPECT_FALSE(mode_named(""));
  for (const auto& [name, mode] : kModes) EXPECT_STREQ(mode_name(mode), name);
}

TEST(Config, CapacityMustBeAPositiveNumberOfBytes) {
  EXPECT_TRUE(capacity_in_range(1));
  EXPECT_FALSE(capacity_in_range(0));
  EXPECT_FALSE(capacity_in_range(-1));
  expect_exact_error({{"capacity_bytes", integer(0)}},
                     "kv_connector_extra_config['capacity_bytes']: 0 is out of range; expected a "
                     "positive number of bytes");
}

Config with_capacity(std::int64_t bytes, Mode mode = Mode::kExact) {
  Config c;
  c.capacity_bytes = bytes;
  c.mode = mode;
  return c;
}

TEST(Config, TheStoreHoldsAsManyWholeBlocksAsTheCapacityBuys) {
  const HostMemory kHost{std::int64_t{1} << 40, "this host's memory"};
  EXPECT_EQ(with_capacity(1000).store_slots(100, kHost).value(), 10);
  EXPECT_EQ(with_capacity(1099).store_slots(100, kHost).value(), 10);  // a part block buys nothing
  EXPECT_EQ(with_capacity(100).store_slots(100, kHost).value(), 1);
}

TEST(Config, ACapacityBelowOneBlockIsRefusedNamingTheBlockSizeAndMode) {
  const auto slots =
      with_capacity(99, Mode::kCompressed).store_slots(100, {std::int64_t{1} << 40, "this host's memory"});
  ASSERT_FALSE(slots.ok());
  EXPECT_EQ(slots.status().error_code(), ErrorCode::kInvalidConfig);
  EXPECT_EQ(slots.status().error(),
            "kv_connector_extra_config['capacity_bytes']=99 holds no block; one block takes 100 "
            "bytes in compressed mode");
}

TEST(Config, ACapacityBeyondTheHostsMemoryIsRefused) {
  const HostMemory host{4096, "this host's memory"};
  EXPECT_TRUE(with_capacity(4096).store_slots(100, host).ok());  // all of it is allowed
  const auto slots = with_capacity(4097).store_slots(100, host);
  ASSERT_FALSE(slots.ok());
  EXPECT_EQ(slots.status().error_code(), ErrorCode::kInvalidConfig);
  EXPECT_EQ(slots.status().error(),
            "kv_connector_extra_config['capacity_bytes']=4097 exceeds this host's memory (4096 "
            "bytes); ask for less");
  // No block is checked first: a store too small says so, whatever the host.
  EXPECT_NE(
      with_capacity(50).store_slots(100, {10, "this host's memory"}).status().error().find("holds no block"),
      std::string::npos);
}

TEST(Config, ACapacityBeyondTheCgroupsLimitIsRefusedNamingItsFile) {
  const HostMemory limit{4096, "the memory limit of this process's cgroup, /sys/fs/cgroup/memory.max"};
  EXPECT_EQ(with_capacity(4097).store_slots(100, limit).status().error(),
            "kv_connector_extra_config['capacity_bytes']=4097 exceeds the memory limit of this process's "
            "cgroup, /sys/fs/cgroup/memory.max (4096 bytes); ask for less");
}

TEST(Config, ThisHostHasSomePhysicalMemory) { EXPECT_GT(physical_memory_bytes(), 0); }

}  // namespace
}  // namespace activekv
