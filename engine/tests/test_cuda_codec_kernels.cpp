// The fused codec kernels (src/cuda_codec_kernels.h) against the codec, bit
// for bit, on a CUDA device: both vector widths, rounding ties, zero rows,
// tiny and large values, scattered block ids.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <string>

#include "activekv/kv_codec.h"
#include "cuda_codec_kernels.h"

namespace activekv {
namespace {

struct Shape {
  std::int64_t tokens, width, head;  // a block: [2, tokens, width]
};

at::Tensor some_blocks(std::int64_t n, const Shape& s) {
  at::manual_seed(3);
  at::Tensor x = at::randn({n, 2, s.tokens, s.width});
  x[0].mul_(1e-3);
  x[1].mul_(300);
  x[2].zero_();  // every row's amax 0: scale 1
  // Ties for the rounding: with amax 127 the scale is 1, so 2.5 and -3.5
  // must round half to even (2, -4).
  x[3].flatten().narrow(0, 0, s.head).copy_(at::arange(s.head) - 3.5);
  x[3].flatten()[0] = 127;
  x[3].flatten()[1] = 2.5;
  return x.to(at::kBFloat16);
}

void expect_kernels_equal_codec(const Shape& s) {
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  const c10::DeviceGuard on_device(cuda);
  const std::vector<std::int64_t> block{2, s.tokens, s.width};
  const auto codec = make_codec(Mode::kCompressed, block, at::kBFloat16, s.head);
  const std::int64_t elems = 2 * s.tokens * s.width;
  std::string why;
  const auto kernels = detail::CudaCodecKernels::load(0, {elems, s.head, codec->layer_bytes()}, why);
  ASSERT_NE(kernels, nullptr) << why;
  const std::int64_t n = 9, ring_blocks = 40;
  const at::Tensor x = some_blocks(n, s);
  const at::Tensor ids = at::tensor(std::vector<std::int64_t>{31, 2, 17, 5, 38, 0, 22, 9, 13}, at::kLong);
  // The legacy default stream (null): it orders after torch's copies on the
  // current stream, torch's default, and before the .cpu() reads.
  void* const on_stream = nullptr;
  // Encode: ring blocks ids -> rows, against the CPU codec's bytes.
  at::Tensor ring = at::zeros({ring_blocks, 2, s.tokens, s.width}, at::TensorOptions().dtype(at::kBFloat16));
  ring.index_copy_(0, ids, x);
  const at::Tensor ring_dev = ring.to(cuda), ids_dev = ids.to(cuda);
  at::Tensor rows = at::empty({n, codec->layer_bytes()}, at::TensorOptions().dtype(at::kByte).device(cuda));
  kernels->encode_gather(ring_dev.data_ptr(), ids_dev.data_ptr<std::int64_t>(), n, rows.data_ptr(),
                         on_stream);
  const at::Tensor want_rows = codec->encode(x);
  EXPECT_TRUE(at::equal(rows.cpu(), want_rows)) << "encode, head " << s.head;
  // Decode: rows -> ring blocks ids, against the CPU codec's decode; other
  // blocks untouched.
  at::Tensor out =
      at::full({ring_blocks, 2, s.tokens, s.width}, 7, at::TensorOptions().dtype(at::kBFloat16).device(cuda));
  const at::Tensor src = want_rows.to(cuda);
  kernels->decode_scatter(src.data_ptr(), n, ids_dev.data_ptr<std::int64_t>(), out.data_ptr(), on_stream);
  at::Tensor want =
      at::full({ring_blocks, 2, s.tokens, s.width}, 7, at::TensorOptions().dtype(at::kBFloat16));
  want.index_copy_(0, ids, codec->decode(want_rows));
  EXPECT_TRUE(at::equal(out.cpu().view(at::kShort), want.view(at::kShort))) << "decode, head " << s.head;
}

// An accelerator test (CI runs it where torch has an accelerator): on CUDA the
// kernels against the codec; on another accelerator the kernels are not there
// and say why, so the codec's ATen operations serve.
TEST(CudaCodecKernelsOnAccelerator, EqualTheCodecBitwiseOrSayWhyMissing) {
  if (!at::hasCUDA()) {
    std::string why;
    EXPECT_EQ(detail::CudaCodecKernels::load(0, {2 * 16 * 64, 32, 2 * 16 * 64 + 2 * 16 * 2 * 4}, why),
              nullptr);
    EXPECT_FALSE(why.empty());
    return;
  }
  expect_kernels_equal_codec({16, 256, 128});  // 16-byte loads (Llama-3-8B's head size)
  expect_kernels_equal_codec({16, 64, 32});
  expect_kernels_equal_codec({16, 64, 8});  // a head of 8: one element a thread
}

}  // namespace
}  // namespace activekv
