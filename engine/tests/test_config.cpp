#include <gtest/gtest.h>

#include "activekv/config.h"

namespace activekv {
namespace {

ConfigValue integer(std::int64_t v) {
  return {ConfigValue::Kind::kInt, v, "", "int", std::to_string(v)};
}
ConfigValue text(const std::string& s) {
  return {ConfigValue::Kind::kString, 0, s, "str", "'" + s + "'"};
}

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
  ConfigValue flag{ConfigValue::Kind::kBool, 0, "", "bool", "True"};
  expect_error({{"capacity_bytes", flag}}, "got bool True");
}

}  // namespace
}  // namespace activekv
