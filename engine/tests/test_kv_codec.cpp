#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "activekv/kv_codec.h"

namespace activekv {
namespace {

const std::vector<std::int64_t> kShape{2, 32, 64};  // K/V, tokens, heads * head_size
constexpr std::int64_t kHead = 32;

at::Tensor blocks(double scale, std::int64_t n = 5) {
  at::manual_seed(0);
  return (at::randn({n, 2, 32, 64}) * scale).to(at::kBFloat16);
}

TEST(KVCodec, ExactRoundTripIsBitwise) {
  const auto codec = make_codec(Mode::kExact, kShape, at::kBFloat16, kHead);
  const at::Tensor x = blocks(1.0);
  const at::Tensor data = codec->encode(x);
  EXPECT_EQ(data.scalar_type(), at::kByte);
  EXPECT_EQ(data.size(1), codec->layer_bytes());
  EXPECT_TRUE(at::equal(codec->decode(data.clone()).view(at::kShort), x.view(at::kShort)));
}

TEST(KVCodec, CompressedWithinStatedBound) {
  const auto codec = make_codec(Mode::kCompressed, kShape, at::kBFloat16, kHead);
  for (const double scale : {1e-3, 1.0, 300.0}) {
    const at::Tensor x = blocks(scale).to(at::kFloat).reshape({5, -1, kHead});
    const at::Tensor y = codec->decode(codec->encode(blocks(scale))).to(at::kFloat).reshape({5, -1, kHead});
    const at::Tensor amax = x.abs().amax({-1}, true);
    const at::Tensor bound = (amax / 254 + y.abs() * (1.0 / 256)) * (1 + 1e-6);
    EXPECT_TRUE((x - y).abs().le(bound).all().item<bool>()) << "scale " << scale;
  }
}

TEST(KVCodec, CompressedIsDeterministicAndAboutHalf) {
  const auto codec = make_codec(Mode::kCompressed, kShape, at::kBFloat16, kHead);
  const at::Tensor x = blocks(1.0);
  EXPECT_TRUE(at::equal(codec->encode(x), codec->encode(x.clone())));
  const double exact = static_cast<double>(codec_layer_bytes(Mode::kExact, 4096, 2, kHead));
  EXPECT_DOUBLE_EQ(static_cast<double>(codec->layer_bytes()) / exact, 0.5 + 2.0 / kHead);
}

TEST(KVCodec, CompressedRejectsUnsplittableLayout) {
  EXPECT_THROW(make_codec(Mode::kCompressed, {2, 32, 48}, at::kBFloat16, 32), std::invalid_argument);
}

}  // namespace
}  // namespace activekv
