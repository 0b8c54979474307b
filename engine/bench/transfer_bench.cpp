// Block-batch transfer benchmark for the worker side on an accelerator.
//
// Prints, for N scattered blocks of B bytes per layer: the pinned-copy peak of
// one large copy each way and both ways at once (measured in the same run),
// the naive loop (one copy per block), and the engine's save path, load path
// and loads overlapped with saves, each as GB/s and as a share of its peak.
//
//   transfer_bench [--device cuda] [--blocks 2048] [--layers 4] [--iters 5]   (--help: kUsage)
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
#include <unordered_map>
#include <variant>
#include <vector>

#include "activekv/host_arena.h"
#include "bench_device.h"
#include "bench_flags.h"
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

void device_sync() { bench::sync_current_stream(g_device); }

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

constexpr const char* kUsage =
    "usage: transfer_bench [--device cuda] [--blocks 2048] [--layers 4] [--iters 5]\n";

// The options, or the exit code when the run should stop: 0 after --help, 2
// after saying what was wrong with the command line or that no accelerator
// named by --device is usable here.
std::variant<Options, int> parse_options(int argc, char** argv) {
  Options o;
  const auto stop = bench::parse_flags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
    if (k == "--device")
      o.device = v;
    else if (k == "--blocks")
      o.blocks = bench::whole_number(k, v, 1);
    else if (k == "--layers")
      o.layers = bench::whole_number(k, v, 1);
    else if (k == "--iters")
      o.iters = bench::whole_number(k, v, 1);
    else
      return false;
    return true;
  });
  if (stop) return *stop;
  if (const std::string problem = bench::accelerator_problem(o.device); !problem.empty()) {
    std::fprintf(stderr, "%s\n", problem.c_str());
    return 2;
  }
  return o;
}

// 64 KiB per block per layer: K and V of 32 tokens x 8 heads x 64, bf16.
KVLayout bench_layout(std::int64_t layers) {
  KVLayout layout;
  for (std::int64_t l = 0; l < layers; ++l) layout.layer_names.push_back("layer." + std::to_string(l));
  layout.block_size = 32;
  layout.num_kv_heads = 8;
  layout.head_size = 64;
  layout.dtype = at::kBFloat16;
  return layout;
}

at::TensorOptions on_device() { return at::TensorOptions().device(g_device).dtype(at::kByte); }
at::TensorOptions pinned() { return at::TensorOptions().dtype(at::kByte).pinned_memory(true); }

// ---- the bus's peaks: large pinned copies, no engine ---------------------------

struct Peaks {
  double h2d = 0;   // pinned host->device, GB/s
  double d2h = 0;   // pinned device->host
  double both = 0;  // both directions at once (sum)
};

// 1 GiB each way, two buffers a side (the two directions never share bytes),
// and two streams of the device's pool. Freed before the KV cache is made.
class PeakBuffers {
 public:
  static constexpr std::int64_t kBytes = std::int64_t{1} << 30;

  PeakBuffers()
      : d_(at::empty({kBytes}, on_device())),
        h_(at::empty({kBytes}, pinned())),
        d2_(at::empty({kBytes}, on_device())),
        h2_(at::empty({kBytes}, pinned())),
        impl_(g_device.type()),
        s1_(impl_.getStreamFromGlobalPool(g_device, false)),
        s2_(impl_.getStreamFromGlobalPool(g_device, false)) {}
  PeakBuffers(const PeakBuffers&) = delete;
  PeakBuffers& operator=(const PeakBuffers&) = delete;

  void to_device() { d_.copy_(h_, true); }
  void to_host() { h_.copy_(d_, true); }
  // to_host in copies of `piece` bytes.
  void to_host_in(std::int64_t piece) {
    for (std::int64_t off = 0; off < kBytes; off += piece) {
      h_.narrow(0, off, piece).copy_(d_.narrow(0, off, piece), true);
    }
  }
  // Host->device on one stream and device->host on the other at once, in
  // copies of `piece` bytes: both start after the current stream's work,
  // which then waits for both.
  void both_ways_in(std::int64_t piece) {
    c10::Event start(g_device.type());
    start.record(impl_.getStream(g_device));
    start.block(s1_);
    start.block(s2_);
    for (std::int64_t off = 0; off < kBytes; off += piece) {
      {
        const c10::StreamGuard g(s1_);
        d_.narrow(0, off, piece).copy_(h_.narrow(0, off, piece), true);
      }
      const c10::StreamGuard g(s2_);
      h2_.narrow(0, off, piece).copy_(d2_.narrow(0, off, piece), true);
    }
    c10::Event e1(g_device.type()), e2(g_device.type());
    e1.record(s1_);
    e2.record(s2_);
    e1.block(impl_.getStream(g_device));
    e2.block(impl_.getStream(g_device));
  }

 private:
  at::Tensor d_, h_, d2_, h2_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream s1_, s2_;
};

// One 1 GiB copy each way, and one each way at once.
Peaks measure_peaks(std::int64_t iters, PeakBuffers& b) {
  constexpr double kBig = static_cast<double>(PeakBuffers::kBytes);
  Peaks p;
  p.h2d = kBig / timed(iters, [&] { b.to_device(); }) / 1e9;
  p.d2h = kBig / timed(iters, [&] { b.to_host(); }) / 1e9;
  p.both = 2.0 * kBig / timed(iters, [&] { b.both_ways_in(PeakBuffers::kBytes); }) / 1e9;
  return p;
}

// The same bytes both ways, and device->host alone, cut in pieces of the
// arena's run sizes.
void measure_pieces(std::int64_t iters, PeakBuffers& b) {
  constexpr double kBig = static_cast<double>(PeakBuffers::kBytes);
  for (const std::int64_t piece : {std::int64_t{2} << 20, std::int64_t{16} << 20, std::int64_t{64} << 20}) {
    const double t = timed(iters, [&] { b.both_ways_in(piece); });
    std::printf("raw: both ways in %3lld MiB pieces (sum)            %9.1f GB/s\n",
                static_cast<long long>(piece >> 20), 2.0 * kBig / t / 1e9);
    const double t_d2h = timed(iters, [&] { b.to_host_in(piece); });
    std::printf("raw: device->host in %3lld MiB pieces                %9.1f GB/s\n",
                static_cast<long long>(piece >> 20), kBig / t_d2h / 1e9);
  }
}

void print_peaks(const Peaks& p) {
  std::printf("%-44s %9.1f GB/s\n", "peak: pinned host->device, 1 GiB", p.h2d);
  std::printf("%-44s %9.1f GB/s\n", "peak: pinned device->host, 1 GiB", p.d2h);
  std::printf("%-44s %9.1f GB/s\n", "peak: both directions at once (sum)", p.both);
}

// ---- a batch of scattered blocks ----------------------------------------------------

// The paged KV cache (4x the batch's blocks, random values) and two disjoint
// scattered sets of its block ids, a batch each: the saves' and the loads'.
struct Batch {
  const Options& o;
  const KVLayout& layout;
  std::unordered_map<std::string, at::Tensor> kv;
  std::vector<std::int64_t> save_ids, load_ids;
  double block_bytes;  // one block of one layer
  double batch_bytes;  // every layer of o.blocks blocks

  Batch(const Options& options, const KVLayout& kv_layout)
      : o(options),
        layout(kv_layout),
        block_bytes(static_cast<double>(kv_layout.layer_bytes(Mode::kExact))),
        batch_bytes(block_bytes * static_cast<double>(options.blocks * options.layers)) {}

  void make_cache() {
    const std::int64_t device_blocks = 4 * o.blocks;
    for (const auto& n : layout.layer_names) {
      kv[n] = at::randn({device_blocks, 2, 32, 512}, at::TensorOptions().device(g_device)).to(at::kBFloat16);
    }
    std::vector<std::int64_t> ids(static_cast<std::size_t>(device_blocks));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
    save_ids.assign(ids.begin(), ids.begin() + o.blocks);
    load_ids.assign(ids.begin() + o.blocks, ids.begin() + 2 * o.blocks);
  }
  // The save set's blocks of one layer, gathered on the device: a row each.
  at::Tensor gathered(const std::string& layer, const at::Tensor& index) {
    return kv[layer].index_select(0, index).view({o.blocks, -1}).view(at::kByte);
  }
};

// Naive: one copy per block per layer into pinned host memory (`host`: a row
// per block and layer).
void measure_naive(Batch& b, at::Tensor& host, const Peaks& peaks) {
  const double naive = timed(b.o.iters, [&] {
    std::int64_t r = 0;
    for (const auto& n : b.layout.layer_names) {
      for (const auto id : b.save_ids) host[r++].copy_(b.kv[n][id].view({-1}).view(at::kByte), true);
    }
  });
  row("naive: one device->host copy per block", b.batch_bytes, naive, peaks.d2h);
}

// What the engine's save path can reach at best: per layer one gather and
// one copy of the batch into pinned memory, no bookkeeping, no fences.
void measure_gather_bound(Batch& b, const at::Tensor& save_index, at::Tensor& host, const Peaks& peaks) {
  const double ideal = timed(b.o.iters, [&] {
    std::int64_t l = 0;
    for (const auto& n : b.layout.layer_names) {
      host.narrow(0, b.o.blocks * l++, b.o.blocks).copy_(b.gathered(n, save_index), true);
    }
  });
  row("bound: gather + one copy per layer, no engine", b.batch_bytes, ideal, peaks.d2h);
}

// The same into a host arena: one copy per run of consecutive slots, so the
// chunk size sets the copy size (chunk / layers per layer and run).
void measure_arena_chunks(Batch& b, const at::Tensor& save_index, const Peaks& peaks) {
  for (const std::int64_t chunk_mib : {64, 256, 1024}) {
    HostArena arena(b.o.blocks, b.o.layers, static_cast<std::int64_t>(b.block_bytes), /*pin=*/true,
                    chunk_mib << 20);
    std::vector<std::int64_t> slots(static_cast<std::size_t>(b.o.blocks));
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int64_t>(i);
    const auto runs = arena.runs(slots);
    const double t = timed(b.o.iters, [&] {
      std::int64_t l = 0;
      for (const auto& n : b.layout.layer_names) {
        const at::Tensor gathered = b.gathered(n, save_index);
        for (const auto& run : runs) {
          arena.run_view(l, run).value().copy_(gathered.narrow(0, run.offset, run.count), true);
        }
        ++l;
      }
    });
    char what[96];
    std::snprintf(what, sizeof what, "arena: %lld MiB chunks, %zu copies per layer",
                  static_cast<long long>(chunk_mib), runs.size());
    row(what, b.batch_bytes, t, peaks.d2h);
  }
}

// ---- the engine: WorkerSide's steps over the batch ---------------------------------

// The worker and the step plans the measurements rotate over. Slots: the load
// set, then three sets the saves rotate over (a step's save may still be in
// flight during the next two steps, and the scheduler never plans a save into
// a slot whose save is in flight).
struct EngineSteps {
  static constexpr std::int64_t kSaveSets = 3;

  Batch& b;
  WorkerSide worker;
  StepPlan seed, loads;
  std::vector<StepPlan> saves, both;

  explicit EngineSteps(Batch& batch)
      : b(batch), worker(config_for(batch), batch.layout, (1 + kSaveSets) * batch.o.blocks, 0) {
    for (std::int64_t i = 0; i < b.o.blocks; ++i) {
      seed.saves.push_back(SaveOp{i, b.load_ids[static_cast<std::size_t>(i)], key(i), "r"});
      loads.loads.push_back(LoadOp{i, b.load_ids[static_cast<std::size_t>(i)], key(i)});
    }
    saves.resize(kSaveSets);
    both.assign(kSaveSets, loads);
    for (std::int64_t set = 0; set < kSaveSets; ++set) {
      for (std::int64_t i = 0; i < b.o.blocks; ++i) {
        const std::int64_t slot = (1 + set) * b.o.blocks + i;
        const SaveOp op{slot, b.save_ids[static_cast<std::size_t>(i)], key(slot), "r"};
        saves[static_cast<std::size_t>(set)].saves.push_back(op);
        both[static_cast<std::size_t>(set)].saves.push_back(op);
      }
    }
  }
  EngineSteps(const EngineSteps&) = delete;
  EngineSteps& operator=(const EngineSteps&) = delete;

  // Every slot set once before any clock: the arena pins its chunks on first
  // use, which is not what a step costs.
  void warm_up() {
    run_step(seed);
    for (const auto& plan : saves) run_step(plan);
    landed();
  }

  // A step as vLLM runs it, each layer's save after its load; `gated` false:
  // the same work, with no save waiting for a load of its layer (in vLLM a
  // layer's save follows its attention, which follows its load).
  void run_step(StepPlan plan, bool gated = true) {
    worker.bind_plan(std::move(plan));
    worker.start_load();
    for (const auto& n : b.layout.layer_names) {
      if (gated) worker.wait_for_layer_load(n);
      worker.save_layer(n, b.kv[n]);
    }
    if (!gated) {
      for (const auto& n : b.layout.layer_names) worker.wait_for_layer_load(n);
    }
    worker.wait_for_save();  // the copies to the host run on into the next step
    worker.clear_plan();
    worker.take_report();
  }
  // A step's copies to the host may outlive it: a measurement ends when they landed.
  void landed() {
    worker.drain_saves();
    device_sync();
  }

  // Plans are moved into the worker, as the bindings do with vLLM's; their
  // copies (the warm-up's and one per run) are made before the clock starts.
  std::function<StepPlan()> moved(const std::vector<StepPlan>& rotation) const {
    auto copies = std::make_shared<std::vector<StepPlan>>();
    for (std::int64_t i = 0; i <= b.o.iters; ++i) {
      copies->push_back(rotation[static_cast<std::size_t>(i) % rotation.size()]);
    }
    return [copies, i = std::size_t{0}]() mutable { return std::move((*copies)[i++]); };
  }
  // Mean seconds of a step over `rotation`'s plans, each run until its copies landed.
  double time_steps(const std::vector<StepPlan>& rotation, bool gated = true) {
    return timed(
        b.o.iters, [this, gated, next = moved(rotation)] { run_step(next(), gated); }, [this] { landed(); });
  }

 private:
  static Config config_for(const Batch& batch) {
    Config config;
    config.capacity_bytes = static_cast<std::int64_t>(batch.batch_bytes) * (1 + kSaveSets);
    return config;
  }
  static BlockKey key(std::int64_t i) {
    BlockKey k{};
    std::memcpy(k.data(), &i, sizeof(i));
    return k;
  }
};

void measure_engine_saves(EngineSteps& e, const Peaks& peaks) {
  row("engine: save batch (gather, one copy, seal)", e.b.batch_bytes, e.time_steps(e.saves), peaks.d2h);
}

// Where a save step's host time goes: planning, issuing the layers, waiting.
void measure_save_step_host_time(EngineSteps& e) {
  using clock = std::chrono::steady_clock;
  const Options& o = e.b.o;
  WorkerSide& worker = e.worker;
  double bind_s = 0, issue_s = 0, wait_s = 0, drain_s = 0, layer_max_s = 0;
  auto next = e.moved(e.saves);
  for (std::int64_t i = 0; i < o.iters; ++i) {
    StepPlan plan = next();
    device_sync();
    const auto t0 = clock::now();
    worker.bind_plan(std::move(plan));
    const auto t1 = clock::now();
    for (const auto& n : e.b.layout.layer_names) {
      const auto l0 = clock::now();
      worker.save_layer(n, e.b.kv[n]);
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
  std::printf(
      "save step, host time: bind %.3f ms, issue %lld layers %.3f ms (slowest layer %.3f ms), "
      "wait_for_save %.3f ms; then until the copies landed %.3f ms\n",
      bind_s * k, static_cast<long long>(o.layers), issue_s * k, layer_max_s * 1e3, wait_s * k, drain_s * k);
}

void measure_engine_loads(EngineSteps& e, const Peaks& peaks) {
  row("engine: load batch (one copy, scatter)", e.b.batch_bytes, e.time_steps({e.loads}), peaks.h2d);
}

void measure_engine_overlapped(EngineSteps& e, const Peaks& peaks) {
  row("engine: loads and saves overlapped (sum)", 2 * e.b.batch_bytes, e.time_steps(e.both), peaks.both);
}

void measure_engine_not_gated(EngineSteps& e, const Peaks& peaks) {
  row("engine: loads and saves, saves not gated (sum)", 2 * e.b.batch_bytes,
      e.time_steps(e.both, /*gated=*/false), peaks.both);
}

}  // namespace

int main(int argc, char** argv) {
  const auto options = parse_options(argc, argv);
  if (const int* stop = std::get_if<int>(&options)) return *stop;
  const Options& o = std::get<Options>(options);
  g_device = c10::Device(o.device);
  const KVLayout layout = bench_layout(o.layers);
  Batch batch(o, layout);
  std::printf("device %s, %lld blocks x %lld layers x %.0f KiB = %.0f MiB per batch\n", o.device.c_str(),
              static_cast<long long>(o.blocks), static_cast<long long>(o.layers), batch.block_bytes / 1024,
              batch.batch_bytes / (1 << 20));

  Peaks peaks;
  {
    PeakBuffers buffers;
    peaks = measure_peaks(o.iters, buffers);
    measure_pieces(o.iters, buffers);
  }
  print_peaks(peaks);

  batch.make_cache();
  at::Tensor host = at::empty({o.blocks * o.layers, static_cast<std::int64_t>(batch.block_bytes)}, pinned());
  measure_naive(batch, host, peaks);
  const at::Tensor save_index = at::tensor(batch.save_ids, at::kLong).to(g_device);
  measure_gather_bound(batch, save_index, host, peaks);
  measure_arena_chunks(batch, save_index, peaks);

  EngineSteps engine(batch);
  if (const Status s = engine.worker.register_kv_caches(batch.kv); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.error().c_str());
    return 1;
  }
  engine.warm_up();
  measure_engine_saves(engine, peaks);
  measure_save_step_host_time(engine);
  measure_engine_loads(engine, peaks);
  measure_engine_overlapped(engine, peaks);
  measure_engine_not_gated(engine, peaks);
  const Telemetry t = engine.worker.take_telemetry();
  std::printf("quarantined fences: %lld\n", static_cast<long long>(t.get(Counter::kQuarantinedFences)));
  return 0;
}
