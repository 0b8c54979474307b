// LayerStreamer (layer_streaming.h): made with its ring's copier for the
// ring's device, it keeps the step's blocks, the poisoned stages and which
// layers are streamed, and sends each of vLLM's per-layer calls to the copier
// (src/ring_copies.h).
#include "activekv/layer_streaming.h"

#include "activekv/home_rows.h"
#include "activekv/step_runs.h"

#include "cpu_ring_copies.h"
#include "device_ring_copies.h"
#include "streamed_ring.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <utility>

namespace activekv {

const char* copy_method_name(StreamCopy method) {
  switch (method) {
    case StreamCopy::kRuns:
      return "runs";
    case StreamCopy::kDeviceGather:
      return "gather";
    case StreamCopy::kCopyEngineBatch:
      return "batch";
  }
  return "?";
}

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
  auto ring = std::make_unique<detail::StreamedRing>(std::move(geometry), std::move(streamed_kv),
                                                     std::move(homes), std::move(codec));
  return std::unique_ptr<LayerStreamer>(
      new LayerStreamer(std::move(ring), fence_timeout_ms, head_size, workers));
}

LayerStreamer::LayerStreamer(std::unique_ptr<detail::StreamedRing> ring, std::int64_t fence_timeout_ms,
                             std::int64_t head_size, std::int64_t workers)
    : ring_(std::move(ring)) {
  const auto names = ring_->geometry.streamed();
  for (std::size_t j = 0; j < names.size(); ++j) streamed_index_[names[j]] = static_cast<std::int64_t>(j);
  staged_.assign(names.size(), 0);
  if (ring_->on_device()) {
    copies_ = std::make_unique<detail::DeviceRingCopies>(*ring_, fence_timeout_ms, head_size);
  } else {
    copies_ = std::make_unique<detail::CpuRingCopies>(*ring_, workers);
  }
}

LayerStreamer::~LayerStreamer() {
  copies_.reset();  // waits for the copies still landing in the homes, before they are freed
}

const StreamingGeometry& LayerStreamer::geometry() const { return ring_->geometry; }
HostArena& LayerStreamer::homes() { return *ring_->homes; }
StreamCopy LayerStreamer::copy_method() const { return copies_->copy_method(); }
bool LayerStreamer::can_copy_by(StreamCopy method) const { return copies_->can_copy_by(method); }
void LayerStreamer::set_copy_method(StreamCopy method) { copies_->set_copy_method(method); }
const StreamingTuning& LayerStreamer::tuning() const { return copies_->tuning(); }
const std::vector<int>& LayerStreamer::copy_thread_cpus() const { return copies_->copy_thread_cpus(); }
bool LayerStreamer::has_fused_codec() const { return copies_->has_fused_codec(); }
const std::string& LayerStreamer::fused_codec_missing() const { return copies_->fused_codec_missing(); }
bool LayerStreamer::moves_blocks_this_step() const {
  return !ring_->stage_blocks.empty() || !ring_->writeback_blocks.empty();
}

void LayerStreamer::set_tuning(const StreamingTuning& tuning) {
  if (tuning.pieces < 1 || tuning.piece_bytes < 1 || tuning.copy_engine_run < 1 ||
      tuning.batch_first_call < 0 || tuning.cpu_copy_thread_min_bytes < 0) {
    throw std::invalid_argument(
        "set_tuning: pieces, piece_bytes and copy_engine_run must be positive, batch_first_call and "
        "cpu_copy_thread_min_bytes not negative");
  }
  copies_->synchronize();
  copies_->set_tuning(tuning);
}

void LayerStreamer::check_rows(const std::vector<std::int64_t>& blocks,
                               const std::vector<std::int64_t>& rows) const {
  if (rows.size() != blocks.size()) {
    throw std::out_of_range(std::to_string(rows.size()) + " home rows for " + std::to_string(blocks.size()) +
                            " streamed blocks");
  }
  for (const auto row : rows) {
    if (row < 0 || row >= ring_->homes->num_slots()) {
      throw std::out_of_range("home row " + std::to_string(row) + " out of range (the homes have " +
                              std::to_string(ring_->homes->num_slots()) + " rows)");
    }
  }
}

void LayerStreamer::begin_step(std::vector<std::int64_t> stage_blocks, std::vector<std::int64_t> stage_rows,
                               std::vector<std::int64_t> writeback_blocks,
                               std::vector<std::int64_t> writeback_rows) {
  copies_->end_step();
  detail::StreamedRing& r = *ring_;
  r.stage_blocks = std::move(stage_blocks);
  r.stage_rows = std::move(stage_rows);
  r.writeback_blocks = std::move(writeback_blocks);
  r.writeback_rows = std::move(writeback_rows);
  // Compressed homes: the blocks written and not staged are fresh.
  detail::WrittenOnly written_only = detail::written_not_staged(r.stage_blocks, r.writeback_blocks);
  r.stage_writeback_disjoint = written_only.all;
  r.fresh_blocks = r.codec ? std::move(written_only.blocks) : std::vector<std::int64_t>{};
  copies_->plan_step();
  std::fill(staged_.begin(), staged_.end(), 0);
  note_poisoned_stages();
}

void LayerStreamer::note_poisoned_stages() {
  const auto num_rows = static_cast<std::size_t>(ring_->homes->num_slots());
  for (std::size_t i = 0; i < ring_->stage_rows.size(); ++i) {
    for (std::size_t l = 0; l < ring_->kv.size(); ++l) {
      if (ring_->poisoned[l * num_rows + static_cast<std::size_t>(ring_->stage_rows[i])]) {
        poisoned_stages_.push_back(ring_->stage_blocks[i]);
        break;
      }
    }
  }
}

std::optional<std::int64_t> LayerStreamer::streamed(const std::string& name) const {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) return std::nullopt;
  return it->second;
}

void LayerStreamer::start(Telemetry& stats) { copies_->start(stats); }

void LayerStreamer::stage(const std::string& name, Telemetry& stats) {
  const auto j = streamed(name);
  if (!j) return;
  char& staged = staged_[static_cast<std::size_t>(*j)];
  if (staged) return;
  staged = 1;
  copies_->stage(*j, stats);
}

void LayerStreamer::write_back(const std::string& name, Telemetry& stats) {
  if (const auto j = streamed(name)) copies_->write_back(*j, stats);
}

void LayerStreamer::stage_ahead(const std::string& name, std::optional<c10::Event> gathered,
                                Telemetry& stats) {
  if (const auto j = streamed(name)) copies_->stage_ahead(*j, std::move(gathered), stats);
}

void LayerStreamer::synchronize() { copies_->synchronize(); }

std::string LayerStreamer::home_bytes(const std::string& name) {
  const auto j = streamed(name);
  if (!j) throw std::invalid_argument("layer '" + name + "' is not streamed");
  synchronize();
  std::string out;
  for (const auto& run : ring_->homes->all_runs()) {
    auto view = ring_->homes->run_view(*j, run);
    if (!view.ok()) throw std::runtime_error(view.status().error());
    const at::Tensor bytes = view.value().contiguous();
    out.append(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
  }
  return out;
}

std::vector<std::int64_t> LayerStreamer::take_poisoned_stages() {
  auto out = std::move(poisoned_stages_);
  poisoned_stages_.clear();
  return out;
}

}  // namespace activekv
