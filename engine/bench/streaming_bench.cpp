// Layer streaming at the bus's bound, on an accelerator.
//
// A decode step (or a prefill chunk) of a 32-layer model with Llama-3-8B's
// attention geometry (8 KV heads x 128, 32 query heads, bf16) through the
// engine's LayerStreamer: homes in its paged host arena, a ring of K device
// buffers, blocks scattered as a long-running server leaves them (a random
// permutation of the block ids; --id-runs N: runs of N handed out backwards,
// as vLLM reuses a finished request's blocks). Per layer: the engine stages
// the layer, the step's new K/V are written into their slots, attention runs
// over every staged block, the engine writes the step's blocks back home and
// stages the layer K places later.
//
// Attention: the layer's blocks are gathered by the block table
// (index_select) and fed to at::scaled_dot_product_attention (flash on CUDA),
// each KV head's 4 query heads as 4x the queries (exact for GQA without a
// mask). A prefill chunk's queries attend to every key of the context (no
// causal mask inside the chunk: at most 1/16 more work at 16k).
//
// Each step is reported beside its bound, measured in the same run:
//   bound = max(the same layers' attention with the KV already on the device,
//               streamed bytes / pinned host->device peak of one 1 GiB copy).
//
// Prints one line per point and a machine-readable "RESULT {json}" line.
// The flags: kUsage below (`streaming_bench --help`).
#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "activekv/kv_codec.h"
#include "bench_device.h"
#include "bench_flags.h"
#include "activekv/home_rows.h"
#include "activekv/layer_streaming.h"

#ifdef ACTIVEKV_BENCH_PROFILE
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

using namespace activekv;

namespace {

constexpr const char* kUsage =
    R"(usage: streaming_bench [--device cuda] [--iters 3] [--host-gib 72] [--ring 2] [--block 16]
                       [--only probe,tuning,grid,compressed,curve] [--knobs batch,...] [--kinds decode,prefill]
                       [--contexts 16384,...] [--timeline 1] [--pin-to-gpu-node 1] [--id-runs 1] [--back-to-back N]
                       [--attention 0] [--variants compressed-fused-batch,...]
       streaming_bench_profiled --profile-dir DIR [--profile-homes compressed]   (built with torch's profiler)

--back-to-back N: a point's step is the mean of N steps queued one after
another, the host never waiting for the device between them, as vLLM's
async scheduling queues a step while the last one runs (its bound and
attention alike). 0, the default: each step alone, the device idle before
and after it.

--contexts: only the tuning's, the grid's and the compressed part's points at
these contexts (the shared prefix's is 16384 + the block), so a part fits one
call. A point so picked draws other random ids than in the whole part (each
point takes the next seed); its figures compare, its ids do not.

--variants: only these compressed homes' variants in the compressed part
(exact homes run whatever is named: they give each point's attention and the
speedups' baseline), so the part fits one call.

--attention 0 (with --only tuning): the layers compute nothing, so a step is
the streamer's copies alone; beside the same rows with attention it tells the
bus's pace under the attention from its pace alone. Its rows are labelled
KNOB/no-attention.
)";

const std::vector<std::string> kParts = {"probe", "tuning", "grid", "compressed", "curve"};  // --only

constexpr std::int64_t kLayers = 32;
constexpr std::int64_t kKvHeads = 8;
constexpr std::int64_t kQueryHeads = 32;
constexpr std::int64_t kHeadSize = 128;
std::int64_t g_ring = 2;  // ring buffers (--ring)
// Scattered ids (--id-runs): 1, a random permutation; N, runs of N consecutive
// ids handed out backwards (vLLM gives a new request a finished one's blocks
// tail first), the runs in random order.
std::int64_t g_id_runs = 1;
std::int64_t g_back_to_back = 0;  // --back-to-back
bool g_attention = true;          // --attention

struct Options {
  std::string device = "cuda";
  std::int64_t iters = 3;
  std::int64_t block = 16;
  double host_gib = 72;                 // the most pinned homes a point may use
  std::string profile_dir;              // streaming_bench_profiled: where the traces go
  std::string profile_homes = "exact";  // or "compressed"
  std::set<std::string> only;
  std::set<std::string> knobs;     // tuning: only these knobs' rows (all when empty)
  std::set<std::string> variants;  // compressed: only these compressed variants (all when empty)
  std::set<std::string> kinds;     // tuning: only these step kinds, decode or prefill (all when empty)
  std::set<std::string> contexts;  // tuning, grid and compressed: only these contexts (all when empty)
  bool timeline = false;           // tuning and compressed: also one step's compute stream, timed by events
  bool pin_to_gpu_node = false;    // the process on the GPU's NUMA node's CPUs, homes first touched there
  bool wants(const std::string& part) const { return only.empty() || only.count(part) != 0; }
  bool at_context(std::int64_t context) const {  // --contexts
    return contexts.empty() || contexts.count(std::to_string(context)) != 0;
  }
};

c10::Device g_device{c10::DeviceType::CUDA, 0};

void device_sync() { bench::sync_current_stream(g_device); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::string layer_name(std::int64_t l) { return "model.layers." + std::to_string(l) + ".self_attn.attn"; }

// One step's work: which blocks each sequence reads, which slots it writes.
struct StepShape {
  std::string kind;          // "decode" or "prefill"
  std::int64_t context = 0;  // tokens of each sequence after the step
  std::int64_t batch = 1;
  std::int64_t new_tokens = 1;     // per sequence
  std::int64_t shared_prefix = 0;  // tokens every sequence shares (their blocks cross once)
  // Block ids in order, each sequence's blocks consecutive (else scattered, as
  // a long-running server leaves them: --id-runs).
  bool contiguous = false;
};

// Where the homes keep each block. kBlockIds: the row is the block id, and
// every block the step reads is staged (the engine before home rows).
// kExtents: the scheduler's home rows (home_rows.h), each sequence's blocks
// given rows as its prompt grows in chunks of 2048 tokens, round robin over
// the batch; blocks the step gives new content are not staged.
enum class Homes { kBlockIds, kExtents };
const char* homes_name(Homes h) { return h == Homes::kExtents ? "extents" : "block-ids"; }

struct Step {
  StepShape shape;
  Homes homes = Homes::kExtents;
  std::vector<std::vector<std::int64_t>> tables;               // per sequence, its blocks in order
  std::vector<std::int64_t> stage_blocks, stage_rows;          // in row order
  std::vector<std::int64_t> writeback_blocks, writeback_rows;  // in row order
  std::unordered_map<std::int64_t, std::int64_t> row_of;
  double mean_run = 0;      // consecutive home rows per run of the staged
  std::int64_t copies = 0;  // a streamed layer's staging by the copy engines: runs of rows and ids both
  // Device tensors for the layer's compute.
  at::Tensor table;                    // [batch * blocks_per_seq]
  at::Tensor slot_block, slot_offset;  // [batch * new_tokens]
  at::Tensor q, k_new, v_new;
};

// Block ids as --id-runs scatters them.
void scatter(std::vector<std::int64_t>& ids, std::uint32_t seed) {
  std::mt19937 rng(seed);
  if (g_id_runs <= 1) {
    std::shuffle(ids.begin(), ids.end(), rng);
    return;
  }
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(ids.size()); s += g_id_runs) starts.push_back(s);
  std::shuffle(starts.begin(), starts.end(), rng);
  std::size_t i = 0;
  for (const auto start : starts) {
    const std::int64_t end = std::min<std::int64_t>(start + g_id_runs, static_cast<std::int64_t>(ids.size()));
    for (std::int64_t id = end - 1; id >= start; --id) ids[i++] = id;
  }
}

Step make_step(const StepShape& shape, std::int64_t block, std::int64_t num_blocks, std::uint32_t seed,
               Homes homes = Homes::kExtents) {
  Step s;
  s.shape = shape;
  s.homes = homes;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  if (!shape.contiguous) scatter(ids, seed);
  const std::int64_t per_seq = cdiv(shape.context, block);
  const std::int64_t shared = shape.shared_prefix / block;
  std::size_t next = 0;
  std::vector<std::int64_t> prefix(ids.begin(), ids.begin() + shared);
  next += static_cast<std::size_t>(shared);
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    std::vector<std::int64_t> t = prefix;
    while (static_cast<std::int64_t>(t.size()) < per_seq) t.push_back(ids.at(next++));
    s.tables.push_back(std::move(t));
  }
  const std::int64_t first_new = shape.context - shape.new_tokens;
  // Blocks past the last one holding an earlier token are the step's new content.
  const auto first_fresh = static_cast<std::size_t>(cdiv(first_new, block));
  if (homes == Homes::kExtents) {
    HomeRows rows(num_blocks);
    rows.assign("prefix", prefix);
    constexpr std::size_t kChunk = 128;  // 2048 tokens of 16
    std::vector<std::size_t> given(s.tables.size(), prefix.size());
    for (bool more = true; more;) {
      more = false;
      for (std::size_t q = 0; q < s.tables.size(); ++q) {
        const auto& t = s.tables[q];
        const std::size_t end = std::min(t.size(), given[q] + kChunk);
        if (given[q] == end) continue;
        rows.assign("seq " + std::to_string(q),
                    std::vector<std::int64_t>(t.begin() + static_cast<long>(given[q]),
                                              t.begin() + static_cast<long>(end)));
        given[q] = end;
        more = true;
      }
    }
    for (const auto& t : s.tables)
      for (const auto b : t) s.row_of[b] = rows.row(b);
  } else {
    for (const auto& t : s.tables)
      for (const auto b : t) s.row_of[b] = b;
  }
  std::set<std::int64_t> stage, wb;
  std::vector<std::int64_t> slot_block, slot_offset;
  for (const auto& t : s.tables) {
    const std::size_t staged = homes == Homes::kExtents ? std::min(first_fresh, t.size()) : t.size();
    stage.insert(t.begin(), t.begin() + static_cast<long>(staged));
    for (std::int64_t pos = first_new; pos < shape.context; ++pos) {
      const std::int64_t b = t[static_cast<std::size_t>(pos / block)];
      wb.insert(b);
      slot_block.push_back(b);
      slot_offset.push_back(pos % block);
    }
  }
  const auto by_row = [&](const std::set<std::int64_t>& blocks, std::vector<std::int64_t>& out_blocks,
                          std::vector<std::int64_t>& out_rows) {
    std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
    for (const auto b : blocks) pairs.emplace_back(s.row_of.at(b), b);
    std::sort(pairs.begin(), pairs.end());
    for (const auto& [r, b] : pairs) out_blocks.push_back(b), out_rows.push_back(r);
  };
  by_row(stage, s.stage_blocks, s.stage_rows);
  by_row(wb, s.writeback_blocks, s.writeback_rows);
  std::int64_t runs = 0;
  for (std::size_t i = 0; i < s.stage_rows.size(); ++i) {
    if (i == 0 || s.stage_rows[i] != s.stage_rows[i - 1] + 1) ++runs;
    if (i == 0 || s.stage_rows[i] != s.stage_rows[i - 1] + 1 ||
        s.stage_blocks[i] != s.stage_blocks[i - 1] + 1) {
      ++s.copies;
    }
  }
  s.mean_run = runs == 0 ? 0 : static_cast<double>(s.stage_rows.size()) / static_cast<double>(runs);
  std::vector<std::int64_t> flat;
  for (const auto& t : s.tables) flat.insert(flat.end(), t.begin(), t.end());
  const auto dev = at::TensorOptions().device(g_device);
  s.table = at::tensor(flat, at::kLong).to(g_device);
  s.slot_block = at::tensor(slot_block, at::kLong).to(g_device);
  s.slot_offset = at::tensor(slot_offset, at::kLong).to(g_device);
  const std::int64_t n_new = shape.batch * shape.new_tokens;
  s.q = at::randn({shape.batch, kQueryHeads, shape.new_tokens, kHeadSize}, dev.dtype(at::kBFloat16));
  s.k_new = at::randn({n_new, kKvHeads, kHeadSize}, dev.dtype(at::kBFloat16));
  s.v_new = at::randn({n_new, kKvHeads, kHeadSize}, dev.dtype(at::kBFloat16));
  return s;
}

// One layer's compute on its KV cache [num_blocks, 2, block, heads, head]:
// the step's new K/V into their slots, then attention over the context.
at::Tensor layer_compute(const Step& s, at::Tensor& kv) {
  const at::Tensor zero = at::zeros_like(s.slot_block), one = at::ones_like(s.slot_block);
  kv.index_put_({s.slot_block, zero, s.slot_offset}, s.k_new);
  kv.index_put_({s.slot_block, one, s.slot_offset}, s.v_new);
  const std::int64_t b = s.shape.batch, ctx = s.shape.context;
  const std::int64_t per_seq = s.table.size(0) / b;
  auto side = [&](std::int64_t which) {
    return kv.select(1, which)
        .index_select(0, s.table)
        .view({b, per_seq * kv.size(2), kKvHeads, kHeadSize})
        .narrow(1, 0, ctx)
        .transpose(1, 2);
  };
  const std::int64_t group = kQueryHeads / kKvHeads;
  const at::Tensor q = s.q.view({b, kKvHeads, group * s.shape.new_tokens, kHeadSize});
  return at::scaled_dot_product_attention(q, side(0), side(1));
}

struct Bench {
  Options o;
  double h2d_peak = 0;  // bytes/s
  double d2h_peak = 0;
  bool failed = false;  // a verify_step found other bytes
};

double pinned_peak(bool to_device, std::int64_t iters) {
  const std::int64_t big = std::int64_t{1} << 30;
  at::Tensor d = at::empty({big}, at::TensorOptions().device(g_device).dtype(at::kByte));
  at::Tensor h = at::empty({big}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::vector<double> t;
  for (std::int64_t i = 0; i <= iters; ++i) {
    device_sync();
    const auto t0 = std::chrono::steady_clock::now();
    if (to_device)
      d.copy_(h, true);
    else
      h.copy_(d, true);
    device_sync();
    if (i > 0) t.push_back(seconds_since(t0));
  }
  return static_cast<double>(big) / median(t);
}

// A model's worth of device KV and the engine's streamer over it.
struct Model {
  std::int64_t block = 16, num_blocks = 0, resident = 0;
  std::vector<at::Tensor> kv;  // per layer: its own buffer (resident) or its ring buffer
  std::unique_ptr<LayerStreamer> streamer;
  std::int64_t layer_bytes = 0;    // one block of one layer as its home holds it
  std::unique_ptr<KVCodec> codec;  // the homes' (exact: a view)

  Model(std::int64_t block_size, std::int64_t blocks, std::int64_t resident_layers, Mode homes = Mode::kExact)
      : block(block_size),
        num_blocks(blocks),
        resident(resident_layers),
        codec(make_codec(homes, {2, block_size, kKvHeads, kHeadSize}, at::kBFloat16, kHeadSize)) {
    const auto dev = at::TensorOptions().device(g_device).dtype(at::kBFloat16);
    std::vector<at::Tensor> ring;
    for (std::int64_t r = 0; r < g_ring; ++r)
      ring.push_back(at::zeros({blocks, 2, block, kKvHeads, kHeadSize}, dev));
    std::unordered_map<std::string, at::Tensor> by_name;
    std::vector<std::string> names;
    for (std::int64_t l = 0; l < kLayers; ++l) {
      names.push_back(layer_name(l));
      kv.push_back(l < resident ? at::zeros({blocks, 2, block, kKvHeads, kHeadSize}, dev)
                                : ring[static_cast<std::size_t>((l - resident) % g_ring)]);
      by_name[names.back()] = kv.back();
    }
    layer_bytes = codec->layer_bytes();
    if (resident < kLayers) {
      auto geometry = StreamingGeometry::plan(StreamingConfig{resident, g_ring, homes}, names);
      if (!geometry.ok()) throw std::runtime_error(geometry.status().error());
      auto made = LayerStreamer::create(geometry.value(), by_name, /*fence_timeout_ms=*/60000, kHeadSize);
      if (!made.ok()) throw std::runtime_error(made.status().error());
      streamer = std::move(made.value());
    }
  }
  ~Model() {
    if (streamer) streamer->synchronize();
    device_sync();
  }
  std::int64_t streamed() const { return kLayers - resident; }

  // `steps` steps through every layer, queued one after another (--back-to-back),
  // their mean; streaming off: the KV is already on the device.
  // timeline: when given, timed events on the compute stream of the last step,
  // 1 + 2 per layer: the step's start (the compute stream done with the step
  // before), then each layer's compute start (after its staging's wait) and end.
  // host_marks: when given, the host's ms since the last step's start at each
  // layer's stage, compute, write-back and stage-ahead calls' ends (4 per layer).
  double run(const Step& s, bool streaming, std::vector<c10::Event>* timeline = nullptr,
             std::vector<double>* host_marks = nullptr, std::int64_t steps = 1) {
    device_sync();
    Telemetry stats;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < steps; ++i)
      queue_step(s, streaming, stats, i + 1 == steps ? timeline : nullptr,
                 i + 1 == steps ? host_marks : nullptr);
    last_host_s = seconds_since(t0) / static_cast<double>(steps);  // the host has queued the steps
    if (streaming) streamer->synchronize();
    device_sync();
    return seconds_since(t0) / static_cast<double>(steps);
  }
  void queue_step(const Step& s, bool streaming, Telemetry& stats, std::vector<c10::Event>* timeline,
                  std::vector<double>* host_marks) {
    const auto mark = [&] {
      if (timeline == nullptr) return;
      timeline->emplace_back(g_device.type(), c10::EventFlag::BACKEND_DEFAULT);
      timeline->back().record(c10::impl::VirtualGuardImpl(g_device.type()).getStream(g_device));
    };
    const auto t0 = std::chrono::steady_clock::now();
    const auto host_mark = [&] {
      if (host_marks != nullptr) host_marks->push_back(seconds_since(t0) * 1e3);
    };
    mark();
    if (streaming) {
      streamer->begin_step(s.stage_blocks, s.stage_rows, s.writeback_blocks, s.writeback_rows);
      streamer->start(stats);
    }
    for (std::int64_t l = 0; l < kLayers; ++l) {
      const std::string name = layer_name(l);
      const bool streamed_layer = streaming && l >= resident;
      if (streamed_layer) streamer->stage(name, stats);
      host_mark();
      mark();
      if (g_attention) layer_compute(s, kv[static_cast<std::size_t>(l)]);
      mark();
      host_mark();
      if (streamed_layer) {
        streamer->write_back(name, stats);
        host_mark();
        streamer->stage_ahead(name, std::nullopt, stats);
        host_mark();
      }
    }
  }
  double median_run(const Step& s, bool streaming, std::int64_t iters) {
    const std::int64_t steps = std::max<std::int64_t>(1, g_back_to_back);
    run(s, streaming, nullptr, nullptr, steps);  // warm-up
    std::vector<double> t, host;
    for (std::int64_t i = 0; i < iters; ++i) {
      t.push_back(run(s, streaming, nullptr, nullptr, steps));
      host.push_back(last_host_s);
    }
    host_s = median(host);
    return median(t);
  }
  double last_host_s = 0;
  double host_s = 0;  // the last median_run's: the host's time to queue a step
};

void free_pinned_cache() {
  device_sync();
  at::getHostAllocator(g_device.type())->empty_cache();
}

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

// The tuning part's rows: each the streamer's defaults but what its knobs set.
struct TuningRow {
  const char* label;
  StreamCopy method;
  void (*knobs)(StreamingTuning&);
};

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
      {"batch-staging-waits-wb", batch, [](T& t) { t.staging_waits_for_writeback = true; }},
      {"batch-issue-thread", batch, [](T& t) { t.issue_thread = true; }},
      {"batch-ahead-in-calls", batch, [](T& t) { t.ahead_in_one_call = false; }},
      {"batch-start-one-layer", batch, [](T& t) { t.start_one_layer = true; }},
      {"batch-host-settle", batch, [](T& t) { t.settle_across_steps = false; }}};
  return rows;
}

// The device methods and their knobs at the points hardest to hold at the bus's
// bound: the gather's pieces and the copy stream's priority, the batch's
// write-back stream, its calls to the driver, whether a buffer's staging waits
// for its last occupant's write-back, the issue thread, whether start issues
// the first streamed layer alone, and whether write-backs settle on the host
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

// The compressed part's rows: exact homes, then compressed homes four ways.
// Compressed homes put SM work on the copy stream (a decode per piece, an
// encode per write-back): by the codec's ATen operations, and by the fused
// kernels (the default on CUDA), on the same homes. Their rows cross into
// the pieces by a gather kernel (short runs) and a copy per long run, or all
// by batched copies (the default on CUDA for rows of 32 KiB and more).
struct CompressedVariant {
  const char* label;
  Mode homes;
  bool fused;
  std::optional<StreamCopy> method;  // the streamer's own choice when absent
};

const std::vector<CompressedVariant>& compressed_variants() {
  static const std::vector<CompressedVariant> variants{
      {"exact-homes", Mode::kExact, false, std::nullopt},
      {"compressed-aten-gather", Mode::kCompressed, false, StreamCopy::kDeviceGather},
      {"compressed-fused-gather", Mode::kCompressed, true, StreamCopy::kDeviceGather},
      {"compressed-aten-batch", Mode::kCompressed, false, StreamCopy::kCopyEngineBatch},
      {"compressed-fused-batch", Mode::kCompressed, true, StreamCopy::kCopyEngineBatch}};
  return variants;
}

// Compressed homes (StreamingConfig::homes): the homes hold the compressed
// codec (int8 + one fp32 scale per head row); the streamer's pieces carry the
// compressed rows over the bus and the copy stream decodes each into the ring.
// Each point twice on the same block ids and rows: exact homes, then
// compressed; each against its own bound, and compressed's speed-up.
void compressed(Bench& b) {
  const std::int64_t block = b.o.block;
  const std::vector<std::int64_t> shape{2, block, kKvHeads, kHeadSize};
  const auto codec = make_codec(Mode::kCompressed, shape, at::kBFloat16, kHeadSize);
  // Bitwise: the device's decode against the CPU's (the reference codec's
  // bytes, checked by the parity gate), on random blocks.
  {
    const at::Tensor blocks = at::randn({64, 2, block, kKvHeads, kHeadSize}).to(at::kBFloat16) * 3;
    const at::Tensor data = codec->encode(blocks);
    const at::Tensor on_cpu = codec->decode(data);
    const at::Tensor on_device = codec->decode(data.to(g_device)).cpu();
    const bool same = at::equal(on_cpu.view(at::kShort), on_device.view(at::kShort));
    const at::Tensor enc_device = codec->encode(blocks.to(g_device)).cpu();
    const at::Tensor q_diff = (enc_device.narrow(1, 0, blocks[0].numel()).view(at::kChar).to(at::kInt) -
                               data.narrow(1, 0, blocks[0].numel()).view(at::kChar).to(at::kInt))
                                  .abs();
    std::printf(
        "compressed codec: device decode %s the CPU's bitwise (max |diff| %g); device encode "
        "%s the CPU's bytes (%lld of %lld int8 values differ, by at most %lld)\n",
        same ? "equals" : "DIFFERS FROM",
        (on_cpu.to(at::kFloat) - on_device.to(at::kFloat)).abs().max().item<double>(),
        at::equal(enc_device, data) ? "equals" : "DIFFERS FROM",
        static_cast<long long>(q_diff.ne(0).sum().item<std::int64_t>()),
        static_cast<long long>(q_diff.numel()), static_cast<long long>(q_diff.max().item<std::int64_t>()));
    std::printf("RESULT {\"part\": \"codec\", \"decode_bitwise\": %s, \"encode_bitwise\": %s}\n",
                same ? "true" : "false", at::equal(enc_device, data) ? "true" : "false");
  }
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
        std::printf("%s: %s ctx %lld x%lld  %.3fx exact homes' tokens/s\n", v.label,
                    steps[i].shape.kind.c_str(), static_cast<long long>(steps[i].shape.context),
                    static_cast<long long>(steps[i].shape.batch), exact_step[i] / step);
        std::printf(
            "RESULT {\"part\": \"compressed-speedup\", \"method\": \"%s\", \"kind\": \"%s\", \"context\": "
            "%lld, "
            "\"batch\": %lld, \"back_to_back\": %lld, \"speedup\": %.4f}\n",
            v.label, steps[i].shape.kind.c_str(), static_cast<long long>(steps[i].shape.context),
            static_cast<long long>(steps[i].shape.batch), static_cast<long long>(g_back_to_back),
            exact_step[i] / step);
      }
      if (!verify_step(m, steps[i])) b.failed = true;
      std::fflush(stdout);
    }
  }
}

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

}  // namespace

int main(int argc, char** argv) {
  Bench b;
  const auto stop = bench::parse_flags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
    const auto whole = [&](std::int64_t least) { return bench::whole_number(k, v, least); };
    if (k == "--device")
      b.o.device = v;
    else if (k == "--iters")
      b.o.iters = whole(1);
    else if (k == "--block")
      b.o.block = whole(1);
    else if (k == "--ring")
      g_ring = whole(1);
    else if (k == "--id-runs")
      g_id_runs = whole(1);
    else if (k == "--back-to-back")
      g_back_to_back = whole(0);
    else if (k == "--host-gib")
      b.o.host_gib = bench::positive_number(k, v);
#ifdef ACTIVEKV_BENCH_PROFILE
    else if (k == "--profile-dir")
      b.o.profile_dir = v;
    else if (k == "--profile-homes")
      b.o.profile_homes = bench::one_of(k, v, {"exact", "compressed"});
#else
    else if (k == "--profile-dir" || k == "--profile-homes") throw bench::BadFlag(k + ": only streaming_bench_profiled profiles");
#endif
    else if (k == "--timeline")
      b.o.timeline = bench::switch_on(k, v);
    else if (k == "--pin-to-gpu-node")
      b.o.pin_to_gpu_node = bench::switch_on(k, v);
    else if (k == "--attention")
      g_attention = bench::switch_on(k, v);
    else if (k == "--only") {
      for (const auto& part : bench::parts(k, v)) b.o.only.insert(bench::one_of(k, part, kParts));
    } else if (k == "--knobs") {
      std::vector<std::string> rows;  // a renamed row must not measure nothing quietly
      for (const TuningRow& r : tuning_rows()) rows.emplace_back(r.label);
      for (const auto& part : bench::parts(k, v)) b.o.knobs.insert(bench::one_of(k, part, rows));
    } else if (k == "--variants") {
      std::vector<std::string> names;  // compressed homes' rows only: exact homes always run
      for (const CompressedVariant& r : compressed_variants()) {
        if (r.homes != Mode::kExact) names.emplace_back(r.label);
      }
      for (const auto& part : bench::parts(k, v)) b.o.variants.insert(bench::one_of(k, part, names));
    } else if (k == "--kinds") {
      for (const auto& part : bench::parts(k, v))
        b.o.kinds.insert(bench::one_of(k, part, {"decode", "prefill"}));
    } else if (k == "--contexts") {
      for (const auto& part : bench::parts(k, v))
        b.o.contexts.insert(std::to_string(bench::whole_number(k, part, 1)));
    } else {
      return false;
    }
    return true;
  });
  if (stop) return *stop;
  // The other parts' points are the goals'; the profile runs its own steps.
  if (!g_attention && (b.o.only != std::set<std::string>{"tuning"} || !b.o.profile_dir.empty())) {
    std::fprintf(stderr, "--attention 0: only with --only tuning, unprofiled\n");
    return 2;
  }
  if (b.o.profile_dir.empty() && b.o.profile_homes != "exact") {  // would run every part, unprofiled
    std::fprintf(stderr, "--profile-homes %s: profiles only with --profile-dir\n", b.o.profile_homes.c_str());
    return 2;
  }
  if (const std::string problem = bench::accelerator_problem(b.o.device); !problem.empty()) {
    std::fprintf(stderr, "%s\n", problem.c_str());
    return 2;
  }
  if (b.o.pin_to_gpu_node) std::printf("%s\n", bench::pin_to_gpu_node().c_str());
  std::printf("%s\n", bench::host_placement().c_str());
  // The driver's launch queues (read when the context is made) move the host's
  // time to queue a step: a run says if they were scaled.
  if (const char* queues = std::getenv("CUDA_SCALE_LAUNCH_QUEUES"))
    std::printf("CUDA_SCALE_LAUNCH_QUEUES=%s\n", queues);
  g_device = c10::Device(b.o.device);
  if (!g_device.has_index()) g_device = c10::Device(g_device.type(), 0);  // tensors say cuda:0
  b.h2d_peak = pinned_peak(true, 5);
  b.d2h_peak = pinned_peak(false, 5);
  std::printf(
      "device %s; %lld layers, %lld KV heads x %lld, %lld query heads, bf16, block %lld; pinned "
      "peak host->device %.1f GB/s, device->host %.1f GB/s\n",
      b.o.device.c_str(), static_cast<long long>(kLayers), static_cast<long long>(kKvHeads),
      static_cast<long long>(kHeadSize), static_cast<long long>(kQueryHeads),
      static_cast<long long>(b.o.block), b.h2d_peak / 1e9, b.d2h_peak / 1e9);
  // The run's first peak line names the GPU: gpu_report says which machine each goal's points came from.
  std::string gpu = bench::gpu_model_names();
  std::replace_if(
      gpu.begin(), gpu.end(),
      [](char c) { return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20; }, ' ');
  std::printf("gpu: %s\n", gpu.empty() ? "not named (the NVIDIA driver lists none)" : gpu.c_str());
  std::printf("RESULT {\"part\": \"peak\", \"h2d_gbs\": %.3f, \"d2h_gbs\": %.3f%s}\n", b.h2d_peak / 1e9,
              b.d2h_peak / 1e9, gpu.empty() ? "" : (", \"gpu\": \"" + gpu + "\"").c_str());
#ifdef ACTIVEKV_BENCH_PROFILE
  if (!b.o.profile_dir.empty()) {
    profile(b, b.o.profile_dir);
    return 0;
  }
#endif
  if (b.o.wants("probe")) probe(b);
  if (b.o.wants("tuning")) tuning(b);
  free_pinned_cache();
  if (b.o.wants("grid")) grid(b);
  free_pinned_cache();
  if (b.o.wants("compressed")) compressed(b);
  if (b.o.wants("curve")) resident_curve(b);
  // The bus's peak again, after the points: one read low at the start flatters
  // every point, so bench.gpu_report takes each against the best.
  free_pinned_cache();
  const double h2d_end = pinned_peak(true, 5), d2h_end = pinned_peak(false, 5);
  std::printf("pinned peak again after the points: host->device %.1f GB/s, device->host %.1f GB/s\n",
              h2d_end / 1e9, d2h_end / 1e9);
  std::printf("RESULT {\"part\": \"peak\", \"h2d_gbs\": %.3f, \"d2h_gbs\": %.3f, \"when\": \"end\"}\n",
              h2d_end / 1e9, d2h_end / 1e9);
  return b.failed ? 1 : 0;
}
