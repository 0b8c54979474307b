#include "streaming_bench.h"

#include <cstdio>

namespace activekv::streaming_bench {

// Decode at 16k..256k, batch 1, 4, 16 (distinct contexts); prefill chunks of
// 2048 at 16k..128k; batch 16 sharing one 16k prefix. One model for all:
// blocks for the largest point that fits the host budget.
void grid(Bench& b) {
  const std::int64_t block = b.o.block;
  std::vector<StepShape> shapes;
  for (const std::int64_t ctx : {16384, 65536, 131072, 262144}) {
    for (const std::int64_t batch : {1, 4, 16}) shapes.push_back({"decode", ctx, batch, 1, 0});
  }
  for (const std::int64_t ctx : {16384, 65536, 131072}) shapes.push_back({"prefill", ctx, 1, 2048, 0});
  shapes.push_back({"decode", 16384 + block, 16, 1, 16384});
  shapes.push_back({"decode", 131072, 1, 1, 0, true});
  shapes.push_back({"prefill", 65536, 1, 2048, 0, true});
  shapes.push_back({"prefill", 131072, 1, 2048, 0, true});
  const double bytes_per_token = static_cast<double>(kLayers * 2 * kKvHeads * kHeadSize * 2);
  const auto max_tokens = static_cast<std::int64_t>(b.o.host_gib * (1 << 30) / bytes_per_token);
  std::int64_t tokens = 0;
  std::vector<StepShape> fit;
  for (const auto& s : shapes) {
    if (!b.o.at_context(s.context)) continue;  // a part of the grid fits a device call of 10 minutes
    const std::int64_t need = s.batch * cdiv(s.context, block) * block;
    if (need > max_tokens) {
      std::printf(
          "skipped: %s ctx %lld x%lld needs %.0f GiB of homes, over --host-gib %.0f (the "
          "machine has 128 GiB)\n",
          s.kind.c_str(), static_cast<long long>(s.context), static_cast<long long>(s.batch),
          static_cast<double>(need) * bytes_per_token / (1 << 30), b.o.host_gib);
      continue;
    }
    tokens = std::max(tokens, need);
    fit.push_back(s);
  }
  // Some free blocks too: a server's cache is never exactly full.
  const std::int64_t num_blocks = cdiv(tokens, block) + cdiv(tokens, block) / 32;
  const auto t0 = std::chrono::steady_clock::now();
  Model m(block, num_blocks, 0);
  std::printf(
      "grid: %lld blocks of %lld tokens, homes %.1f GiB (allocated and zeroed in %.1f s), "
      "copy method %s\n",
      static_cast<long long>(num_blocks), static_cast<long long>(block),
      static_cast<double>(m.streamer->homes().num_slots() * kLayers * m.layer_bytes) / (1 << 30),
      seconds_since(t0), copy_method_name(m.streamer->copy_method()));
  std::uint32_t seed = 1;
  const StreamCopy chosen = m.streamer->copy_method();
  for (const auto& shape : fit) {
    // The same blocks under both home layouts, one after the other.
    const Step old = make_step(shape, block, num_blocks, seed, Homes::kBlockIds);
    const Step s = make_step(shape, block, num_blocks, seed++, Homes::kExtents);
    const double attention = m.median_run(s, false, b.o.iters);
    // Block-id homes as the engine copied them before extents (the device
    // gather), then extents by each device method.
    const auto run = [&](const Step& step, StreamCopy method) {
      m.streamer->set_copy_method(method);
      report(b, "grid", m, step, m.median_run(step, true, b.o.iters), attention, copy_method_name(method));
      if (!verify_step(m, step)) b.failed = true;
    };
    const StreamCopy first =
        m.streamer->can_copy_by(StreamCopy::kDeviceGather) ? StreamCopy::kDeviceGather : chosen;
    if (!shape.contiguous) run(old, first);
    for (const StreamCopy method : {StreamCopy::kDeviceGather, StreamCopy::kCopyEngineBatch}) {
      if (m.streamer->can_copy_by(method)) run(s, method);
    }
    if (!m.streamer->can_copy_by(StreamCopy::kDeviceGather))
      run(s, chosen);  // a CPU or a device without mapping
    // The engine's per-run copies at one point, for comparison.
    if (shape.kind == "decode" && shape.context == 16384 && shape.batch == 1 && shape.shared_prefix == 0 &&
        chosen != StreamCopy::kRuns) {
      m.streamer->set_copy_method(StreamCopy::kRuns);
      report(b, "grid", m, s, m.median_run(s, true, b.o.iters), attention, "runs");
    }
    m.streamer->set_copy_method(chosen);
  }
}

}  // namespace activekv::streaming_bench
