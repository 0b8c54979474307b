// What the streaming benchmark's parts share (main.cpp says what it
// measures): the model's geometry, the run's settings, a step's blocks, and a
// model's worth of device KV with the engine's streamer over it.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "activekv/kv_codec.h"
#include "activekv/layer_streaming.h"

namespace activekv::streaming_bench {

constexpr std::int64_t kLayers = 32;
constexpr std::int64_t kKvHeads = 8;
constexpr std::int64_t kQueryHeads = 32;
constexpr std::int64_t kHeadSize = 128;
inline std::int64_t g_ring = 2;  // ring buffers (--ring)
// Scattered ids (--id-runs): 1, a random permutation; N, runs of N consecutive
// ids handed out backwards (vLLM gives a new request a finished one's blocks
// tail first), the runs in random order.
inline std::int64_t g_id_runs = 1;
inline std::int64_t g_back_to_back = 0;  // --back-to-back
inline bool g_attention = true;          // --attention

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

inline c10::Device g_device{c10::DeviceType::CUDA, 0};

void device_sync();
double seconds_since(std::chrono::steady_clock::time_point t0);
double median(std::vector<double> v);
std::int64_t cdiv(std::int64_t a, std::int64_t b);
std::string layer_name(std::int64_t l);

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
inline const char* homes_name(Homes h) { return h == Homes::kExtents ? "extents" : "block-ids"; }

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

// The step's blocks, scattered (--id-runs) and given home rows as `homes` says.
Step make_step(const StepShape& shape, std::int64_t block, std::int64_t num_blocks, std::uint32_t seed,
               Homes homes = Homes::kExtents);
// One layer's compute on its KV cache [num_blocks, 2, block, heads, head]:
// the step's new K/V into their slots, then attention over the context.
at::Tensor layer_compute(const Step& s, at::Tensor& kv);

struct Bench {
  Options o;
  double h2d_peak = 0;  // bytes/s
  double d2h_peak = 0;
  bool failed = false;  // a verify_step found other bytes
};

// The pinned host<->device peak of one 1 GiB copy, bytes/s.
double pinned_peak(bool to_device, std::int64_t iters);

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

void free_pinned_cache();
void report(const Bench& b, const std::string& part, const Model& m, const Step& s, double step_s,
            double attention_s, const std::string& method);
// The ring holds every staged block's home bytes after a step, and every
// written-back block's home holds the ring's bytes: checked on the last K
// streamed layers (the ring's occupants at the step's end), with random home
// bytes set just before the step.
bool verify_step(Model& m, const Step& s);
// One streamed step's compute stream, timed by events: when each layer's
// compute could start (its staging landed and the layer before finished), how
// long the stream idled before it, and how long the compute took. Idle time is
// where the bus (or the host) kept the compute waiting.
void print_timeline(Model& m, const Step& s, const char* label);

// The parts (--only), each in a file of its own.
// The tuning part's rows: each the streamer's defaults but what its knobs set.
struct TuningRow {
  const char* label;
  StreamCopy method;
  void (*knobs)(StreamingTuning&);
};

const std::vector<TuningRow>& tuning_rows();

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

const std::vector<CompressedVariant>& compressed_variants();

void probe(Bench& b);
void tuning(Bench& b);
void grid(Bench& b);
void compressed(Bench& b);
void resident_curve(Bench& b);
#ifdef ACTIVEKV_BENCH_PROFILE
void profile(Bench& b, const std::string& dir);
#endif

}  // namespace activekv::streaming_bench
