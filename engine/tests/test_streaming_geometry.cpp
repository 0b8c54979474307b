// Layer streaming's geometry and refusals (streaming_geometry.h), and the KV
// cache group rule they share with the store (kv_cache_groups.h): plain data,
// no torch, no ring.
#include <gtest/gtest.h>

#include "streaming_test_geometry.h"

#include "activekv/streaming_geometry.h"

namespace activekv {
namespace {

using streaming_test::geometry;
using streaming_test::kLayers;
using streaming_test::Names;

TEST(StreamingGeometry, RegionsAreTheResidentLayersThenTheRing) {
  const auto g = geometry();
  EXPECT_EQ(g.resident(), (Names{"l0"}));
  EXPECT_EQ(g.streamed(), (Names{"l1", "l2", "l3", "l4"}));
  EXPECT_EQ(g.regions(), (std::vector<Names>{{"l0"}, {"l1", "l3"}, {"l2", "l4"}}));
  EXPECT_EQ(g.ring_of("l3"), 0);
  EXPECT_EQ(g.ring_of("l4"), 1);
  EXPECT_EQ(g.streamed_index("l0"), -1);
  EXPECT_EQ(g.streamed_index("l4"), 3);
}

TEST(StreamingGeometry, RefusesAGeometryThatSavesNoMemoryNamingTheKey) {
  auto g = StreamingGeometry::plan(StreamingConfig{5, 2}, kLayers);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().error(),
            "kv_connector_extra_config['streaming']['resident_layers']: 5 leaves no layer to "
            "stream; this model has 5 KV cache layers, so it accepts 0..4");
  g = StreamingGeometry::plan(StreamingConfig{2, 3}, kLayers);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().error(),
            "kv_connector_extra_config['streaming']: resident_layers + ring_size = 2 + 3 must be "
            "below the model's 5 KV cache layers, or streaming holds no more blocks than the "
            "device does without it; lower resident_layers or ring_size");
  EXPECT_TRUE(StreamingGeometry::plan(StreamingConfig{2, 2}, kLayers).ok());
}

TEST(KVCacheGroups, OnlyOneFullAttentionGroupIsServedAndARefusalNamesTheKinds) {
  EXPECT_FALSE(unservable_kv_cache_groups({{"FullAttentionSpec"}, true}));
  EXPECT_EQ(unservable_kv_cache_groups({{"SlidingWindowSpec"}, false}),
            "KV cache groups ['SlidingWindowSpec']: it needs one full-attention group (no "
            "sliding-window or hybrid groups)");
  EXPECT_EQ(unservable_kv_cache_groups({{}, false}),
            "KV cache groups []: it needs one full-attention group (no sliding-window or hybrid "
            "groups)");
}

TEST(CheckStreamable, RefusesEachSettingInTheReferenceOrder) {
  StreamableFacts ok;
  ok.groups = {{"FullAttentionSpec"}, true};
  ok.attention_layers = ok.kv_cache_layers = 4;
  EXPECT_TRUE(check_streamable(ok).ok());
  const std::string at = "kv_connector_extra_config['streaming']: layer streaming cannot serve ";
  auto f = ok;
  f.use_mla = true;
  f.speculative = true;
  EXPECT_EQ(check_streamable(f).error(),
            at + "a model with multi-head latent attention (MLA); turn streaming off for it");
  f = ok;
  f.groups = {{"FullAttentionSpec", "SlidingWindowSpec"}, false};
  EXPECT_EQ(check_streamable(f).error(),
            at + "KV cache groups ['FullAttentionSpec', 'SlidingWindowSpec']: it needs one "
                 "full-attention group (no sliding-window or hybrid groups)");
  f = ok;
  f.sliding_window = true;
  EXPECT_EQ(check_streamable(f).error(),
            at + "sliding-window attention; it needs full attention in every layer");
  f = ok;
  f.attention_layers = 6;
  EXPECT_EQ(check_streamable(f).error(),
            at + "a model whose layers share KV (6 attention layers, 4 with a KV cache of their own)");
  f = ok;
  f.speculative = true;
  EXPECT_EQ(check_streamable(f).error(),
            at + "speculative decoding (speculative_config is set); turn one of them off");
  f = ok;
  f.pipeline_parallel_size = 2;
  EXPECT_EQ(check_streamable(f).error(),
            at + "pipeline parallelism (pipeline_parallel_size 2); use tensor parallelism");
}

TEST(StartupReport, CountsBlocksAndBytesAsTheReference) {
  const auto r = StartupReport::of(geometry(), /*num_blocks=*/100, /*block_size=*/32,
                                   /*layer_bytes=*/8192, /*max_model_len=*/1000);
  EXPECT_EQ(r.device_blocks_without, 60);         // 100 * (1 + 2) / 5
  EXPECT_EQ(r.host_bytes, 112 * 4 * 8192);        // home_rows_for(100) rows of 4 layers
  EXPECT_EQ(r.decode_step_bytes, 32 * 4 * 8192);  // ceil(1000 / 32) blocks
  EXPECT_EQ(r.line(),
            "ActiveKV layer streaming: 1 resident + 4 streamed layers, ring of 2; the device "
            "holds 100 blocks (3200 tokens), 60 blocks (1920 tokens) without streaming; host "
            "memory reserved for the streamed layers 3670016 bytes per worker; a full-context "
            "decode step moves 1048576 bytes host->device per worker");
  // Compressed homes: the line says so.
  const auto c = StartupReport::of(geometry(1, 2, Mode::kCompressed), 100, 32, 4608, 1000);
  EXPECT_EQ(c.host_bytes, 112 * 4 * 4608);
  EXPECT_TRUE(
      c.line().ends_with("; the homes are compressed (int8 + scales, lossy within the codec's bound)"))
      << c.line();
  EXPECT_FALSE(r.line().find("compressed") != std::string::npos);
}

TEST(StartupReport, RefusesHomesBeyondTheHostsMemory) {
  const auto r = StartupReport::of(geometry(), 100, 32, 8192, 1000);  // 3670016 bytes of homes
  const HostMemory host{1000 + 3670016, "this host's memory"};
  EXPECT_TRUE(r.check_host_memory(1000, host).ok());
  EXPECT_EQ(r.check_host_memory(1001, host).error(),
            "kv_connector_extra_config['capacity_bytes']=1001 plus the streamed layers' homes "
            "(3670016 bytes for 100 blocks) exceed this host's memory (3671016 bytes); lower "
            "capacity_bytes, raise kv_connector_extra_config['streaming']['resident_layers'], or "
            "give vLLM fewer KV cache blocks (gpu_memory_utilization, num_gpu_blocks_override)");
}

}  // namespace
}  // namespace activekv
