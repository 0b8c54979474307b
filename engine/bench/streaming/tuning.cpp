#include "streaming_bench.h"

#include <cstdio>

namespace activekv::streaming_bench {

const std::vector<TuningRow>& tuning_rows() {
  using T = StreamingTuning;
  const StreamCopy gather = StreamCopy::kDeviceGather, batch = StreamCopy::kCopyEngineBatch;
  static const std::vector<TuningRow> rows{
      {"gather-p4", gather, [](T& t) { t.pieces = 4; }},
      {"gather-p8", gather, [](T& t) { t.pieces = 8; }},
      {"gather-p8-copy-hi", gather, [](T& t) { t.copy_high_priority = true; }},
      {"batch", batch, [](T&) {}},
      {"batch-one-call", batch, [](T& t) { t.batch_first_call = 0; }},
      {"batch-wb-on-copy", batch, [](T& t) { t.writeback_stream = false; }},
      {"batch-copy-hi", batch, [](T& t) { t.copy_high_priority = true; }},
      {"batch-issue-thread", batch, [](T& t) { t.issue_thread = true; }},
      {"batch-ahead-in-calls", batch, [](T& t) { t.ahead_in_one_call = false; }},
      {"batch-host-settle", batch, [](T& t) { t.settle_across_steps = false; }}};
  return rows;
}

// The device methods and their knobs at the points hardest to hold at the bus's
// bound: the gather's pieces and the copy stream's priority, the batch's
// write-back stream, its calls to the driver, the issue thread, and whether write-backs settle on the host
// each step (the default settles them across steps; the two differ only with
// --back-to-back) (the gather stream's priority stays
// high: the 2026-12-01 sweep found it changed no step by more than 1.5%).
void tuning(Bench& b) {
  const std::int64_t block = b.o.block;
  const std::int64_t num_blocks = 2 * cdiv(131072, block);
  Model m(block, num_blocks, 0);
  const StreamCopy chosen = m.streamer->copy_method();
  const StreamingTuning defaults = m.streamer->tuning();
  std::uint32_t seed = 21;
  for (const StepShape& shape : std::vector<StepShape>{{"decode", 16384, 1, 1, 0},
                                                       {"decode", 131072, 1, 1, 0},
                                                       {"decode", 16384 + block, 16, 1, 16384},
                                                       {"prefill", 16384, 1, 2048, 0},
                                                       {"prefill", 65536, 1, 2048, 0},
                                                       {"prefill", 131072, 1, 2048, 0}}) {
    if (!b.o.kinds.empty() && b.o.kinds.count(shape.kind) == 0) continue;
    if (!b.o.at_context(shape.context)) continue;
    const Step s = make_step(shape, block, num_blocks, seed++);
    const double attention = m.median_run(s, false, b.o.iters);
    for (const TuningRow& k : tuning_rows()) {
      if (!m.streamer->can_copy_by(k.method) || (!b.o.knobs.empty() && b.o.knobs.count(k.label) == 0))
        continue;
      StreamingTuning t = defaults;
      k.knobs(t);
      m.streamer->set_tuning(t);
      m.streamer->set_copy_method(k.method);
      const std::string label = std::string(k.label) + (g_attention ? "" : "/no-attention");
      report(b, "tuning", m, s, m.median_run(s, true, b.o.iters), attention, label);
      if (b.o.timeline) print_timeline(m, s, label.c_str());
    }
  }
  m.streamer->set_tuning(defaults);
  m.streamer->set_copy_method(chosen);
}

// 128k decode, batch 1: the step as resident layers grow (R = L: no streaming).
void resident_curve(Bench& b) {
  const std::int64_t ctx = 131072, block = b.o.block;
  const std::int64_t num_blocks = 2 * cdiv(ctx, block);  // half the blocks in use: scattered
  const StepShape shape{"decode", ctx, 1, 1, 0};
  double attention = 0;
  for (const std::int64_t r : {0, 4, 8, 12, 16, 20, 24, 28, 29, 32}) {
    free_pinned_cache();
    Model m(block, num_blocks, r);
    const Step s = make_step(shape, block, num_blocks, 99);
    if (attention == 0) attention = m.median_run(s, false, b.o.iters);
    const double step = r < kLayers ? m.median_run(s, true, b.o.iters) : m.median_run(s, false, b.o.iters);
    report(b, "curve", m, s, step, attention,
           r < kLayers ? copy_method_name(m.streamer->copy_method()) : "none");
    const double device_gib =
        static_cast<double>((r + std::min<std::int64_t>(g_ring, kLayers - r)) * num_blocks * m.layer_bytes) /
        (1 << 30);
    std::printf("CURVE {\"resident\": %lld, \"device_kv_gib\": %.3f, \"host_homes_gib\": %.3f}\n",
                static_cast<long long>(r), device_gib,
                static_cast<double>((kLayers - r) * num_blocks * m.layer_bytes) / (1 << 30));
  }
}

}  // namespace activekv::streaming_bench
