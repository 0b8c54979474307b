#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>

#include <vector>

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

// The codec's operations (fewer kernels than the reference's) give the
// reference's bytes: codec.py's encode and decode written out here, on the
// CPU; on the accelerator where there is one, against the same CPU bytes.
TEST(KVCodec, CompressedBytesAreTheReferenceOperations) {
  const auto codec = make_codec(Mode::kCompressed, kShape, at::kBFloat16, kHead);
  at::Tensor x = blocks(1.0, 6);
  x[1].mul_(300);
  x[2].zero_();
  x[3].flatten().narrow(0, 0, kHead).copy_(at::arange(kHead) - 3.5);  // ties, with amax 127 below
  x[3].flatten()[0] = 127;
  const at::Tensor rows = x.reshape({6, -1, kHead}).to(at::kFloat);
  const at::Tensor amax = rows.abs().amax({-1}, true);
  const at::Tensor scale =
      at::where(amax > 0, amax / at::scalar_tensor(127.0, amax.options()), at::ones_like(amax));
  const at::Tensor q = at::round(rows / scale).clamp_(-127, 127).to(at::kChar);
  const at::Tensor want =
      at::cat({q.reshape({6, -1}).view(at::kByte), scale.reshape({6, -1}).view(at::kByte)}, 1);
  const at::Tensor want_decoded = (q.to(at::kFloat) * scale).to(at::kBFloat16).reshape(x.sizes());
  std::vector<c10::Device> devices{c10::Device("cpu")};
  if (const auto type = at::accelerator::getAccelerator(false); type && at::accelerator::deviceCount() > 0) {
    devices.emplace_back(*type, 0);
  }
  for (const auto& device : devices) {
    const at::Tensor data = codec->encode(x.to(device)).cpu();
    EXPECT_TRUE(at::equal(data, want)) << device;
    EXPECT_TRUE(
        at::equal(codec->decode(want.to(device)).cpu().view(at::kShort), want_decoded.view(at::kShort)))
        << device;
    // Rows that do not start 4-aligned (the scales cannot be read in place).
    const at::Tensor shifted =
        at::cat({at::zeros({6, 1}, want.options()), want}, 1).narrow(1, 1, want.size(1));
    EXPECT_TRUE(
        at::equal(codec->decode(shifted.to(device)).cpu().view(at::kShort), want_decoded.view(at::kShort)))
        << device;
  }
}

TEST(KVCodec, CompressedRejectsUnsplittableLayout) {
  EXPECT_THROW(make_codec(Mode::kCompressed, {2, 32, 48}, at::kBFloat16, 32), std::invalid_argument);
}

}  // namespace
}  // namespace activekv
