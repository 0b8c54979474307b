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
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "../bench_device.h"
#include "../bench_flags.h"
#include "streaming_bench.h"

using namespace activekv;
using namespace activekv::streaming_bench;

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

// The flags into b.o (and the globals they set); a value to exit with
// where they say to stop (--help, a bad flag).
std::optional<int> read_flags(Bench& b, int argc, char** argv) {
  return bench::parse_flags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
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
}

// The host, the device and the bus's pinned peak both ways, as every run's
// first lines (bench.gpu_report reads the GPU's name and the peak from them).
void print_machine(Bench& b) {
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
}

}  // namespace

int main(int argc, char** argv) {
  Bench b;
  if (const auto stop = read_flags(b, argc, argv)) return *stop;
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
  print_machine(b);
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
