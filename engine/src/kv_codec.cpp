#include "activekv/kv_codec.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace activekv {
namespace {

constexpr double kQMax = 127.0;
constexpr auto kScaleType = at::kFloat;

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::vector<std::int64_t> with_batch(std::int64_t n, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> out{n};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

class ExactCodec final : public KVCodec {
 public:
  ExactCodec(std::vector<std::int64_t> shape, at::ScalarType dtype)
      : shape_(std::move(shape)), dtype_(dtype), numel_(numel_of(shape_)) {}

  std::int64_t layer_bytes() const override {
    return codec_layer_bytes(Mode::kExact, numel_, static_cast<std::int64_t>(c10::elementSize(dtype_)), 0);
  }
  at::Tensor encode(const at::Tensor& blocks) const override {
    return blocks.reshape({blocks.size(0), numel_}).view(at::kByte);
  }
  at::Tensor decode(const at::Tensor& data) const override {
    return data.view(dtype_).reshape(with_batch(data.size(0), shape_));
  }

 private:
  std::vector<std::int64_t> shape_;
  at::ScalarType dtype_;
  std::int64_t numel_;
};

class CompressedCodec final : public KVCodec {
 public:
  CompressedCodec(std::vector<std::int64_t> shape, at::ScalarType dtype, std::int64_t head_size)
      : shape_(std::move(shape)), dtype_(dtype), head_size_(head_size) {
    if (shape_.empty() || shape_.back() % head_size_ != 0) {
      throw std::invalid_argument("compressed mode needs the innermost KV dim (" +
                                  std::to_string(shape_.empty() ? 0 : shape_.back()) +
                                  ") to be a multiple of head_size (" + std::to_string(head_size_) + ")");
    }
    qbytes_ = numel_of(shape_);
    rows_ = qbytes_ / head_size_;
  }

  std::int64_t layer_bytes() const override {
    return codec_layer_bytes(Mode::kCompressed, qbytes_, static_cast<std::int64_t>(c10::elementSize(dtype_)),
                             head_size_);
  }

  // The reference's operations with fewer kernels and the same bytes. On
  // CUDA, streaming uses fused kernels instead (cuda_codec_kernels.h).
  at::Tensor encode(const at::Tensor& blocks) const override {
    const auto n = blocks.size(0);
    const at::Tensor rows = blocks.reshape({n, rows_, head_size_}).to(kScaleType);
    const at::Tensor amax = rows.abs().amax({-1}, /*keepdim=*/true);
    // A tensor divisor on the blocks' device: CUDA divides by a CPU scalar as
    // a multiply by its reciprocal, which rounds differently from the CPU's
    // (and the reference's) true division.
    const at::Tensor qmax = at::scalar_tensor(kQMax, amax.options());
    const at::Tensor scale = at::where(amax > 0, amax / qmax, at::Scalar(1.0));
    // The int8 and the scales land in their bytes of the row (no cat).
    at::Tensor out = at::empty({n, qbytes_ + rows_ * static_cast<std::int64_t>(sizeof(float))},
                               blocks.options().dtype(at::kByte));
    out.slice(1, 0, qbytes_)
        .view(at::kChar)
        .view({n, rows_, head_size_})
        .copy_(at::round(rows / scale).clamp_(-kQMax, kQMax));
    out.slice(1, qbytes_).view(kScaleType).view({n, rows_, 1}).copy_(scale);
    return out;
  }

  at::Tensor decode(const at::Tensor& data) const override {
    const auto n = data.size(0);
    // The scales are read as floats in place: each row's must start 4-aligned.
    const bool aligned = data.stride(0) % 4 == 0 && data.storage_offset() % 4 == 0;
    const at::Tensor bytes = aligned ? data : data.clone(at::MemoryFormat::Contiguous);
    const at::Tensor q = bytes.slice(1, 0, qbytes_).view(at::kChar).view({n, rows_, head_size_});
    const at::Tensor scale = bytes.slice(1, qbytes_).view(kScaleType).unsqueeze(-1);
    // One kernel: int8 x float multiplied in float, rounded once into the KV
    // dtype, as the reference's widen, multiply, narrow.
    at::Tensor out = at::empty(with_batch(n, shape_), data.options().dtype(dtype_));
    at::Tensor out_rows = out.view({n, rows_, head_size_});
    at::mul_out(out_rows, q, scale);
    return out;
  }

 private:
  std::vector<std::int64_t> shape_;
  at::ScalarType dtype_;
  std::int64_t head_size_;
  std::int64_t qbytes_ = 0;
  std::int64_t rows_ = 0;
};

}  // namespace

std::int64_t codec_layer_bytes(Mode mode, std::int64_t block_numel, std::int64_t itemsize,
                               std::int64_t head_size) {
  if (mode == Mode::kExact) return block_numel * itemsize;
  return block_numel + (block_numel / head_size) * static_cast<std::int64_t>(sizeof(float));
}

std::unique_ptr<KVCodec> make_codec(Mode mode, std::vector<std::int64_t> block_shape, at::ScalarType dtype,
                                    std::int64_t head_size) {
  if (mode == Mode::kExact) return std::make_unique<ExactCodec>(std::move(block_shape), dtype);
  return std::make_unique<CompressedCodec>(std::move(block_shape), dtype, head_size);
}

}  // namespace activekv
