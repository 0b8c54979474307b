// The device check's host-store scenarios: saves and loads bit for bit (or
// within the codec's bound), fences that complete or time out, the codec.
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

// ---- save, then load into other blocks: bitwise (exact) or close (compressed)

std::string save_load(c10::Device device, Mode mode, Findings& f, bool layer_hooks, bool small_ring,
                      bool async_loads) {
  const KVLayout l = layout({"l0", "l1", "l2"}, 2, 32);
  Config config;
  config.mode = mode;
  if (async_loads) config.async_load_min_tokens = 1;
  WorkerSide w(config, l, 64, 0);
  if (small_ring) w.set_load_staging(2, l.layer_bytes(mode));
  Caches kv;
  std::uint64_t seed = 1;
  for (const auto& n : l.layer_names) kv[n] = random({12, 2, kBlockSize, 64}, seed++).to(device);
  const Status s = w.register_kv_caches(kv);
  f.expect(s.ok(), "register_kv_caches: " + s.error());
  if (!s.ok()) return "";
  // Slots 10..12 form one run, 40 another: both copy paths.
  step(w, l, kv,
       saving({SaveOp{10, 3, key(1), "r"}, SaveOp{11, 7, key(2), "r"}, SaveOp{12, 5, key(3), "r"},
               SaveOp{40, 9, key(4), "r"}}),
       layer_hooks);
  w.drain_saves();  // on a device the copies settle after their step
  f.expect(w.take_report().saved == Ids{10, 11, 12, 40}, "slots 10, 11, 12, 40 not all reported saved");
  Caches before;
  for (const auto& [n, t] : kv) before[n] = t.cpu();
  const std::vector<LoadOp> loads = {LoadOp{40, 0, key(4)}, LoadOp{10, 1, key(1)}, LoadOp{11, 2, key(2)}};
  if (!async_loads) {
    step(w, l, kv, loading(loads), layer_hooks);
  } else {
    // Landed on streams of their own: named once every copy completed, and
    // only then are the slots reported read.
    step(w, l, kv, loading_async({AsyncLoad{"r", loads}}), layer_hooks);
    std::vector<std::string> landed = w.take_landed_requests();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (landed.empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      landed = w.take_landed_requests();
    }
    f.expect(landed == std::vector<std::string>{"r"}, "the request was not named within 10 s of its loads");
    f.expect(w.nothing_awaiting(), "a landed request is still awaited");
  }
  f.expect(w.take_report().loaded == Ids{40, 10, 11}, "slots 40, 10, 11 not reported read");
  f.expect(w.take_load_errors().empty(), "the loads reported errors");
  // Each loaded block against the block its slot was saved from.
  const std::vector<std::pair<std::int64_t, std::int64_t>> landed = {{0, 9}, {1, 3}, {2, 7}};
  for (const auto& n : l.layer_names) {
    const at::Tensor after = kv[n].cpu();
    for (const auto& [to, from] : landed) {
      const bool same = mode == Mode::kExact ? bitwise(after[to], before[n][from])
                                             // int8 with per-token-per-head scales: close, not equal.
                                             : at::allclose(after[to].to(at::kFloat),
                                                            before[n][from].to(at::kFloat), 0.05, 0.05);
      f.expect(same, block_of(n, to) + " does not hold what block " + std::to_string(from) + " saved");
    }
    f.expect(bitwise(after[4], before[n][4]), block_of(n, 4) + " changed though no load targets it");
  }
  if (small_ring && !device.is_cpu()) {
    f.expect(w.load_staging_bytes() ==
                 (async_loads ? 2 + WorkerSide::kAsyncLoadStagingPieces : 2) * l.layer_bytes(mode),
             "the load staging is not two one-block buffers (and the asynchronous loads' ring)");
    f.expect(!async_loads ||
                 w.load_staging_line().find("land asynchronously, through 2 more") != std::string::npos,
             "the start-up line does not say the asynchronous loads' staging: " + w.load_staging_line());
    f.expect(w.load_staging_line().find("through 2 buffers") != std::string::npos &&
                 w.load_staging_line().find("at most 1 blocks") != std::string::npos,
             "the start-up line does not say the staging: " + w.load_staging_line());
  }
  f.expect(device.is_cpu() == w.load_staging_line().empty(),
           "a start-up line on the load staging where there is none, or none where there is");
  return std::string("4 blocks x 3 layers saved (two runs), 3 loaded back ") +
         (mode == Mode::kExact ? "bitwise" : "within the int8 codec's tolerance") +
         (layer_hooks ? "" : ", with no per-layer call (a full CUDA graph's steps)") +
         (small_ring ? ", through a ring of two one-block staging buffers (9 pieces)" : "") +
         (async_loads ? ", asynchronously (on streams of their own, named once landed)" : "");
}

// ---- a save large enough to outlast a step -----------------------------------

// 4096 blocks of 128 KiB per layer over 3 layers: 1.5 GiB, far more than a
// millisecond of copying at any bus speed. CPU copies are synchronous, so a
// few blocks show the same contract there.
std::int64_t big_blocks(c10::Device device) { return device.is_cpu() ? 64 : 4096; }

KVLayout big_layout() { return layout({"l0", "l1", "l2"}, 8, 128); }

// One step saving every block of `kv` into the slot of its number; returns
// once wait_for_save did, with the copies possibly still running.
void issue_big_save(WorkerSide& w, const Caches& kv, std::int64_t n) {
  StepPlan plan;
  for (std::int64_t b = 0; b < n; ++b) {
    plan.saves.push_back(SaveOp{b, b, key(static_cast<std::uint8_t>(b % 200)), "r"});
  }
  w.bind_plan(std::move(plan));
  for (const auto& name : big_layout().layer_names) w.save_layer(name, kv.at(name));
  w.wait_for_save();
  w.clear_plan();
}

Caches big_caches(c10::Device device, std::int64_t n) {
  Caches kv;
  for (const auto& name : big_layout().layer_names) kv[name] = blocks(big_layout(), n, device, 1);
  return kv;
}

std::string save_fences_complete(c10::Device device, Findings& f) {
  const std::int64_t n = big_blocks(device);
  auto kv = big_caches(device, n);
  WorkerSide w(Config{}, big_layout(), n, 0);
  const Status s = w.register_kv_caches(kv);
  f.expect(s.ok(), "register_kv_caches: " + s.error());
  if (!s.ok()) return "";
  issue_big_save(w, kv, n);
  if (!device.is_cpu()) {  // the copies to the host are still running
    f.expect(w.has_pending_saves(), "the save settled inside its step (no copy left running)");
    f.expect(!w.arena()->tag(n - 1), "the last block was visible before its copy completed");
    bool refused = false;  // its slots are not written again while the copy runs
    try {
      w.bind_plan(saving({SaveOp{0, 0, key(1), "r"}}));
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    f.expect(refused, "a slot of a running save was leased again");
  } else {
    f.expect(!w.has_pending_saves(), "a CPU save was left pending after its step");
  }
  // The next step runs meanwhile, and its writes to the KV cache come after the gathers.
  for (auto& [name, t] : kv) t.fill_(2);
  w.drain_saves();
  f.expect(!w.has_pending_saves(), "drain_saves left a save pending");
  const auto report = w.take_report();
  f.expect(static_cast<std::int64_t>(report.saved.size()) == n,
           std::to_string(report.saved.size()) + " of " + std::to_string(n) + " blocks reported saved");
  f.expect(report.quarantined.empty(), "the save's fence was quarantined");
  f.expect(w.arena()->tag(n - 1).has_value(), "the last block is not visible after its save completed");
  // The host holds what the blocks held at the save (ones), not the later twos.
  const auto bytes = w.arena()->slot_data(n - 1);
  const at::Tensor one = at::ones({1}, at::kBFloat16);
  std::uint16_t one_bits;
  std::memcpy(&one_bits, one.data_ptr(), 2);
  std::size_t wrong = 0;
  if (bytes.ok()) {
    for (std::size_t i = 0; i + 1 < bytes.value().size(); i += 2) {
      std::uint16_t v;
      std::memcpy(&v, bytes.value().data() + i, 2);
      wrong += v != one_bits;
    }
  }
  f.expect(bytes.ok() && wrong == 0, "the last slot does not hold the bytes of the save's step (" +
                                         std::to_string(wrong) + " values differ)");
  return std::to_string(n) + " blocks x 3 layers (" +
         std::to_string(n * big_layout().slot_bytes(Mode::kExact) >> 20) +
         " MiB) saved; visible only once their fences completed, holding the bytes of their step";
}

std::string fence_timeout_quarantines(c10::Device device, Findings& f) {
  if (device.is_cpu()) {
    f.skip("copies on CPU are synchronous: no fence can pass its deadline");
    return "";
  }
  const std::int64_t n = big_blocks(device);
  auto kv = big_caches(device, n);
  Config config;
  config.fence_timeout_ms = 1;
  WorkerSide w(config, big_layout(), n + 1, 0);
  const Status s = w.register_kv_caches(kv);
  f.expect(s.ok(), "register_kv_caches: " + s.error());
  if (!s.ok()) return "";
  issue_big_save(w, kv, n);
  w.drain_saves();  // waits at most until the deadline, then quarantines
  const auto report = w.take_report();
  f.expect(report.saved.empty(), "blocks reported saved though their fence passed its deadline");
  f.expect(static_cast<std::int64_t>(report.quarantined.size()) == n,
           std::to_string(report.quarantined.size()) + " of " + std::to_string(n) + " slots quarantined");
  f.expect(w.take_telemetry().get(Counter::kQuarantinedFences) == 1,
           "telemetry does not count one quarantined fence");
  f.expect(w.arena()->quarantined_count() == n, "the arena does not hold every slot quarantined");
  f.expect(!w.arena()->tag(0), "a quarantined slot is visible");
  at::accelerator::synchronizeDevice(device.index());  // the late copies land in quarantined slots only
  f.expect(!w.arena()->tag(n - 1), "a quarantined slot became visible once its copy landed");
  // A quarantined slot is never written again; a fresh one still is.
  bool refused = false;
  try {
    w.bind_plan(saving({SaveOp{0, 0, key(1), "r"}}));
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  f.expect(refused, "a quarantined slot was leased again");
  const KVLayout l = big_layout();
  step(w, l, kv, saving({SaveOp{n, 0, key(1), "r"}}));
  w.drain_saves();
  f.expect(w.take_report().saved == Ids{n}, "a fresh slot was not saved after the quarantine");
  return "a 1 ms deadline on a " + std::to_string(n * l.slot_bytes(Mode::kExact) >> 20) +
         " MiB save quarantined its " + std::to_string(n) + " slots; a fresh slot still saves";
}

// ---- the compressed codec on the device ---------------------------------------------

// The codec's decode on the device gives the CPU's bytes, bit for bit (the
// CPU's are the reference codec's: the parity gate compares them), so
// compressed KV can cross the bus as int8 + scales and be dequantized where
// it lands. Encode is only reported: it may round a value the other way.
std::string compressed_decode(c10::Device device, Findings& f) {
  const KVLayout l = layout({"l0"}, 8, 128);
  const auto codec = make_codec(Mode::kCompressed, {2, kBlockSize, 8 * 128}, l.dtype, l.head_size);
  const at::Tensor kv = random({64, 2, kBlockSize, 8 * 128}, 5) * 3;
  const at::Tensor data = codec->encode(kv);
  const at::Tensor on_cpu = codec->decode(data);
  const at::Tensor on_device = codec->decode(data.to(device)).cpu();
  f.expect(at::equal(on_cpu.view(at::kShort), on_device.view(at::kShort)),
           "the device's decode differs from the CPU's by up to " +
               std::to_string((on_cpu.to(at::kFloat) - on_device.to(at::kFloat)).abs().max().item<double>()));
  const std::int64_t q = kv[0].numel();
  const at::Tensor encoded = codec->encode(kv.to(device)).cpu();
  const at::Tensor diff = encoded.narrow(1, 0, q).view(at::kChar).to(at::kInt) -
                          data.narrow(1, 0, q).view(at::kChar).to(at::kInt);
  return std::to_string(kv.size(0)) +
         " blocks decoded bitwise as on the CPU; the device's encode "
         "differs from the CPU's in " +
         std::to_string(diff.ne(0).sum().item<std::int64_t>()) + " of " + std::to_string(diff.numel()) +
         " int8 values (by at most " + std::to_string(diff.abs().max().item<std::int64_t>()) + ")";
}

}  // namespace activekv::device_check
