// The device check's layer-streaming scenarios: the ring over many steps,
// a write-back past its deadline, steps queued back to back.
#include "scenarios.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

#include "activekv/config.h"
#include "activekv/kv_codec.h"
#include "activekv/kv_layout.h"
#include "activekv/layer_streaming.h"
#include "activekv/step_plan.h"
#include "activekv/worker_side.h"

namespace activekv::device_check {

// ---- layer streaming's ring over many steps -----------------------------------
//
// Each step writes fresh bytes into a few random blocks of every layer (as
// vLLM's KV cache update does, on the compute stream) and stages a random set
// of blocks; every staged block must hold the last bytes its own layer wrote
// there, although the layer sharing its ring buffer overwrote the buffer in
// between. On a device this exercises the copy stream's order: a layer's
// write-back before the staging of the layer placed later into the same
// buffer, and the compute stream's wait on each layer's staging. With
// compressed homes a staged block holds the CPU codec's decode of its encode
// (the reference codec's bytes): the device's encode and decode are the CPU's.

constexpr std::int64_t kRingBlocks = 12;
constexpr std::int64_t kSteps = 24;

// What the step's "attention" writes into a block of a layer: distinct per
// layer, block and step.
at::Tensor content(std::int64_t layer, std::int64_t block, std::int64_t step) {
  return random({2, kBlockSize, 64}, static_cast<std::uint64_t>(1000 * step + 10 * layer + block));
}

// A worker streaming `l`'s layers as `streaming` says over `kv` (8 store
// slots), registered; nullptr, with what failed in `f`, otherwise.
std::unique_ptr<WorkerSide> streaming_worker(const KVLayout& l, const StreamingConfig& streaming,
                                             const Caches& kv, Findings& f, const Config& config = Config{}) {
  auto geometry = StreamingGeometry::plan(streaming, l.layer_names);
  f.expect(geometry.ok(), "StreamingGeometry::plan: " + geometry.status().error());
  if (!geometry.ok()) return nullptr;
  auto worker = std::make_unique<WorkerSide>(config, l, 8, 0, geometry.value());
  const Status s = worker->register_kv_caches(kv);
  f.expect(s.ok(), "register_kv_caches: " + s.error());
  return s.ok() ? std::move(worker) : nullptr;
}

// Every copy method this device allows the worker's streamer, and their
// names for the scenario's report ("runs, gather, batch").
std::pair<std::vector<StreamCopy>, std::string> allowed_copy_methods(WorkerSide& worker) {
  std::vector<StreamCopy> methods;
  std::string names;
  for (const auto m : {StreamCopy::kRuns, StreamCopy::kDeviceGather, StreamCopy::kCopyEngineBatch}) {
    if (!worker.streamer()->can_copy_by(m)) continue;
    methods.push_back(m);
    names += std::string(methods.size() > 1 ? ", " : "") + copy_method_name(m);
  }
  return {methods, names};
}

// streaming_ring's knobs at `step`, cycling so that every copy method meets
// each setting (`num_methods`: how many the device allows, in turn).
StreamingTuning ring_step_tuning(std::int64_t step, std::size_t num_methods, std::int64_t layer_bytes) {
  // Odd steps: staging pieces of 3 blocks, 2 of them, and runs of 2 blocks by
  // the copy engine, so on a device one step cycles the pieces and mixes
  // copied with gathered rows in a piece; a batch goes to the driver in
  // several calls, the stagings issued ahead too (CPU copies ignore the
  // tuning).
  StreamingTuning tuning;
  // Compressed homes on CUDA: the fused codec kernels and the codec's ATen
  // operations in turn, so each stages what the other wrote home; switched
  // every full turn of the methods, so each method runs with both.
  tuning.fused_codec = (step / static_cast<std::int64_t>(num_methods)) % 2 == 0;
  // On CUDA: the copies issued from the copy thread, and from this one.
  tuning.issue_thread = (step / 2) % 2 == 0;
  // Steps 3-5, 9-11, ...: write-backs settle across steps (a buffer's first
  // staging waits for its last use alone; set_tuning has waited for the
  // device, streaming-back-to-back does not).
  tuning.settle_across_steps = (step / 3) % 2 == 1;
  if (step % 2 == 1) {
    tuning.batch_first_call = 1;  // a batch in calls of 1, 2, 4, ... copies
    tuning.ahead_in_one_call = false;
    tuning.pieces = 2;
    tuning.piece_bytes = 3 * layer_bytes;
    tuning.copy_engine_run = 2;
  }
  return tuning;
}

// streaming_ring's plan for a step's staged and written blocks, with home
// rows as the scheduler gives them (home_rows.h), in row order: the first
// half of the blocks in consecutive rows of swapped pairs (a copy engine's
// run, scattered in the ring), the rest 4 rows on (runs consecutive in both).
StepPlan ring_step_plan(const Ids& staged, const Ids& written) {
  const auto row_of = [](std::int64_t b) { return b < kRingBlocks / 2 ? (b ^ 1) : b + 4; };
  const auto with_rows = [&](Ids list, Ids& ids, Ids& rows) {
    std::sort(list.begin(), list.end(), [&](auto a, auto c) { return row_of(a) < row_of(c); });
    for (const auto b : list) ids.push_back(b), rows.push_back(row_of(b));
  };
  StepPlan plan;
  with_rows(staged, plan.stage_blocks, plan.stage_rows);
  with_rows(written, plan.writeback_blocks, plan.writeback_rows);
  return plan;
}

std::string streaming_ring(c10::Device device, Findings& f, Mode homes) {
  const std::vector<std::string> names = {"l0", "l1", "l2", "l3", "l4"};
  const KVLayout l = layout(names, 2, 32);
  // l0 resident, a ring of 2: l1 and l3 view ring buffer 0, l2 and l4 ring buffer 1.
  const at::Tensor ring0 = blocks(l, kRingBlocks, device), ring1 = blocks(l, kRingBlocks, device);
  Caches kv = {
      {"l0", blocks(l, kRingBlocks, device)}, {"l1", ring0}, {"l2", ring1}, {"l3", ring0}, {"l4", ring1}};
  const auto made = streaming_worker(l, StreamingConfig{1, 2, homes}, kv, f);
  if (!made) return "";
  WorkerSide& worker = *made;
  const at::Tensor zeros = blocks(l, 1, c10::Device("cpu"))[0];
  const auto codec = make_codec(homes, zeros.sizes().vec(), zeros.scalar_type(), l.head_size);
  const auto staged_form = [&](const at::Tensor& block) {  // what staging gives back
    return codec->decode(codec->encode(block.unsqueeze(0)))[0];
  };
  // Every copy method this device allows, in turn from step to step: a block
  // one method wrote home, the next one stages.
  const auto [methods, method_names] = allowed_copy_methods(worker);
  std::mt19937 rng(7);
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> last;  // (layer, block) -> step
  std::int64_t checked = 0;
  for (std::int64_t step = 1; step <= kSteps; ++step) {
    // A written block is staged too (a decode step's last block holds earlier
    // tokens), but every 4th step writes fresh blocks only, unstaged (a
    // prefill chunk's).
    const bool fresh_step = step % 4 == 0;
    Ids written, staged;
    for (std::int64_t b = 0; b < kRingBlocks; ++b) {
      const bool writes = rng() % 3 == 0;
      if (writes) written.push_back(b);
      if (fresh_step ? !writes && rng() % 2 == 0 : writes || rng() % 2 == 0) staged.push_back(b);
    }
    worker.streamer()->set_tuning(ring_step_tuning(step, methods.size(), l.layer_bytes(homes)));
    worker.streamer()->set_copy_method(methods[static_cast<std::size_t>(step) % methods.size()]);
    worker.bind_plan(ring_step_plan(staged, written));
    worker.start_load();
    for (std::int64_t li = 0; li < static_cast<std::int64_t>(names.size()); ++li) {
      const auto& name = names[static_cast<std::size_t>(li)];
      worker.wait_for_layer_load(name);
      if (li > 0) {  // streamed: the ring holds this layer's last bytes of each staged block
        for (const std::int64_t b : staged) {
          const auto it = last.find({li, b});
          const at::Tensor want = it == last.end() ? zeros : staged_form(content(li, b, it->second));
          f.expect(bitwise(kv[name][b], want), block_of(name, b) + " at step " + std::to_string(step) +
                                                   " does not hold its layer's last bytes");
          ++checked;
        }
      }
      for (const std::int64_t b : written) {
        kv[name][b].copy_(content(li, b, step).to(device));
        last[{li, b}] = step;
      }
      worker.save_layer(name, kv[name]);
    }
    worker.wait_for_save();
    worker.clear_plan();
  }
  f.expect(worker.take_load_errors().empty(), "the steps reported load errors");
  return std::to_string(kSteps) + " steps, 4 streamed layers through a ring of 2, " + mode_name(homes) +
         " homes, copies by " + method_names + " in turn" +
         (worker.streamer()->has_fused_codec() ? ", the fused codec kernels every 2 steps of 3" : "") + ": " +
         std::to_string(checked) + " staged blocks held their layer's last bytes";
}

// ---- streaming: a write-back past its deadline poisons its homes -------------
//
// A write-back whose fence passes fence_timeout_ms unsettled leaves its home
// rows' bytes unknown: a later step that stages them reports those blocks as
// load errors (vLLM recomputes them), until a write-back of the rows completes.
// Write-backs of 256 MiB a layer against a deadline of 1 ms; as the host
// settles them (at the next step) and as the device does (settle_across_steps,
// the host a few milliseconds late).

std::string streaming_fence_timeout_poisons(c10::Device device, Findings& f) {
  if (device.is_cpu()) {
    f.skip("copies on CPU are synchronous: no fence can pass its deadline");
    return "";
  }
  constexpr std::int64_t n = 2048;
  const std::vector<std::string> names = {"l0", "l1", "l2"};
  const KVLayout l = layout(names, 8, 128);
  const at::Tensor ring0 = blocks(l, n, device, 1), ring1 = blocks(l, n, device, 1);
  Caches kv = {{"l0", ring0}, {"l1", ring1}, {"l2", ring0}};
  Config config;
  config.fence_timeout_ms = 1;
  const auto made = streaming_worker(l, StreamingConfig{0, 2, Mode::kExact}, kv, f, config);
  if (!made) return "";
  WorkerSide& worker = *made;
  const auto run = [&](const Ids& staged, const Ids& written) {
    StepPlan plan;
    plan.stage_blocks = plan.stage_rows = staged;  // each block in the row of its number
    plan.writeback_blocks = plan.writeback_rows = written;
    worker.bind_plan(std::move(plan));
    worker.start_load();
    for (const auto& name : names) {
      worker.wait_for_layer_load(name);
      worker.save_layer(name, kv[name]);
    }
    worker.wait_for_save();
    worker.clear_plan();
  };
  Ids all(n), low(n / 2);
  for (std::int64_t b = 0; b < n; ++b) all[static_cast<std::size_t>(b)] = b;
  for (std::int64_t b = 0; b < n / 2; ++b) low[static_cast<std::size_t>(b)] = b;
  const Ids high(all.begin() + n / 2, all.end());
  for (const bool across : {false, true}) {
    const std::string how = across ? " (settled across steps)" : "";
    StreamingTuning tuning;
    tuning.settle_across_steps = across;
    worker.streamer()->set_tuning(tuning);  // waits for the device
    worker.take_load_errors();
    run({}, all);  // every row written back, the copies still running
    if (across) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past every deadline
    run(all, {});
    Ids errors = worker.take_load_errors();
    std::sort(errors.begin(), errors.end());
    f.expect(errors == all, std::to_string(errors.size()) + " of " + std::to_string(n) +
                                " blocks staged from homes past their write-back's deadline reported" + how);
    // Written back again and landed (the next begin_step finds it done): those
    // rows are known again, the others still not.
    run({}, low);
    at::accelerator::synchronizeDevice(device.index());
    run(all, {});
    errors = worker.take_load_errors();
    std::sort(errors.begin(), errors.end());
    f.expect(errors == high, std::to_string(errors.size()) + " blocks reported where the " +
                                 std::to_string(high.size()) + " still unknown were expected" + how);
    // And once every row is written back and landed, nothing.
    run({}, all);
    at::accelerator::synchronizeDevice(device.index());
    run(all, {});
    f.expect(worker.take_load_errors().empty(), "a block was reported once its rows were written back" + how);
  }
  return std::to_string(n) +
         " blocks x 3 layers written back (256 MiB a layer) against a 1 ms deadline, "
         "settled on the host and across steps: staged, each was reported until its rows were written back";
}

// ---- streaming, steps queued back to back ------------------------------------
//
// Steps queued one after another with no wait for the device between them, as
// vLLM's async scheduling queues a step while the last one runs, with the
// write-backs settling across steps (StreamingTuning::settle_across_steps).
// Each layer's "attention" copies aside some of its staged blocks on the
// compute stream, then writes its step's blocks; some steps also save a
// written block to the store. All is checked once the last step is done:
// a staging that overtook the last step's write-back of its homes, or its ring
// buffer's last occupant (that layer's attention, write-back or store gather),
// leaves other bytes in what was copied aside, in a later staging or in the
// store. Five streamed layers through a ring of 2, so the last occupants
// (layers 4 and 3) are not the first ones' pairs; blocks of 128 KiB; on a
// device the last occupants' attention is slowed by matrix products, so a
// staging that did not wait for it lands first.

namespace {

constexpr std::int64_t kChainBlocks = 64;
constexpr std::int64_t kChainSteps = 15;
constexpr std::int64_t kChainSamples = 6;  // staged blocks copied aside per layer and step
const std::vector<std::string> kChainLayers = {"l0", "l1", "l2", "l3", "l4"};
const auto kChainLayerCount = static_cast<std::int64_t>(kChainLayers.size());

// The value a layer's written blocks hold after `step` (0: never written):
// small integers, exact in bf16.
double chain_value(std::int64_t layer, std::int64_t step) {
  return step == 0 ? 0.0 : static_cast<double>(1 + step * kChainLayerCount + layer);
}

// One step of the chain, planned before any runs (its ids already on the
// device: an upload from pageable memory between steps would wait for it).
struct ChainStep {
  StepPlan plan;
  Ids written;
  at::Tensor written_ids;                       // on the device
  std::vector<Ids> samples;                     // per layer: staged blocks copied aside
  std::vector<at::Tensor> sample_ids;           // on the device
  std::vector<std::vector<std::int64_t>> want;  // per layer and sample: the step that wrote it (0: none)
};

struct ChainPlan {
  std::vector<ChainStep> steps;
  std::map<std::int64_t, std::int64_t> saved_at;  // store slot -> the step that saved it
};

// kChainSteps steps over kChainBlocks blocks: which each writes, stages and
// saves, and which staged blocks each layer copies aside to check.
ChainPlan plan_chain(c10::Device device) {
  ChainPlan chain;
  std::mt19937 rng(11);
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> last;  // (layer, block) -> step
  Ids written_before;
  for (std::int64_t step = 1; step <= kChainSteps; ++step) {
    // A decode step stages what it writes. Every 3rd writes fresh blocks,
    // unstaged (a prefill chunk's); every 5th stages nothing at all (a first
    // chunk), so only its compute's wait orders its writes after the last
    // step's write-backs.
    const bool fresh_step = step % 3 == 0, first_chunk = step % 5 == 0;
    ChainStep p;
    Ids staged;
    for (std::int64_t b = 0; b < kChainBlocks; ++b) {
      const bool writes = rng() % 4 == 0;
      if (writes) p.written.push_back(b);
      if (first_chunk) continue;
      if (fresh_step ? !writes && rng() % 2 == 0 : writes || rng() % 2 == 0) staged.push_back(b);
    }
    const auto row_of = [](std::int64_t b) { return b ^ 1; };  // runs of one row: a copy per block
    const auto with_rows = [&](Ids list, Ids& ids, Ids& rows) {
      std::sort(list.begin(), list.end(), [&](auto a, auto c) { return row_of(a) < row_of(c); });
      for (const auto b : list) ids.push_back(b), rows.push_back(row_of(b));
    };
    with_rows(staged, p.plan.stage_blocks, p.plan.stage_rows);
    with_rows(p.written, p.plan.writeback_blocks, p.plan.writeback_rows);
    if (step % 4 == 2 && !p.written.empty()) {  // steps 2, 6, 10, 14: a written block to the store
      const std::int64_t slot = step / 4;
      p.plan.saves.push_back(SaveOp{slot, p.written.back(), key(static_cast<std::uint8_t>(slot + 1)), "r"});
      chain.saved_at[slot] = step;
    }
    for (std::int64_t li = 0; li < kChainLayerCount; ++li) {
      // Blocks the last step wrote first (their homes were still being
      // written), in any order; then others.
      Ids at_risk, others;
      for (const auto b : staged) {
        const bool risk = std::count(written_before.begin(), written_before.end(), b) != 0;
        (risk ? at_risk : others).push_back(b);
      }
      std::shuffle(at_risk.begin(), at_risk.end(), rng);
      std::shuffle(others.begin(), others.end(), rng);
      Ids sample = at_risk;
      sample.insert(sample.end(), others.begin(), others.end());
      sample.resize(std::min<std::size_t>(sample.size(), kChainSamples));
      std::vector<std::int64_t> want;
      for (const auto b : sample) {
        const auto it = last.find({li, b});
        want.push_back(it == last.end() ? 0 : it->second);
      }
      p.sample_ids.push_back(at::tensor(sample, at::kLong).to(device));
      p.samples.push_back(std::move(sample));
      p.want.push_back(std::move(want));
      for (const auto b : p.written) last[{li, b}] = step;
    }
    p.written_ids = at::tensor(p.written, at::kLong).to(device);
    written_before = p.written;
    chain.steps.push_back(std::move(p));
  }
  return chain;
}

// Queues every step back to back, the copy methods in turn; returns, per step
// and layer, the staged blocks its "attention" copied aside.
std::vector<std::vector<at::Tensor>> run_chain(WorkerSide& worker, Caches& kv, const ChainPlan& chain,
                                               const std::vector<StreamCopy>& methods, c10::Device device) {
  const at::Tensor slow = device.is_cpu() ? at::Tensor() : random({4096, 4096}, 3).to(device);
  // Half the steps as the defaults set, half (CUDA) with the copy thread;
  // set_tuning waits for the device.
  StreamingTuning tuning;
  tuning.settle_across_steps = true;
  worker.streamer()->set_tuning(tuning);
  std::vector<std::vector<at::Tensor>> copied(chain.steps.size());
  for (std::size_t i = 0; i < chain.steps.size(); ++i) {
    if (i == chain.steps.size() / 2) {
      tuning.issue_thread = true;
      worker.streamer()->set_tuning(tuning);
    }
    worker.streamer()->set_copy_method(methods[i % methods.size()]);
    const ChainStep& p = chain.steps[i];
    worker.bind_plan(p.plan);
    worker.start_load();
    for (std::int64_t li = 0; li < kChainLayerCount; ++li) {
      const auto& name = kChainLayers[static_cast<std::size_t>(li)];
      worker.wait_for_layer_load(name);
      at::Tensor& layer = kv[name];
      if (slow.defined() &&
          li + 2 >= kChainLayerCount) {  // a last occupant: its reads of the buffer come late
        for (int k = 0; k < 4; ++k) at::mm(slow, slow);
      }
      copied[i].push_back(layer.index_select(0, p.sample_ids[static_cast<std::size_t>(li)]));
      if (!p.written.empty())
        layer.index_fill_(0, p.written_ids, chain_value(li, static_cast<std::int64_t>(i) + 1));
      worker.save_layer(name, layer);
    }
    worker.wait_for_save();
    worker.clear_plan();
  }
  worker.streamer()->synchronize();
  worker.drain_saves();
  return copied;
}

// Every staged block copied aside held its layer's bytes of the last step
// that wrote it, as the homes' codec gives them back; returns how many.
std::int64_t check_staged(const ChainPlan& chain, const std::vector<std::vector<at::Tensor>>& copied,
                          const at::Tensor& zeros, const KVCodec& codec, Findings& f) {
  std::map<std::int64_t, at::Tensor> staged_form;  // by the value written: what staging gives back
  std::int64_t checked = 0;
  for (std::size_t i = 0; i < chain.steps.size(); ++i) {
    for (std::int64_t li = 0; li < kChainLayerCount; ++li) {
      const auto& samples = chain.steps[i].samples[static_cast<std::size_t>(li)];
      const at::Tensor got = copied[i][static_cast<std::size_t>(li)].cpu();
      for (std::size_t k = 0; k < samples.size(); ++k) {
        const std::int64_t by = chain.steps[i].want[static_cast<std::size_t>(li)][k];
        const double v = chain_value(li, by);
        auto& want = staged_form[static_cast<std::int64_t>(v)];
        if (!want.defined()) want = codec.decode(codec.encode(at::full_like(zeros, v).unsqueeze(0)))[0];
        f.expect(bitwise(got[static_cast<std::int64_t>(k)], want),
                 block_of(kChainLayers[static_cast<std::size_t>(li)], samples[k]) + " at step " +
                     std::to_string(i + 1) + " does not hold its layer's bytes of step " +
                     std::to_string(by));
        ++checked;
      }
    }
  }
  return checked;
}

// The store holds each saved block as its step wrote it, every layer.
void check_saved(WorkerSide& worker, const ChainPlan& chain, const at::Tensor& zeros, Findings& f) {
  const auto report = worker.take_report();
  for (const auto& [slot, step] : chain.saved_at) {
    const bool reported = std::count(report.saved.begin(), report.saved.end(), slot) != 0;
    f.expect(reported, "the save of step " + std::to_string(step) + " was not reported saved");
    const auto bytes = worker.arena()->slot_data(slot);
    f.expect(bytes.ok(), "slot " + std::to_string(slot) + ": " + (bytes.ok() ? "" : bytes.status().error()));
    if (!reported || !bytes.ok()) continue;
    const auto per_layer = bytes.value().size() / kChainLayers.size();
    for (std::int64_t li = 0; li < kChainLayerCount; ++li) {
      const at::Tensor want = at::full_like(zeros, chain_value(li, step)).contiguous();
      const bool same = std::memcmp(bytes.value().data() + static_cast<std::size_t>(li) * per_layer,
                                    want.data_ptr(), per_layer) == 0;
      f.expect(same && per_layer == static_cast<std::size_t>(want.nbytes()),
               "the store's layer " + kChainLayers[static_cast<std::size_t>(li)] +
                   " of the block saved at step " + std::to_string(step) +
                   " does not hold that step's bytes");
    }
  }
}

}  // namespace

std::string streaming_back_to_back(c10::Device device, Findings& f, Mode homes) {
  const KVLayout l = layout(kChainLayers, 8, 128);
  const at::Tensor ring0 = blocks(l, kChainBlocks, device), ring1 = blocks(l, kChainBlocks, device);
  Caches kv;
  for (std::size_t i = 0; i < kChainLayers.size(); ++i) kv[kChainLayers[i]] = i % 2 == 0 ? ring0 : ring1;
  const auto made = streaming_worker(l, StreamingConfig{0, 2, homes}, kv, f);
  if (!made) return "";
  WorkerSide& worker = *made;
  const auto [methods, method_names] = allowed_copy_methods(worker);
  const ChainPlan chain = plan_chain(device);
  const auto copied = run_chain(worker, kv, chain, methods, device);
  const at::Tensor zeros = blocks(l, 1, c10::Device("cpu"))[0];
  const auto codec = make_codec(homes, zeros.sizes().vec(), zeros.scalar_type(), l.head_size);
  const std::int64_t checked = check_staged(chain, copied, zeros, *codec, f);
  check_saved(worker, chain, zeros, f);
  f.expect(worker.take_load_errors().empty(), "the steps reported load errors");
  return std::to_string(kChainSteps) + " steps queued back to back, 5 streamed layers through a ring of 2, " +
         mode_name(homes) + " homes, copies by " + method_names + " in turn: " + std::to_string(checked) +
         " staged blocks held their layer's last bytes, " + std::to_string(chain.saved_at.size()) +
         " saved blocks their step's";
}

}  // namespace activekv::device_check
