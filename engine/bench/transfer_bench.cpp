// Block-batch transfer benchmark for the worker side on an accelerator.
//
// Prints, for N scattered blocks of B bytes per layer: the pinned-copy peak of
// one large copy each way and both ways at once (measured in the same run),
// the naive loop (one copy per block), and the engine's save path, load path
// and loads overlapped with saves, each as GB/s and as a share of its peak.
//
//   transfer_bench [--device cuda] [--blocks 2048] [--layers 4] [--iters 5]
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "activekv/host_arena.h"
#include "activekv/worker_side.h"

using namespace activekv;

namespace {

struct Options {
  std::string device = "cuda";
  std::int64_t blocks = 2048;
  std::int64_t layers = 4;
  std::int64_t iters = 5;
};

c10::Device g_device{c10::DeviceType::CUDA, 0};

void device_sync() {
  c10::impl::VirtualGuardImpl impl(g_device.type());
  c10::Event e(g_device.type());
  e.record(impl.getStream(g_device));
  e.synchronize();
}

// Mean seconds of `fn` over `iters` runs after one warm-up; `done` waits for
// all the work the runs started.
double timed(std::int64_t iters, const std::function<void()>& fn,
             const std::function<void()>& done = device_sync) {
  fn();
  done();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < iters; ++i) fn();
  done();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(iters);
}

void row(const char* what, double bytes, double seconds, double peak_gbs) {
  const double gbs = bytes / seconds / 1e9;
  if (peak_gbs > 0) {
    std::printf("%-44s %9.1f GB/s  %6.1f%% of peak\n", what, gbs, 100.0 * gbs / peak_gbs);
  } else {
    std::printf("%-44s %9.1f GB/s\n", what, gbs);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--device") o.device = argv[i + 1];
    else if (k == "--blocks") o.blocks = std::stoll(argv[i + 1]);
    else if (k == "--layers") o.layers = std::stoll(argv[i + 1]);
    else if (k == "--iters") o.iters = std::stoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  g_device = c10::Device(o.device);
  // 64 KiB per block per layer: K and V of 32 tokens x 8 heads x 64, bf16.
  KVLayout layout;
  for (std::int64_t l = 0; l < o.layers; ++l) layout.layer_names.push_back("layer." + std::to_string(l));
  layout.block_size = 32;
  layout.num_kv_heads = 8;
  layout.head_size = 64;
  layout.dtype = at::kBFloat16;
  const std::int64_t device_blocks = 4 * o.blocks;
  const double block_bytes = static_cast<double>(layout.layer_bytes(Mode::kExact));
  const double batch_bytes = block_bytes * static_cast<double>(o.blocks * o.layers);
  std::printf("device %s, %lld blocks x %lld layers x %.0f KiB = %.0f MiB per batch\n",
              o.device.c_str(), static_cast<long long>(o.blocks), static_cast<long long>(o.layers),
              block_bytes / 1024, batch_bytes / (1 << 20));

  const auto dev = at::TensorOptions().device(g_device).dtype(at::kByte);
  const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);

  // Peaks: one large pinned copy each way, and both ways at once.
  const std::int64_t big = std::int64_t{1} << 30;
  at::Tensor d_big = at::empty({big}, dev), h_big = at::empty({big}, pinned);
  at::Tensor d_big2 = at::empty({big}, dev), h_big2 = at::empty({big}, pinned);
  const double h2d_peak = big / timed(o.iters, [&] { d_big.copy_(h_big, true); }) / 1e9;
  const double d2h_peak = big / timed(o.iters, [&] { h_big.copy_(d_big, true); }) / 1e9;
  c10::impl::VirtualGuardImpl impl(g_device.type());
  const c10::Stream s1 = impl.getStreamFromGlobalPool(g_device, false);
  const c10::Stream s2 = impl.getStreamFromGlobalPool(g_device, false);
  const double both_peak =
      2.0 * big / timed(o.iters, [&] {
        c10::Event start(g_device.type());
        start.record(impl.getStream(g_device));
        start.block(s1);
        start.block(s2);
        {
          const c10::StreamGuard g(s1);
          d_big.copy_(h_big, true);
        }
        {
          const c10::StreamGuard g(s2);
          h_big2.copy_(d_big2, true);
        }
        c10::Event e1(g_device.type()), e2(g_device.type());
        e1.record(s1);
        e2.record(s2);
        e1.block(impl.getStream(g_device));
        e2.block(impl.getStream(g_device));
      }) / 1e9;
  // The same bytes both ways, cut in pieces of the arena's run sizes.
  for (const std::int64_t piece : {std::int64_t{2} << 20, std::int64_t{16} << 20, std::int64_t{64} << 20}) {
    const double t = timed(o.iters, [&] {
      c10::Event start(g_device.type());
      start.record(impl.getStream(g_device));
      start.block(s1);
      start.block(s2);
      for (std::int64_t off = 0; off < big; off += piece) {
        {
          const c10::StreamGuard g(s1);
          d_big.narrow(0, off, piece).copy_(h_big.narrow(0, off, piece), true);
        }
        const c10::StreamGuard g(s2);
        h_big2.narrow(0, off, piece).copy_(d_big2.narrow(0, off, piece), true);
      }
      c10::Event e1(g_device.type()), e2(g_device.type());
      e1.record(s1);
      e2.record(s2);
      e1.block(impl.getStream(g_device));
      e2.block(impl.getStream(g_device));
    });
    std::printf("raw: both ways in %3lld MiB pieces (sum)            %9.1f GB/s\n",
                static_cast<long long>(piece >> 20), 2.0 * big / t / 1e9);
    const double t_d2h = timed(o.iters, [&] {
      for (std::int64_t off = 0; off < big; off += piece) {
        h_big.narrow(0, off, piece).copy_(d_big.narrow(0, off, piece), true);
      }
    });
    std::printf("raw: device->host in %3lld MiB pieces                %9.1f GB/s\n",
                static_cast<long long>(piece >> 20), big / t_d2h / 1e9);
  }
  std::printf("%-44s %9.1f GB/s\n", "peak: pinned host->device, 1 GiB", h2d_peak);
  std::printf("%-44s %9.1f GB/s\n", "peak: pinned device->host, 1 GiB", d2h_peak);
  std::printf("%-44s %9.1f GB/s\n", "peak: both directions at once (sum)", both_peak);
  d_big = d_big2 = h_big = h_big2 = at::Tensor();

  // The paged KV cache and a scattered set of blocks.
  std::unordered_map<std::string, at::Tensor> kv;
  for (const auto& n : layout.layer_names) {
    kv[n] = at::randn({device_blocks, 2, 32, 512}, at::TensorOptions().device(g_device)).to(at::kBFloat16);
  }
  std::vector<std::int64_t> ids(static_cast<std::size_t>(device_blocks));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  const std::vector<std::int64_t> save_ids(ids.begin(), ids.begin() + o.blocks);
  const std::vector<std::int64_t> load_ids(ids.begin() + o.blocks, ids.begin() + 2 * o.blocks);

  // Naive: one copy per block per layer into pinned host memory.
  at::Tensor host = at::empty({o.blocks * o.layers, static_cast<std::int64_t>(block_bytes)}, pinned);
  const double naive = timed(o.iters, [&] {
    std::int64_t r = 0;
    for (const auto& n : layout.layer_names) {
      for (const auto b : save_ids) host[r++].copy_(kv[n][b].view({-1}).view(at::kByte), true);
    }
  });
  row("naive: one device->host copy per block", batch_bytes, naive, d2h_peak);
  // What the engine's save path can reach at best: per layer one gather and
  // one copy of the batch into pinned memory, no bookkeeping, no fences.
  const at::Tensor save_index = at::tensor(save_ids, at::kLong).to(g_device);
  const double ideal = timed(o.iters, [&] {
    std::int64_t l = 0;
    for (const auto& n : layout.layer_names) {
      host.narrow(0, o.blocks * l++, o.blocks)
          .copy_(kv[n].index_select(0, save_index).view({o.blocks, -1}).view(at::kByte), true);
    }
  });
  row("bound: gather + one copy per layer, no engine", batch_bytes, ideal, d2h_peak);
  // The same into a host arena: one copy per run of consecutive slots, so
  // the chunk size sets the copy size (chunk / layers per layer and run).
  for (const std::int64_t chunk_mib : {64, 256, 1024}) {
    HostArena arena(o.blocks, o.layers, static_cast<std::int64_t>(block_bytes), /*pin=*/true,
                    chunk_mib << 20);
    std::vector<std::int64_t> slots(static_cast<std::size_t>(o.blocks));
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int64_t>(i);
    const auto runs = arena.runs(slots);
    const double t = timed(o.iters, [&] {
      std::int64_t l = 0;
      for (const auto& n : layout.layer_names) {
        const at::Tensor gathered = kv[n].index_select(0, save_index).view({o.blocks, -1}).view(at::kByte);
        for (const auto& run : runs) {
          arena.run_view(l, run).value().copy_(gathered.narrow(0, run.offset, run.count), true);
        }
        ++l;
      }
    });
    char what[96];
    std::snprintf(what, sizeof what, "arena: %lld MiB chunks, %zu copies per layer",
                  static_cast<long long>(chunk_mib), runs.size());
    row(what, batch_bytes, t, d2h_peak);
  }

  // Slots: the load set, then three sets the saves rotate over (a step's
  // save may still be in flight during the next two steps, and the scheduler
  // never plans a save into a slot whose save is in flight).
  constexpr std::int64_t kSaveSets = 3;
  Config config;
  config.capacity_bytes = static_cast<std::int64_t>(batch_bytes) * (1 + kSaveSets);
  WorkerSide worker(config, layout, (1 + kSaveSets) * o.blocks, 0);
  if (const Status s = worker.register_kv_caches(kv); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.error().c_str());
    return 1;
  }
  auto key = [](std::int64_t i) {
    BlockKey k{};
    std::memcpy(k.data(), &i, sizeof(i));
    return k;
  };
  StepPlan seed, loads;
  for (std::int64_t i = 0; i < o.blocks; ++i) {
    seed.saves.push_back(SaveOp{i, load_ids[static_cast<std::size_t>(i)], key(i), "r"});
    loads.loads.push_back(LoadOp{i, load_ids[static_cast<std::size_t>(i)], key(i)});
  }
  std::vector<StepPlan> saves(kSaveSets), both(kSaveSets, loads);
  for (std::int64_t set = 0; set < kSaveSets; ++set) {
    for (std::int64_t i = 0; i < o.blocks; ++i) {
      const std::int64_t slot = (1 + set) * o.blocks + i;
      const SaveOp op{slot, save_ids[static_cast<std::size_t>(i)], key(slot), "r"};
      saves[static_cast<std::size_t>(set)].saves.push_back(op);
      both[static_cast<std::size_t>(set)].saves.push_back(op);
    }
  }
  // Plans are moved into the worker, as the bindings do with vLLM's; their
  // copies are made before the clock starts.
  auto moved = [&](const std::vector<StepPlan>& rotation) {
    auto copies = std::make_shared<std::vector<StepPlan>>();
    for (std::int64_t i = 0; i <= o.iters; ++i) {
      copies->push_back(rotation[static_cast<std::size_t>(i) % rotation.size()]);
    }
    return [copies, i = std::size_t{0}]() mutable { return std::move((*copies)[i++]); };
  };
  auto run_step = [&](StepPlan plan) {
    worker.bind_plan(std::move(plan));
    worker.start_load();
    for (const auto& n : layout.layer_names) {
      worker.wait_for_layer_load(n);
      worker.save_layer(n, kv[n]);
    }
    worker.wait_for_save();  // the copies to the host run on into the next step
    worker.clear_plan();
    worker.take_report();
  };
  // A step's copies to the host may outlive it: a measurement ends when they landed.
  auto landed = [&] {
    worker.drain_saves();
    device_sync();
  };
  // Every slot set once before any clock: the arena pins its chunks on first
  // use, which is not what a step costs.
  run_step(seed);
  for (const auto& plan : saves) run_step(plan);
  landed();
  row("engine: save batch (gather, one copy, seal)", batch_bytes,
      timed(o.iters, [&, next = moved(saves)]() mutable { run_step(next()); }, landed), d2h_peak);
  {  // Where a save step's host time goes: planning, issuing the layers, waiting.
    using clock = std::chrono::steady_clock;
    double bind_s = 0, issue_s = 0, wait_s = 0, drain_s = 0, layer_max_s = 0;
    auto next = moved(saves);
    for (std::int64_t i = 0; i < o.iters; ++i) {
      StepPlan plan = next();
      device_sync();
      const auto t0 = clock::now();
      worker.bind_plan(std::move(plan));
      const auto t1 = clock::now();
      for (const auto& n : layout.layer_names) {
        const auto l0 = clock::now();
        worker.save_layer(n, kv[n]);
        layer_max_s = std::max(layer_max_s, std::chrono::duration<double>(clock::now() - l0).count());
      }
      const auto t2 = clock::now();
      worker.wait_for_save();
      const auto t3 = clock::now();
      worker.clear_plan();
      worker.drain_saves();
      const auto t4 = clock::now();
      worker.take_report();
      bind_s += std::chrono::duration<double>(t1 - t0).count();
      issue_s += std::chrono::duration<double>(t2 - t1).count();
      wait_s += std::chrono::duration<double>(t3 - t2).count();
      drain_s += std::chrono::duration<double>(t4 - t3).count();
    }
    const double k = 1e3 / static_cast<double>(o.iters);
    std::printf("save step, host time: bind %.3f ms, issue %lld layers %.3f ms (slowest layer %.3f ms), "
                "wait_for_save %.3f ms; then until the copies landed %.3f ms\n", bind_s * k,
                static_cast<long long>(o.layers), issue_s * k, layer_max_s * 1e3, wait_s * k, drain_s * k);
  }
  row("engine: load batch (one copy, scatter)", batch_bytes,
      timed(o.iters, [&, next = moved({loads})]() mutable { run_step(next()); }, landed), h2d_peak);
  row("engine: loads and saves overlapped (sum)", 2 * batch_bytes,
      timed(o.iters, [&, next = moved(both)]() mutable { run_step(next()); }, landed), both_peak);
  // The same work, with no save waiting for a load of its layer (in vLLM a
  // layer's save follows its attention, which follows its load).
  auto run_independent = [&](StepPlan plan) {
    worker.bind_plan(std::move(plan));
    worker.start_load();
    for (const auto& n : layout.layer_names) worker.save_layer(n, kv[n]);
    for (const auto& n : layout.layer_names) worker.wait_for_layer_load(n);
    worker.wait_for_save();
    worker.clear_plan();
    worker.take_report();
  };
  row("engine: loads and saves, saves not gated (sum)", 2 * batch_bytes,
      timed(o.iters, [&, next = moved(both)]() mutable { run_independent(next()); }, landed), both_peak);
  const Telemetry t = worker.take_telemetry();
  std::printf("quarantined fences: %lld\n", static_cast<long long>(t.get(Counter::kQuarantinedFences)));
  return 0;
}
