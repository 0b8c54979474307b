// Making a LayerStreamer (layer_streaming.h): the ring buffers' aliasing
// checked, the homes allocated, the device's streams and copy method chosen,
// the compressed homes' fused kernels compiled, and the operator's switches
// read from the environment.
#include "activekv/layer_streaming.h"

#include "activekv/home_rows.h"

#include "cuda_batch_copy.h"
#include "cuda_codec_kernels.h"
#include "copy_thread.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace activekv {
namespace {

// Whether the environment sets `name` to `value` (an operator's switches).
bool env_says(const char* name, std::string_view value) {
  const char* set = std::getenv(name);
  return set != nullptr && std::string_view(set) == value;
}

}  // namespace

Result<std::unique_ptr<LayerStreamer>> LayerStreamer::create(
    StreamingGeometry geometry, const std::unordered_map<std::string, at::Tensor>& kv_caches,
    std::int64_t fence_timeout_ms, std::int64_t head_size, std::int64_t workers) {
  // Every layer of a ring buffer must be a view of the same bytes, or staging
  // into the buffer would not reach the layer vLLM's attention reads.
  std::unordered_map<std::int64_t, const void*> ring_ptr;
  std::vector<at::Tensor> streamed_kv;
  for (const auto& name : geometry.streamed()) {
    const at::Tensor& kv = kv_caches.at(name);
    const std::int64_t ring = geometry.ring_of(name);
    const auto [it, first] = ring_ptr.emplace(ring, kv.data_ptr());
    if (!first && it->second != kv.data_ptr()) {
      return Status(ErrorCode::kUnsupportedLayout,
                    "ActiveKV layer streaming: the KV cache of layer '" + name +
                        "' is not a view of ring buffer " + std::to_string(ring) +
                        "; vLLM must carry ActiveKV's patch series (0002, get_kv_cache_regions) "
                        "for streaming");
    }
    streamed_kv.push_back(kv);
  }
  const at::Tensor& first = streamed_kv.front();
  const std::int64_t num_rows = home_rows_for(first.size(0));
  std::unique_ptr<KVCodec> codec;
  if (geometry.homes == Mode::kCompressed) {
    try {
      codec = make_codec(Mode::kCompressed, first.sizes().slice(1).vec(), first.scalar_type(), head_size);
    } catch (const std::invalid_argument& e) {
      return Status(ErrorCode::kUnsupportedLayout,
                    std::string("kv_connector_extra_config['streaming']['homes']='compressed': ") + e.what());
    }
  }
  const std::int64_t layer_bytes =
      codec ? codec->layer_bytes() : first[0].numel() * static_cast<std::int64_t>(first.element_size());
  const std::int64_t num_streamed = geometry.num_streamed();
  auto homes = std::make_unique<HostArena>(num_rows, num_streamed, layer_bytes,
                                           /*pin=*/first.device().type() != c10::DeviceType::CPU,
                                           chunk_bytes_for(num_streamed));
  // Every home starts as zeros (the reference's homes), allocated now: a step
  // never allocates host memory.
  for (const auto& run : homes->all_runs()) {
    for (std::int64_t l = 0; l < num_streamed; ++l) {
      auto view = homes->run_view(l, run);
      if (!view.ok()) return view.status();
      view.value().zero_();
    }
  }
  return std::unique_ptr<LayerStreamer>(new LayerStreamer(std::move(geometry), std::move(streamed_kv),
                                                          std::move(homes), std::move(codec),
                                                          fence_timeout_ms, head_size, workers));
}

LayerStreamer::LayerStreamer(StreamingGeometry geometry, std::vector<at::Tensor> streamed_kv,
                             std::unique_ptr<HostArena> homes, std::unique_ptr<KVCodec> codec,
                             std::int64_t fence_timeout_ms, std::int64_t head_size, std::int64_t workers)
    : geometry_(std::move(geometry)),
      streamed_kv_(std::move(streamed_kv)),
      homes_(std::move(homes)),
      codec_(std::move(codec)),
      fence_timeout_ms_(fence_timeout_ms),
      device_(streamed_kv_.front().device()) {
  const auto names = geometry_.streamed();
  for (std::size_t j = 0; j < names.size(); ++j) streamed_index_[names[j]] = static_cast<std::int64_t>(j);
  const auto n = names.size();
  stage_issued_.assign(n, 0);
  staged_.assign(n, 0);
  stage_fences_.resize(n);
  occupant_writeback_.resize(n);
  home_writeback_.resize(n);
  buffer_last_use_.resize(
      static_cast<std::size_t>(std::min<std::int64_t>(geometry_.ring_size, geometry_.num_streamed())));
  stage_tasks_.assign(n, 0);
  occupant_writeback_tasks_.assign(n, 0);
  poisoned_.assign(n * static_cast<std::size_t>(homes_->num_slots()), 0);
  if (has_streams()) {
    copy_stream_ = c10::impl::VirtualGuardImpl(device_.type())
                       .getStreamFromGlobalPool(device_, tuning_.copy_high_priority);
    device_gather_possible_ = init_device_gather();
    if (device_gather_possible_) copy_method_ = StreamCopy::kDeviceGather;
    batch_copy_possible_ = device_gather_possible_ && init_batch_copy();
    if (batch_copy_possible_ && homes_->layer_bytes() >= detail::kMinBatchCopyBytes) {
      copy_method_ = StreamCopy::kCopyEngineBatch;
    }
    if (codec_ && device_gather_possible_ && device_.is_cuda()) {
      const at::Tensor& kv = streamed_kv_.front();
      if (env_says("ACTIVEKV_FUSED_CODEC", "0")) {  // an operator's way around them
        codec_kernels_missing_ = "turned off by ACTIVEKV_FUSED_CODEC=0";
      } else if (kv.scalar_type() != at::kBFloat16) {
        codec_kernels_missing_ =
            std::string("the KV cache is ") + c10::toString(kv.scalar_type()) + ", not bf16";
      } else {
        const c10::DeviceGuard on_device(device_);
        codec_kernels_ = detail::CudaCodecKernels::load(
            device_.index(), detail::CompressedRows{kv[0].numel(), head_size, homes_->layer_bytes()},
            codec_kernels_missing_);
      }
    }
    apply_copy_thread();
  }
  // CPU copies have landed by the next begin_step (which waits for the copy
  // thread's): nothing is left in flight to settle across steps. With
  // streams, =0 is an operator's (and the vLLM benchmarks' A/B) way back to
  // the host settling each step.
  if (!has_streams() || env_says("ACTIVEKV_SETTLE_ACROSS_STEPS", "0")) {
    tuning_.settle_across_steps = false;
  }
  if (!has_streams()) {
    // "0": an operator's (and an A/B's) way back; "all": every step's copies
    // on the thread, however short (tests, on the tiny model's short prompts).
    if (workers > 1 || env_says("ACTIVEKV_CPU_COPY_THREAD", "0")) tuning_.cpu_copy_thread = false;
    if (env_says("ACTIVEKV_CPU_COPY_THREAD", "all")) tuning_.cpu_copy_thread_min_bytes = 0;
    apply_copy_thread();
  }
}

LayerStreamer::~LayerStreamer() {
  try {
    synchronize();  // copies still landing in the homes must finish before they are freed
  } catch (...) {   // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  copy_thread_.reset();  // joined before the state its tasks use goes
}

}  // namespace activekv
