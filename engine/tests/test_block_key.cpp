#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "activekv/block_key.h"

namespace activekv {
namespace {

std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const auto b : d) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

TEST(Sha256, MatchesFipsVectors) {
  EXPECT_EQ(hex(Sha256::of("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(Sha256::of("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(Sha256::of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(chunk);
  EXPECT_EQ(hex(million.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

class BlockKeys : public ::testing::Test {
 protected:
  ModelIdentity id{"tiny", "bfloat16", 4, 2, 32, 4, 1};
  std::vector<std::int64_t> tokens{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26};

  std::vector<BlockKey> keys(const std::vector<std::int64_t>& t,
                             const std::optional<std::string>& salt = std::nullopt) {
    std::vector<BlockKey> out;
    extend_block_keys(id.digest(), salt, t, id.block_size, out);
    return out;
  }
};

TEST_F(BlockKeys, OneKeyPerFullBlock) {
  EXPECT_EQ(keys(tokens).size(), 4u);  // 17 tokens, block size 4
}

TEST_F(BlockKeys, KeyCommitsToEveryEarlierToken) {
  auto changed = tokens;
  changed[5] += 1;  // block 1
  const auto a = keys(tokens), b = keys(changed);
  EXPECT_EQ(a[0], b[0]);
  for (std::size_t i = 1; i < a.size(); ++i) EXPECT_NE(a[i], b[i]);
}

TEST_F(BlockKeys, SaltAndIdentitySeparateKeys) {
  const auto base = keys(tokens);
  EXPECT_NE(keys(tokens, "a")[0], base[0]);
  EXPECT_NE(keys(tokens, "")[0], base[0]);  // an empty salt is still a salt
  id.tp_size = 2;
  EXPECT_NE(keys(tokens)[0], base[0]);
}

TEST_F(BlockKeys, ExtendingMatchesHashingFromScratch) {
  std::vector<BlockKey> grown;
  extend_block_keys(id.digest(), std::nullopt, std::span(tokens).first(8), id.block_size, grown);
  extend_block_keys(id.digest(), std::nullopt, tokens, id.block_size, grown);
  EXPECT_EQ(grown, keys(tokens));
}

}  // namespace
}  // namespace activekv
