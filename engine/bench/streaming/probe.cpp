#include "streaming_bench.h"

#include <cstdio>
#include <functional>
#include <numeric>
#include <random>

#ifdef ACTIVEKV_BENCH_PROFILE
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace activekv::streaming_bench {

// The raw copy paths for one layer of 128k scattered blocks: what a gather
// kernel reaches per element width, and the copy engine per run.
void probe(Bench& b) {
  const std::int64_t block = b.o.block, n = 131072 / block;
  const std::int64_t row = 2 * block * kKvHeads * kHeadSize * 2;
  const std::int64_t num_blocks = n + n / 32;
  HostArena homes(num_blocks, 1, row, /*pin=*/true, std::int64_t{256} << 20);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  ids.resize(static_cast<std::size_t>(n));
  std::sort(ids.begin(), ids.end());
  at::Tensor device_rows =
      at::empty({num_blocks, row}, at::TensorOptions().dtype(at::kByte).device(g_device));
  const double bytes = static_cast<double>(n * row);
  auto timed = [&](const std::function<void()>& fn) {
    std::vector<double> t;
    for (std::int64_t i = 0; i <= b.o.iters; ++i) {
      device_sync();
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      device_sync();
      if (i > 0) t.push_back(seconds_since(t0));
    }
    return median(t);
  };
  const auto runs = homes.runs(ids);
  const double t_runs = timed([&] {
    for (const auto& r : runs)
      device_rows.narrow(0, r.first, r.count).copy_(homes.run_view(0, r).value(), true);
  });
  std::printf("probe: copy engine, one copy per run (%zu runs)      %7.1f GB/s\n", runs.size(),
              bytes / t_runs / 1e9);
  for (const auto word : {at::kByte, at::kInt, at::kLong, at::kComplexDouble}) {
    const std::int64_t w = static_cast<std::int64_t>(c10::elementSize(word));
    std::vector<at::Tensor> alias;
    for (std::int64_t c = 0; c < homes.num_chunks(); ++c) {
      at::Tensor bytes_c = homes.chunk_view(0, c).value();
      alias.push_back(at::for_blob(bytes_c.data_ptr(), {bytes_c.size(0), row / w})
                          .options(at::TensorOptions().dtype(word).device(g_device))
                          .target_device(g_device)
                          .make_tensor());
    }
    std::vector<at::Tensor> local(static_cast<std::size_t>(homes.num_chunks()));
    {
      std::vector<std::vector<std::int64_t>> per(static_cast<std::size_t>(homes.num_chunks()));
      for (const auto id : ids)
        per[static_cast<std::size_t>(id / homes.slots_per_chunk())].push_back(id % homes.slots_per_chunk());
      for (std::size_t c = 0; c < per.size(); ++c) local[c] = at::tensor(per[c], at::kLong).to(g_device);
    }
    at::Tensor out = at::empty({n, row / w}, at::TensorOptions().dtype(word).device(g_device));
    const double t = timed([&] {
      std::int64_t off = 0;
      for (std::size_t c = 0; c < local.size(); ++c) {
        const std::int64_t k = local[c].size(0);
        if (k == 0) continue;
        at::Tensor o = out.narrow(0, off, k);
        at::index_select_out(o, alias[c], 0, local[c]);
        off += k;
      }
    });
    std::printf("probe: device gather of host rows, %2lld-byte words   %7.1f GB/s\n",
                static_cast<long long>(w), bytes / t / 1e9);
    std::printf(
        "RESULT {\"part\": \"probe\", \"word_bytes\": %lld, \"gbs\": %.3f, \"runs_gbs\": %.3f, "
        "\"h2d_peak_gbs\": %.3f}\n",
        static_cast<long long>(w), bytes / t / 1e9, bytes / t_runs / 1e9, b.h2d_peak / 1e9);
  }
}

#ifdef ACTIVEKV_BENCH_PROFILE
// One streaming step per shape under torch's profiler (kineto: CPU ops, the
// device's kernels and copies with their streams), saved as Chrome traces
// to read in a trace viewer (Perfetto, chrome://tracing).
void profile(Bench& b, const std::string& dir) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const std::int64_t block = b.o.block;
  const bool compressed = b.o.profile_homes == "compressed";
  // Compressed homes: the points where their device decode and encode meet a
  // compute-bound attention.
  const std::vector<StepShape> shapes =
      compressed ? std::vector<StepShape>{{"decode", 16384, 1, 1, 0, false},
                                          {"prefill", 16384, 1, 2048, 0, false},
                                          {"decode", 16384 + block, 16, 1, 16384, false}}
                 : std::vector<StepShape>{
                       {"decode", 16384, 1, 1, 0, false},     {"decode", 131072, 1, 1, 0, false},
                       {"prefill", 16384, 1, 2048, 0, false}, {"prefill", 65536, 1, 2048, 0, false},
                       {"decode", 131072, 1, 1, 0, true},     {"prefill", 65536, 1, 2048, 0, true}};
  const std::int64_t num_blocks = 2 * cdiv(131072, block);
  Model m(block, num_blocks, 0, compressed ? Mode::kCompressed : Mode::kExact);
  for (const auto& shape : shapes) {
    const Step s = make_step(shape, block, num_blocks, 11);
    m.run(s, true);
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    const double t = m.run(s, true);
    const std::string path = dir + "/trace-" + (compressed ? "compressed-" : "") + shape.kind + "-" +
                             std::to_string(shape.context) + "x" + std::to_string(shape.batch) +
                             (shape.contiguous ? "-contiguous" : "") + ".json";
    prof::disableProfiler()->save(path);
    std::printf("profile: %s ctx %lld step %.2f ms under the profiler -> %s\n", shape.kind.c_str(),
                static_cast<long long>(shape.context), t * 1e3, path.c_str());
  }
}
#endif

}  // namespace activekv::streaming_bench
