#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "pinned_cpu.h"
#include "streaming_test_geometry.h"

#include "activekv/home_rows.h"
#include "activekv/kv_codec.h"
#include "activekv/layer_streaming.h"
#include "activekv/worker_side.h"

namespace activekv {
namespace {

using Ids = std::vector<std::int64_t>;
using streaming_test::geometry;
using streaming_test::kLayers;
using streaming_test::Names;

// The ring, through the worker side, on CPU tensors whose streamed layers
// alias two rings (the geometry's own tests: test_streaming_geometry.cpp).

constexpr std::int64_t kBlocks = 12;

KVLayout layout() {
  KVLayout l;
  l.layer_names = kLayers;
  l.block_size = 32;
  l.num_kv_heads = 2;
  l.head_size = 32;
  l.dtype = at::kBFloat16;
  return l;
}

at::Tensor blocks() { return at::zeros({kBlocks, 2, 32, 64}, at::kBFloat16); }

// l0 resident; l1 and l3 view ring 0, l2 and l4 ring 1.
std::unordered_map<std::string, at::Tensor> ring_caches(c10::Device device = at::kCPU) {
  const at::Tensor ring0 = blocks().to(device), ring1 = blocks().to(device);
  return {{"l0", blocks().to(device)}, {"l1", ring0}, {"l2", ring1}, {"l3", ring0}, {"l4", ring1}};
}

// What the step's "attention" writes into a block of a layer: distinct per
// layer, block and step.
at::Tensor content(std::int64_t layer, std::int64_t block, std::int64_t step) {
  at::manual_seed(static_cast<std::uint64_t>(1000 * step + 10 * layer + block));
  return at::randn({2, 32, 64}).to(at::kBFloat16);
}

bool bitwise(const at::Tensor& a, const at::Tensor& b) {
  return at::equal(a.view(at::kShort), b.view(at::kShort));
}

BlockKey key(std::uint8_t i) {
  BlockKey k{};
  k.fill(i);
  return k;
}

struct Streaming {
  WorkerSide worker;
  std::unordered_map<std::string, at::Tensor> kv;
  explicit Streaming(Mode homes = Mode::kExact)
      : worker(Config{}, layout(), 8, 0, geometry(1, 2, homes)), kv(ring_caches()) {
    const Status s = worker.register_kv_caches(kv);
    EXPECT_TRUE(s.ok()) << s.error();
  }
};

// Home rows are the scheduler's (home_rows.h), not block ids: here block b
// lives in row kRows - 1 - b, and each list is in row order, as planned.
const std::int64_t kRows = home_rows_for(kBlocks);
std::int64_t row_of(std::int64_t block) { return kRows - 1 - block; }

void with_rows(Ids blocks, Ids& ids, Ids& rows) {
  std::sort(blocks.begin(), blocks.end(), [](auto a, auto b) { return row_of(a) < row_of(b); });
  for (const auto b : blocks) {
    ids.push_back(b);
    rows.push_back(row_of(b));
  }
}

StepPlan streaming_plan(Ids stage, Ids writeback) {
  StepPlan plan;
  with_rows(std::move(stage), plan.stage_blocks, plan.stage_rows);
  with_rows(std::move(writeback), plan.writeback_blocks, plan.writeback_rows);
  return plan;
}

std::string bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {reinterpret_cast<const char*>(c.data_ptr()),
          static_cast<std::size_t>(c.numel() * c.element_size())};
}

// One step of every layer: stage `stage`, write `written` (each layer's
// content for the step) and send `writeback` home.
void streamed_step(Streaming& s, const Ids& stage, const Ids& writeback, std::int64_t step,
                   const Ids& written) {
  s.worker.bind_plan(streaming_plan(stage, writeback));
  s.worker.start_load();
  for (std::int64_t l = 0; l < 5; ++l) {
    const auto& name = kLayers[static_cast<std::size_t>(l)];
    s.worker.wait_for_layer_load(name);
    for (const std::int64_t b : written) s.kv[name][b].copy_(content(l, b, step));
    s.worker.save_layer(name, s.kv[name]);
  }
  s.worker.wait_for_save();
  s.worker.clear_plan();
}

TEST(LayerStreamer, RefusesCachesThatDoNotAliasTheirRing) {
  WorkerSide w(Config{}, layout(), 8, 0, geometry());
  auto kv = ring_caches();
  kv["l3"] = blocks();
  const Status s = w.register_kv_caches(kv);
  EXPECT_EQ(s.error(),
            "ActiveKV layer streaming: the KV cache of layer 'l3' is not a view of ring buffer 0; "
            "vLLM must carry ActiveKV's patch series (0002, get_kv_cache_regions) for streaming");
}

TEST(LayerStreamer, HomesRoundTripBitwiseThroughTheRing) {
  Streaming s;
  // Step 1: every layer writes blocks 2 and 5, which go home.
  streamed_step(s, {2, 5}, {2, 5}, 1, {2, 5});
  // Step 2: each streamed layer finds its own bytes in the ring, though the
  // layer sharing its buffer overwrote it in between.
  s.worker.bind_plan(streaming_plan({2, 5}, {}));
  s.worker.start_load();
  for (std::int64_t l = 1; l < 5; ++l) {
    const auto& name = kLayers[static_cast<std::size_t>(l)];
    s.worker.wait_for_layer_load(name);
    for (const std::int64_t b : {2, 5}) {
      EXPECT_TRUE(bitwise(s.kv[name][b], content(l, b, 1))) << name << " block " << b;
    }
    s.worker.save_layer(name, s.kv[name]);
  }
  s.worker.wait_for_save();
  s.worker.clear_plan();
  // The homes hold the written bytes in their blocks' rows, zeros elsewhere.
  const std::string home = s.worker.streamer()->home_bytes("l3");
  const at::Tensor written = content(3, 5, 1).contiguous();
  const auto block_bytes = static_cast<std::size_t>(written.numel()) * 2;
  ASSERT_EQ(home.size(), block_bytes * static_cast<std::size_t>(kRows));
  EXPECT_EQ(home.substr(static_cast<std::size_t>(row_of(5)) * block_bytes, block_bytes),
            std::string(reinterpret_cast<const char*>(written.data_ptr()), block_bytes));
  EXPECT_EQ(home.substr(5 * block_bytes, block_bytes), std::string(block_bytes, '\0'));
  const Telemetry t = s.worker.take_telemetry();
  const std::int64_t layer_bytes = 2 * 32 * 64 * 2;
  EXPECT_EQ(t.get(Counter::kStreamedBytesToHost), 4 * 2 * layer_bytes);
  EXPECT_EQ(t.get(Counter::kStreamedBytesToDevice), 2 * 4 * 2 * layer_bytes);
  // The step gauges: the bytes since the last take (vLLM takes once a step).
  EXPECT_EQ(t.gauge(Gauge::kStreamedStepBytesToHost), 4 * 2 * layer_bytes);
  EXPECT_EQ(t.gauge(Gauge::kStreamedStepBytesToDevice), 2 * 4 * 2 * layer_bytes);
  // A step that streams nothing reports zeros once, then nothing.
  const Telemetry idle = s.worker.take_telemetry();
  EXPECT_EQ(idle.gauge(Gauge::kStreamedStepBytesToHost), 0);
  EXPECT_EQ(idle.gauge(Gauge::kStreamedStepBytesToDevice), 0);
  EXPECT_TRUE(s.worker.take_telemetry().empty());
}

TEST(LayerStreamer, CompressedHomesHoldTheCodecsBytesAndStageTheirDecode) {
  Streaming s(Mode::kCompressed);
  const auto codec = make_codec(Mode::kCompressed, {2, 32, 64}, at::kBFloat16, layout().head_size);
  const std::int64_t exact_bytes = 2 * 32 * 64 * 2;
  ASSERT_LT(codec->layer_bytes(), exact_bytes * 6 / 10);  // (1 + 4 / 32) / 2 of exact
  const auto encoded = [&](const at::Tensor& block) { return codec->encode(block.unsqueeze(0)); };
  streamed_step(s, {}, {2, 5}, 1, {2, 5});
  // Step 2 stages both: each layer finds the decode of its own encoded bytes.
  s.worker.bind_plan(streaming_plan({2, 5}, {}));
  s.worker.start_load();
  for (std::int64_t l = 1; l < 5; ++l) {
    const auto& name = kLayers[static_cast<std::size_t>(l)];
    s.worker.wait_for_layer_load(name);
    for (const std::int64_t b : {2, 5}) {
      const at::Tensor want = codec->decode(encoded(content(l, b, 1)))[0];
      EXPECT_TRUE(bitwise(s.kv[name][b], want)) << name << " block " << b;
      EXPECT_FALSE(bitwise(s.kv[name][b], content(l, b, 1))) << "lossless? " << name << " block " << b;
    }
    s.worker.save_layer(name, s.kv[name]);
  }
  s.worker.wait_for_save();
  s.worker.clear_plan();
  const auto layer = static_cast<std::size_t>(codec->layer_bytes());
  std::string home = s.worker.streamer()->home_bytes("l3");
  ASSERT_EQ(home.size(), layer * static_cast<std::size_t>(kRows));
  EXPECT_EQ(home.substr(static_cast<std::size_t>(row_of(5)) * layer, layer),
            bytes_of(encoded(content(3, 5, 1))));
  EXPECT_EQ(home.substr(5 * layer, layer), std::string(layer, '\0'));
  // Step 3 stages block 2 and sends it home unchanged: its home is now the
  // encode of its decode (the reference's write-back, re-encoding).
  streamed_step(s, {2}, {2}, 3, {});
  home = s.worker.streamer()->home_bytes("l3");
  const at::Tensor staged = codec->decode(encoded(content(3, 2, 1)));
  EXPECT_EQ(home.substr(static_cast<std::size_t>(row_of(2)) * layer, layer), bytes_of(codec->encode(staged)));
  const Telemetry t = s.worker.take_telemetry();
  EXPECT_EQ(t.get(Counter::kStreamedBytesToHost), (4 * 2 + 4) * codec->layer_bytes());
  EXPECT_EQ(t.get(Counter::kStreamedBytesToDevice), (4 * 2 + 4) * codec->layer_bytes());
}

TEST(LayerStreamer, CompressedHomesStartAFreshBlockAsZerosInTheRing) {
  // What the buffer's previous occupant left must not reach a fresh block's
  // encode (exact homes leave the buffer as it is: their bytes are the slots').
  for (const Mode homes : {Mode::kExact, Mode::kCompressed}) {
    Streaming s(homes);
    const at::Tensor left_over = content(9, 7, 9);
    s.kv["l1"][7].copy_(left_over);
    s.worker.bind_plan(streaming_plan({}, {7}));  // block 7 is written, not staged
    s.worker.start_load();
    s.worker.wait_for_layer_load("l1");
    if (homes == Mode::kCompressed) {
      EXPECT_TRUE(bitwise(s.kv["l1"][7], at::zeros_like(left_over)));
    } else {
      EXPECT_TRUE(bitwise(s.kv["l1"][7], left_over));
    }
    s.worker.save_layer("l1", s.kv["l1"]);
    s.worker.clear_plan();
  }
}

TEST(LayerStreamer, LoadsLandOnTopOfStagingAndTheSecondWaitDoesNothing) {
  Streaming s;
  // Step 1: blocks 2 and 3 written, block 3 also saved to the store (slot 0).
  StepPlan first = streaming_plan({2, 3}, {2, 3});
  first.saves = {SaveOp{0, 3, key(1), "r"}};
  s.worker.bind_plan(std::move(first));
  s.worker.start_load();
  for (std::int64_t l = 0; l < 5; ++l) {
    const auto& name = kLayers[static_cast<std::size_t>(l)];
    s.worker.wait_for_layer_load(name);
    for (const std::int64_t b : {2, 3}) s.kv[name][b].copy_(content(l, b, 1));
    s.worker.save_layer(name, s.kv[name]);
  }
  s.worker.wait_for_save();
  s.worker.clear_plan();
  ASSERT_EQ(s.worker.take_report().saved, (Ids{0}));
  // Step 2: block 6 loads slot 0 (block 3's bytes) and is staged from its
  // (zero) home as well; block 2 is staged from its home.
  StepPlan second = streaming_plan({2, 6}, {2, 6});
  second.loads = {LoadOp{0, 6, key(1)}};
  s.worker.bind_plan(std::move(second));
  s.worker.start_load();
  for (std::int64_t l = 1; l < 5; ++l) {
    const auto& name = kLayers[static_cast<std::size_t>(l)];
    s.worker.wait_for_layer_load(name);  // before the KV cache update
    EXPECT_TRUE(bitwise(s.kv[name][6], content(l, 3, 1))) << name;
    EXPECT_TRUE(bitwise(s.kv[name][2], content(l, 2, 1))) << name;
    s.kv[name][2].copy_(content(l, 2, 2));  // the update writes the step's new token
    s.worker.wait_for_layer_load(name);     // before attention: must change nothing
    EXPECT_TRUE(bitwise(s.kv[name][2], content(l, 2, 2))) << name;
    EXPECT_TRUE(bitwise(s.kv[name][6], content(l, 3, 1))) << name;
    s.worker.save_layer(name, s.kv[name]);
  }
  s.worker.wait_for_save();
  s.worker.clear_plan();
  EXPECT_TRUE(s.worker.take_load_errors().empty());
  // The loaded block went home too.
  s.worker.bind_plan(streaming_plan({6}, {}));
  s.worker.start_load();
  s.worker.wait_for_layer_load("l4");
  EXPECT_TRUE(bitwise(s.kv["l4"][6], content(4, 3, 1)));
  s.worker.clear_plan();
}

TEST(LayerStreamer, TheWorkersLineSaysHowTheHomesCross) {
  Streaming s;  // on CPU: a copy per run (on CUDA the device check's ring takes every method)
  EXPECT_EQ(s.worker.streaming_copies_line(),
            "ActiveKV layer streaming (rank 0): one copy per run of home rows and blocks");
  // Write-backs settle across steps by default, but a CPU copy has landed when
  // issued: there the host settles, and the line says nothing of it.
  EXPECT_TRUE(StreamingTuning{}.settle_across_steps);
  EXPECT_FALSE(s.worker.streamer()->tuning().settle_across_steps);
  WorkerSide plain(Config{}, layout(), 8, 0, std::nullopt);
  ASSERT_TRUE(plain.register_kv_caches(ring_caches()).ok());
  EXPECT_EQ(plain.streaming_copies_line(), "");
}

// On a device a new streamer settles write-backs across steps unless the
// environment says ACTIVEKV_SETTLE_ACROSS_STEPS=0, and the worker's line says
// which (CI's CPU run filters the accelerator tests out).
TEST(LayerStreamerOnAccelerator, WriteBacksSettleAcrossStepsUnlessTheEnvironmentSaysNot) {
  const auto type = at::accelerator::getAccelerator(false);
  if (!type || at::accelerator::deviceCount() == 0) {
    GTEST_SKIP() << "no accelerator in this torch build or machine";
  }
  constexpr const char* kVar = "ACTIVEKV_SETTLE_ACROSS_STEPS";
  // The environment as it was, back however the test ends (later tests share it).
  struct Restore {
    std::optional<std::string> saved;
    ~Restore() {
      if (saved) {
        setenv(kVar, saved->c_str(), 1);
      } else {
        unsetenv(kVar);
      }
    }
  } restore{std::getenv(kVar) ? std::optional<std::string>(std::getenv(kVar)) : std::nullopt};
  for (const char* value : {static_cast<const char*>(nullptr), "0", "1"}) {
    if (value != nullptr) {
      setenv(kVar, value, 1);
    } else {
      unsetenv(kVar);
    }
    WorkerSide worker(Config{}, layout(), 8, 0, geometry(1, 2, Mode::kExact));
    ASSERT_TRUE(worker.register_kv_caches(ring_caches(c10::Device(*type, 0))).ok());
    const bool across = value == nullptr || std::string_view(value) != "0";
    const std::string line = worker.streaming_copies_line();
    EXPECT_EQ(worker.streamer()->tuning().settle_across_steps, across) << (value ? value : "unset");
    EXPECT_EQ(line.find("; write-backs settle across steps") != std::string::npos, across) << line;
    EXPECT_EQ(line.find("; write-backs settle on the host each step (ACTIVEKV_SETTLE_ACROSS_STEPS=0)") !=
                  std::string::npos,
              !across)
        << line;
  }
}

// CPU with the forward's thread bound (vLLM's CPU worker): the copies run on
// a thread of their own beside it, posted ahead and waited for per layer, and
// every staged block and home byte is what the forward's own copies give.
TEST(LayerStreamer, CopiesOnAThreadBesideABoundForwardLandAsTheForwardsOwnDo) {
  const test::PinnedToOneCpu pinned;
  if (!pinned.pinned()) GTEST_SKIP() << "one CPU: none beside the forward's for a copy thread";
  Streaming threaded, inline_copies;  // registered on the pinned thread
  StreamingTuning tuning = threaded.worker.streamer()->tuning();
  ASSERT_TRUE(tuning.cpu_copy_thread);  // the default
  // 8 KiB a block: steps staging 3 blocks or more a layer copy on the thread,
  // the others on the forward's, with a write-back pending across the switch.
  tuning.cpu_copy_thread_min_bytes = 24 << 10;
  threaded.worker.streamer()->set_tuning(tuning);
  tuning.cpu_copy_thread = false;
  inline_copies.worker.streamer()->set_tuning(tuning);
  const std::vector<int>& cpus = threaded.worker.streamer()->copy_thread_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_EQ(std::count(cpus.begin(), cpus.end(), pinned.cpu()), 0);
  EXPECT_TRUE(inline_copies.worker.streamer()->copy_thread_cpus().empty());
  EXPECT_NE(threaded.worker.streaming_copies_line().find(", on a copy thread on CPUs "), std::string::npos)
      << threaded.worker.streaming_copies_line();

  // Each step stages blocks earlier steps wrote back, and writes back blocks
  // (its own content), one of them staged too where a decode step's last block is.
  const std::vector<std::pair<Ids, Ids>> plans = {{{}, {0, 1, 2, 3}},     {{0, 1, 2, 3}, {3, 4}},
                                                  {{1, 3, 4}, {4, 7, 9}}, {{2, 9}, {2, 5}},
                                                  {{0, 4, 7, 9}, {9}},    {{2, 5}, {}}};
  std::int64_t step = 0;
  for (int round = 0; round < 20; ++round) {
    for (const auto& [stage, writeback] : plans) {
      ++step;
      std::vector<std::string> seen[2];
      int side = 0;
      for (Streaming* s : {&threaded, &inline_copies}) {
        s->worker.bind_plan(streaming_plan(stage, writeback));
        s->worker.start_load();
        for (std::int64_t l = 0; l < 5; ++l) {
          const auto& name = kLayers[static_cast<std::size_t>(l)];
          s->worker.wait_for_layer_load(name);
          for (const std::int64_t b : stage) seen[side].push_back(bytes_of(s->kv[name][b]));
          for (const std::int64_t b : writeback) s->kv[name][b].copy_(content(l, b, step));
          s->worker.save_layer(name, s->kv[name]);
        }
        s->worker.wait_for_save();
        s->worker.clear_plan();
        ++side;
      }
      ASSERT_EQ(seen[0], seen[1]) << "step " << step;
    }
  }
  for (const auto& name : {"l1", "l2", "l3", "l4"}) {
    EXPECT_EQ(threaded.worker.streamer()->home_bytes(name), inline_copies.worker.streamer()->home_bytes(name))
        << name;
  }
}

// Beside other workers of the same vLLM (tensor parallel on one host), the
// CPUs a bound forward leaves are theirs: the copies stay on its thread.
TEST(LayerStreamer, ACopyThreadOnlyForTheInstancesOneWorker) {
  const test::PinnedToOneCpu pinned;
  if (!pinned.pinned()) GTEST_SKIP() << "one CPU: none beside the forward's for a copy thread";
  for (const std::int64_t workers : {1, 2}) {
    WorkerSide worker(Config{}, layout(), 8, 0, geometry(1, 2, Mode::kExact));
    worker.set_workers(workers);
    ASSERT_TRUE(worker.register_kv_caches(ring_caches()).ok());
    EXPECT_EQ(worker.streamer()->copy_thread_cpus().empty(), workers > 1) << workers << " workers";
    EXPECT_EQ(worker.streamer()->tuning().cpu_copy_thread, workers == 1) << workers << " workers";
  }
}

// On the CPU the copier is the CPU's: runs, nothing else, and the tuning's
// bounds are checked before anything changes.
TEST(LayerStreamer, TheCpusCopierCopiesByRunsAndRefusesTheDevicesMethods) {
  Streaming s;
  LayerStreamer& streamer = *s.worker.streamer();
  EXPECT_EQ(streamer.copy_method(), StreamCopy::kRuns);
  EXPECT_TRUE(streamer.can_copy_by(StreamCopy::kRuns));
  for (const StreamCopy method : {StreamCopy::kDeviceGather, StreamCopy::kCopyEngineBatch}) {
    EXPECT_FALSE(streamer.can_copy_by(method)) << copy_method_name(method);
    try {
      streamer.set_copy_method(method);
      ADD_FAILURE() << copy_method_name(method) << " accepted on the CPU";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("needs"), std::string::npos) << e.what();
    }
    EXPECT_EQ(streamer.copy_method(), StreamCopy::kRuns);
  }
  EXPECT_NO_THROW(streamer.set_copy_method(StreamCopy::kRuns));
  EXPECT_FALSE(streamer.tuning().settle_across_steps) << "nothing stays in flight across CPU steps";
  StreamingTuning bad = streamer.tuning();
  const std::int64_t before = bad.cpu_copy_thread_min_bytes;  // the default, or what the environment set
  bad.cpu_copy_thread_min_bytes = -1;
  EXPECT_THROW(streamer.set_tuning(bad), std::invalid_argument);
  EXPECT_EQ(streamer.tuning().cpu_copy_thread_min_bytes, before) << "a refused tuning changes nothing";
  EXPECT_FALSE(streamer.has_fused_codec());
  EXPECT_TRUE(streamer.fused_codec_missing().empty());
}

TEST(LayerStreamer, ResidentLayersAreNeverStaged) {
  Streaming s;
  s.kv["l0"][4].fill_(3);
  s.worker.bind_plan(streaming_plan({4}, {4}));
  s.worker.start_load();
  s.worker.wait_for_layer_load("l0");
  s.worker.save_layer("l0", s.kv["l0"]);
  EXPECT_TRUE(at::equal(s.kv["l0"][4], at::full({2, 32, 64}, 3, at::kBFloat16)));
  EXPECT_EQ(s.worker.take_telemetry().get(Counter::kStreamedBytesToDevice), 0);
}

TEST(LayerStreamer, OutOfRangeIdsAreRefusedAndNothingIsBound) {
  Streaming s;
  try {
    s.worker.bind_plan(streaming_plan({2}, {99}));
    FAIL() << "bound a plan with block 99";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "block id 99 out of range (the KV cache has 12 blocks)");
  }
  EXPECT_THROW(s.worker.bind_plan(streaming_plan({-1}, {})), std::out_of_range);
  StepPlan no_row = streaming_plan({2, 3}, {});
  no_row.stage_rows.pop_back();
  try {
    s.worker.bind_plan(std::move(no_row));
    FAIL() << "bound a plan with a block and no home row";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "1 home rows for 2 streamed blocks");
  }
  StepPlan past = streaming_plan({}, {2});
  past.writeback_rows = {kRows};
  try {
    s.worker.bind_plan(std::move(past));
    FAIL() << "bound a plan with a home row past the homes";
  } catch (const std::out_of_range& e) {
    EXPECT_EQ(std::string(e.what()), "home row " + std::to_string(kRows) + " out of range (the homes have " +
                                         std::to_string(kRows) + " rows)");
  }
  EXPECT_FALSE(s.worker.streams_this_step());
  EXPECT_FALSE(s.worker.has_layer_work());
  s.worker.bind_plan(streaming_plan({}, {1}));
  EXPECT_TRUE(s.worker.streams_this_step());
  EXPECT_TRUE(s.worker.has_layer_work());
  EXPECT_TRUE(s.worker.layer_waits_this_step());
}

// Many steps through the ring, on CPU and on the accelerator: the
// streaming-ring scenario of device_check/streaming_scenarios.cpp (test_device_check.cpp).

}  // namespace
}  // namespace activekv
