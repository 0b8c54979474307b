// A point's lines (text and RESULT json), its check, and one step's timeline.
#include "streaming_bench.h"

#include <cstdio>

namespace activekv::streaming_bench {

void report(const Bench& b, const std::string& part, const Model& m, const Step& s, double step_s,
            double attention_s, const std::string& method) {
  const double streamed_bytes =
      static_cast<double>(s.stage_blocks.size()) * static_cast<double>(m.streamed() * m.layer_bytes);
  const double writeback_bytes =
      static_cast<double>(s.writeback_blocks.size()) * static_cast<double>(m.streamed() * m.layer_bytes);
  const double bus_s = streamed_bytes / b.h2d_peak;
  const double bound_s = std::max(attention_s, bus_s);
  std::printf(
      "%-8s %-7s%s %-9s ctx %7lld x%-3lld prefix %6lld R %2lld %-12s  step %9.2f ms  bound %9.2f ms "
      "(attention %8.2f, bus %8.2f)  %.3fx  %7.2f GiB  run %.2f  copies %lld  host %.2f ms\n",
      part.c_str(), s.shape.kind.c_str(), s.shape.contiguous ? "*" : " ", homes_name(s.homes),
      static_cast<long long>(s.shape.context), static_cast<long long>(s.shape.batch),
      static_cast<long long>(s.shape.shared_prefix), static_cast<long long>(m.resident), method.c_str(),
      step_s * 1e3, bound_s * 1e3, attention_s * 1e3, bus_s * 1e3, step_s / bound_s,
      streamed_bytes / (1 << 30), s.mean_run, static_cast<long long>(s.copies), m.host_s * 1e3);
  std::printf(
      "RESULT {\"part\": \"%s\", \"kind\": \"%s\", \"context\": %lld, \"batch\": %lld, "
      "\"new_tokens\": %lld, \"shared_prefix\": %lld, \"block\": %lld, \"layers\": %lld, "
      "\"resident\": %lld, \"method\": \"%s\", \"step_ms\": %.4f, \"attention_ms\": %.4f, "
      "\"bus_ms\": %.4f, \"bound_ms\": %.4f, \"ratio\": %.5f, \"streamed_bytes\": %.0f, "
      "\"writeback_bytes\": %.0f, \"h2d_peak_gbs\": %.3f, \"mean_run_blocks\": %.3f, \"contiguous\": %s, "
      "\"homes\": \"%s\", \"host_ms\": %.4f, \"ring\": %lld, \"id_runs\": %lld, \"copies_per_layer\": %lld, "
      "\"back_to_back\": %lld}\n",
      part.c_str(), s.shape.kind.c_str(), static_cast<long long>(s.shape.context),
      static_cast<long long>(s.shape.batch), static_cast<long long>(s.shape.new_tokens),
      static_cast<long long>(s.shape.shared_prefix), static_cast<long long>(m.block),
      static_cast<long long>(kLayers), static_cast<long long>(m.resident), method.c_str(), step_s * 1e3,
      attention_s * 1e3, bus_s * 1e3, bound_s * 1e3, step_s / bound_s, streamed_bytes, writeback_bytes,
      b.h2d_peak / 1e9, s.mean_run, s.shape.contiguous ? "true" : "false", homes_name(s.homes),
      m.host_s * 1e3, static_cast<long long>(g_ring),
      static_cast<long long>(s.shape.contiguous ? 0 : g_id_runs), static_cast<long long>(s.copies),
      static_cast<long long>(g_back_to_back));
  std::fflush(stdout);
}

// The ring holds every staged block's home bytes after a step, and every
// written-back block's home holds the ring's bytes: checked on the last K
// streamed layers (the ring's occupants at the step's end), with random home
// bytes set just before the step.
bool verify_step(Model& m, const Step& s) {
  std::set<std::int64_t> written(s.writeback_blocks.begin(), s.writeback_blocks.end());
  std::vector<std::int64_t> sample;
  for (std::size_t i = 0; i < s.stage_blocks.size();
       i += std::max<std::size_t>(1, s.stage_blocks.size() / 256)) {
    if (!written.count(s.stage_blocks[i])) sample.push_back(s.stage_blocks[i]);
  }
  HostArena& homes = m.streamer->homes();
  auto home = [&](std::int64_t j, std::int64_t b) {
    return homes.run_view(j, SlotRun{s.row_of.at(b), 1, 0}).value().view({-1});
  };
  // Fresh content in the sampled homes (as the homes' codec writes it); then
  // the ring holds its decode and the written-back homes the ring's encode,
  // both as the CPU codec computes them.
  const auto shape = m.kv.front()[0].sizes().vec();
  for (std::int64_t l = kLayers - g_ring; l < kLayers; ++l) {
    for (const auto b : sample) {
      home(l - m.resident, b)
          .copy_(m.codec->encode(at::randn(shape).to(at::kBFloat16).unsqueeze(0)).view({-1}));
    }
  }
  m.run(s, true);
  bool ok = true;
  auto bytes_of = [](const at::Tensor& t) { return t.contiguous().view({-1}).view(at::kByte); };
  for (std::int64_t l = kLayers - g_ring; l < kLayers; ++l) {
    const at::Tensor ring = m.kv[static_cast<std::size_t>(l)];
    auto ring_block = [&](std::int64_t b) { return ring[b].cpu().unsqueeze(0); };
    for (const auto b : sample) {
      const at::Tensor staged = m.codec->decode(home(l - m.resident, b).unsqueeze(0));
      ok = ok && at::equal(bytes_of(ring_block(b)), bytes_of(staged));
    }
    for (const auto b : s.writeback_blocks) {
      ok = ok && at::equal(bytes_of(m.codec->encode(ring_block(b))), home(l - m.resident, b));
    }
  }
  std::printf(
      "verify: %s %s ctx %lld x%lld: %zu staged and %zu written-back blocks of the last %lld layers %s\n",
      s.shape.kind.c_str(), homes_name(s.homes), static_cast<long long>(s.shape.context),
      static_cast<long long>(s.shape.batch), sample.size(), s.writeback_blocks.size(),
      static_cast<long long>(g_ring),
      ok ? "bitwise equal to their homes (through the homes' codec)" : "DIFFER FROM THEIR HOMES");
  std::printf(
      "RESULT {\"part\": \"verify\", \"kind\": \"%s\", \"homes\": \"%s\", \"context\": %lld, "
      "\"batch\": %lld, \"ok\": %s}\n",
      s.shape.kind.c_str(), homes_name(s.homes), static_cast<long long>(s.shape.context),
      static_cast<long long>(s.shape.batch), ok ? "true" : "false");
  return ok;
}

// One streamed step's compute stream, timed by events: when each layer's
// compute could start (its staging landed and the layer before finished), how
// long the stream idled before it, and how long the compute took. Idle time is
// where the bus (or the host) kept the compute waiting.
void print_timeline(Model& m, const Step& s, const char* label) {
  std::vector<c10::Event> ev;
  std::vector<double> host;
  m.run(s, true, &ev, &host, std::max<std::int64_t>(1, g_back_to_back));
  const auto at = [&](std::size_t i) { return ev[0].elapsedTime(ev[i]); };  // ms since the step's start
  double idle = 0, compute = 0;
  std::string layers, host_layers;
  for (std::int64_t l = 0; l < kLayers; ++l) {
    const auto i = static_cast<std::size_t>(1 + 2 * l);
    const double start = at(i), end = at(i + 1), before = l == 0 ? 0.0 : at(i - 1);
    idle += start - before;
    compute += end - start;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.3f/%.3f/%.3f", l == 0 ? "" : " ", start, start - before, end - start);
    layers += buf;
    const auto h = static_cast<std::size_t>(4 * l);
    std::snprintf(buf, sizeof buf, "%s%.3f/%.3f/%.3f/%.3f", l == 0 ? "" : " ", host[h], host[h + 1] - host[h],
                  host[h + 2] - host[h + 1], host[h + 3] - host[h + 2]);
    host_layers += buf;
  }
  std::printf(
      "timeline %s %s ctx %lld x%lld: end %.3f ms, compute %.3f ms, compute idle %.3f ms (first layer "
      "waited %.3f ms)\n  start/idle/compute per layer (ms): %s\n"
      "  host: staged/compute/write-back/stage-ahead per layer (ms): %s\n",
      s.shape.kind.c_str(), label, static_cast<long long>(s.shape.context),
      static_cast<long long>(s.shape.batch), at(ev.size() - 1), compute, idle, at(1), layers.c_str(),
      host_layers.c_str());
}

}  // namespace activekv::streaming_bench
