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
      throw std::invalid_argument(
          "compressed mode needs the innermost KV dim (" +
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

  at::Tensor encode(const at::Tensor& blocks) const override {
    const auto n = blocks.size(0);
    const at::Tensor rows = blocks.reshape({n, rows_, head_size_}).to(kScaleType);
    const at::Tensor amax = rows.abs().amax({-1}, /*keepdim=*/true);
    // A tensor divisor on the blocks' device: CUDA divides by a CPU scalar as
    // a multiply by its reciprocal, which rounds differently from the CPU's
    // (and the reference's) true division.
    const at::Tensor qmax = at::scalar_tensor(kQMax, amax.options());
    const at::Tensor scale = at::where(amax > 0, amax / qmax, at::ones_like(amax));
    const at::Tensor q = at::round(rows / scale).clamp_(-kQMax, kQMax).to(at::kChar);
    return at::cat({q.reshape({n, -1}).view(at::kByte), scale.reshape({n, -1}).view(at::kByte)},
                   1);
  }

  at::Tensor decode(const at::Tensor& data) const override {
    const auto n = data.size(0);
    const at::Tensor q = data.slice(1, 0, qbytes_).contiguous().view(at::kChar);
    const at::Tensor scale = data.slice(1, qbytes_).contiguous().view(kScaleType);
    const at::Tensor rows = q.reshape({n, rows_, head_size_}).to(kScaleType) * scale.unsqueeze(-1);
    return rows.to(dtype_).reshape(with_batch(n, shape_));
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

std::unique_ptr<KVCodec> make_codec(Mode mode, std::vector<std::int64_t> block_shape,
                                    at::ScalarType dtype, std::int64_t head_size) {
  if (mode == Mode::kExact) return std::make_unique<ExactCodec>(std::move(block_shape), dtype);
  return std::make_unique<CompressedCodec>(std::move(block_shape), dtype, head_size);
}

}  // namespace activekv
