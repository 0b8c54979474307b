#include "streaming_bench.h"

#include <cstdio>

namespace activekv::streaming_bench {

const std::vector<CompressedVariant>& compressed_variants() {
  static const std::vector<CompressedVariant> variants{
      {"exact-homes", Mode::kExact, false, std::nullopt},
      {"compressed-aten-gather", Mode::kCompressed, false, StreamCopy::kDeviceGather},
      {"compressed-fused-gather", Mode::kCompressed, true, StreamCopy::kDeviceGather},
      {"compressed-aten-batch", Mode::kCompressed, false, StreamCopy::kCopyEngineBatch},
      {"compressed-fused-batch", Mode::kCompressed, true, StreamCopy::kCopyEngineBatch}};
  return variants;
}

namespace {

// Bitwise: the device's decode against the CPU's (the reference codec's
// bytes, checked by the parity gate), and the device's encode against the
// CPU's bytes, on random blocks.
void check_codec_on_device(const KVCodec& codec, std::int64_t block) {
  const at::Tensor blocks = at::randn({64, 2, block, kKvHeads, kHeadSize}).to(at::kBFloat16) * 3;
  const at::Tensor data = codec.encode(blocks);
  const at::Tensor on_cpu = codec.decode(data);
  const at::Tensor on_device = codec.decode(data.to(g_device)).cpu();
  const bool same = at::equal(on_cpu.view(at::kShort), on_device.view(at::kShort));
  const at::Tensor enc_device = codec.encode(blocks.to(g_device)).cpu();
  const at::Tensor q_diff = (enc_device.narrow(1, 0, blocks[0].numel()).view(at::kChar).to(at::kInt) -
                             data.narrow(1, 0, blocks[0].numel()).view(at::kChar).to(at::kInt))
                                .abs();
  std::printf(
      "compressed codec: device decode %s the CPU's bitwise (max |diff| %g); device encode "
      "%s the CPU's bytes (%lld of %lld int8 values differ, by at most %lld)\n",
      same ? "equals" : "DIFFERS FROM",
      (on_cpu.to(at::kFloat) - on_device.to(at::kFloat)).abs().max().item<double>(),
      at::equal(enc_device, data) ? "equals" : "DIFFERS FROM",
      static_cast<long long>(q_diff.ne(0).sum().item<std::int64_t>()), static_cast<long long>(q_diff.numel()),
      static_cast<long long>(q_diff.max().item<std::int64_t>()));
  std::printf("RESULT {\"part\": \"codec\", \"decode_bitwise\": %s, \"encode_bitwise\": %s}\n",
              same ? "true" : "false", at::equal(enc_device, data) ? "true" : "false");
}

// Compressed homes' tokens/s over exact homes' at one point.
void report_speedup(const char* label, const StepShape& shape, double speedup) {
  std::printf("%s: %s ctx %lld x%lld  %.3fx exact homes' tokens/s\n", label, shape.kind.c_str(),
              static_cast<long long>(shape.context), static_cast<long long>(shape.batch), speedup);
  std::printf(
      "RESULT {\"part\": \"compressed-speedup\", \"method\": \"%s\", \"kind\": \"%s\", \"context\": %lld, "
      "\"batch\": %lld, \"back_to_back\": %lld, \"speedup\": %.4f}\n",
      label, shape.kind.c_str(), static_cast<long long>(shape.context), static_cast<long long>(shape.batch),
      static_cast<long long>(g_back_to_back), speedup);
}

}  // namespace

// Compressed homes (StreamingConfig::homes): the homes hold the compressed
// codec (int8 + one fp32 scale per head row); the streamer's pieces carry the
// compressed rows over the bus and the copy stream decodes each into the ring.
// Each point twice on the same block ids and rows: exact homes, then
// compressed; each against its own bound, and compressed's speed-up.
void compressed(Bench& b) {
  const std::int64_t block = b.o.block;
  const std::vector<std::int64_t> shape{2, block, kKvHeads, kHeadSize};
  const auto codec = make_codec(Mode::kCompressed, shape, at::kBFloat16, kHeadSize);
  check_codec_on_device(*codec, block);
  std::vector<StepShape> shapes;
  for (const StepShape& point : std::vector<StepShape>{{"decode", 16384, 1, 1, 0},
                                                       {"decode", 65536, 1, 1, 0},
                                                       {"decode", 131072, 1, 1, 0},
                                                       {"decode", 131072, 4, 1, 0},
                                                       {"decode", 16384 + block, 16, 1, 16384},
                                                       {"prefill", 16384, 1, 2048, 0},
                                                       {"prefill", 131072, 1, 2048, 0}}) {
    if (b.o.at_context(point.context)) shapes.push_back(point);
  }
  if (shapes.empty()) {
    std::printf("compressed: no point at these --contexts\n");
    return;
  }
  std::int64_t tokens = 0;
  for (const auto& point : shapes)
    tokens = std::max(tokens, point.batch * cdiv(point.context, block) * block);
  const std::int64_t num_blocks = cdiv(tokens, block) + cdiv(tokens, block) / 32;
  std::vector<Step> steps;
  std::uint32_t seed = 31;
  for (const auto& point : shapes)
    steps.push_back(make_step(point, block, num_blocks, seed++, Homes::kExtents));
  std::vector<double> exact_step(steps.size()), attention(steps.size());
  std::unique_ptr<Model> compressed_model;
  for (const CompressedVariant& v : compressed_variants()) {
    const Mode homes = v.homes;
    if (homes != Mode::kExact && !b.o.variants.empty() && b.o.variants.count(v.label) == 0) continue;
    std::unique_ptr<Model> exact_model;
    if (homes == Mode::kExact) {
      free_pinned_cache();
      exact_model = std::make_unique<Model>(block, num_blocks, 0, homes);
    } else if (!compressed_model) {
      free_pinned_cache();
      compressed_model = std::make_unique<Model>(block, num_blocks, 0, homes);
    }
    Model& m = homes == Mode::kExact ? *exact_model : *compressed_model;
    StreamingTuning tuning = m.streamer->tuning();
    tuning.fused_codec = v.fused;
    m.streamer->set_tuning(tuning);
    if (v.fused && !m.streamer->has_fused_codec()) {
      std::printf("%s: no fused kernels here (%s)\n", v.label, m.streamer->fused_codec_missing().c_str());
      continue;
    }
    if (v.method && !m.streamer->can_copy_by(*v.method)) {
      std::printf("%s: this device cannot copy by %s\n", v.label, copy_method_name(*v.method));
      continue;
    }
    if (v.method) m.streamer->set_copy_method(*v.method);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (homes == Mode::kExact) attention[i] = m.median_run(steps[i], false, b.o.iters);
      const double step = m.median_run(steps[i], true, b.o.iters);
      report(b, "compressed", m, steps[i], step, attention[i], v.label);
      if (b.o.timeline) print_timeline(m, steps[i], v.label);
      if (homes == Mode::kExact) {
        exact_step[i] = step;
      } else {
        report_speedup(v.label, steps[i].shape, exact_step[i] / step);
      }
      if (!verify_step(m, steps[i])) b.failed = true;
      std::fflush(stdout);
    }
  }
}

}  // namespace activekv::streaming_bench
