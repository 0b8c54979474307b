#include "activekv/layer_streaming.h"

#include "step_timing.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <thread>

namespace activekv {
namespace {

using detail::current_stream;
using detail::Stopwatch;

constexpr const char* kStreamingKey = "kv_connector_extra_config['streaming']";

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

Status bad(std::string message) { return {ErrorCode::kInvalidConfig, std::move(message)}; }

// A list of names as Python's repr of a list of str writes it.
std::string python_list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out + "]";
}


// The widest element a home row divides into: a gather kernel's thread moves
// one element, and wide elements make each warp read long runs of the row.
at::ScalarType word_type_for(std::int64_t row_bytes) {
  if (row_bytes % 16 == 0) return at::kComplexDouble;  // 16 bytes, bit patterns only
  if (row_bytes % 8 == 0) return at::kLong;
  if (row_bytes % 4 == 0) return at::kInt;
  return at::kByte;
}

std::int64_t run_bytes(const std::vector<SlotRun>& runs, std::int64_t layer_bytes) {
  std::int64_t n = 0;
  for (const auto& run : runs) n += run.count;
  return n * layer_bytes;
}

}  // namespace

// ---- geometry ------------------------------------------------------------------

Result<StreamingGeometry> StreamingGeometry::plan(const StreamingConfig& config,
                                                  const std::vector<std::string>& layer_names) {
  const auto n = static_cast<std::int64_t>(layer_names.size());
  const std::int64_t r = config.resident_layers;
  const std::int64_t k = config.ring_size;
  if (r >= n) {
    return bad(std::string(kStreamingKey) + "['resident_layers']: " + std::to_string(r) +
               " leaves no layer to stream; this model has " + std::to_string(n) +
               " KV cache layers, so it accepts 0.." + std::to_string(n - 1));
  }
  if (r + k >= n) {
    return bad(std::string(kStreamingKey) + ": resident_layers + ring_size = " +
               std::to_string(r) + " + " + std::to_string(k) + " must be below the model's " +
               std::to_string(n) +
               " KV cache layers, or streaming holds no more blocks than the device does without "
               "it; lower resident_layers or ring_size");
  }
  return StreamingGeometry{layer_names, r, k};
}

std::vector<std::string> StreamingGeometry::resident() const {
  return {layer_names.begin(), layer_names.begin() + resident_layers};
}

std::vector<std::string> StreamingGeometry::streamed() const {
  return {layer_names.begin() + resident_layers, layer_names.end()};
}

std::vector<std::vector<std::string>> StreamingGeometry::regions() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& name : resident()) out.push_back({name});
  const auto streamed_layers = streamed();
  for (std::int64_t ring = 0; ring < ring_size; ++ring) {
    std::vector<std::string> region;
    for (auto j = static_cast<std::size_t>(ring); j < streamed_layers.size();
         j += static_cast<std::size_t>(ring_size)) {
      region.push_back(streamed_layers[j]);
    }
    out.push_back(std::move(region));
  }
  return out;
}

std::int64_t StreamingGeometry::streamed_index(const std::string& name) const {
  const auto it = std::find(layer_names.begin() + resident_layers, layer_names.end(), name);
  if (it == layer_names.end()) return -1;
  return (it - layer_names.begin()) - resident_layers;
}

std::int64_t StreamingGeometry::ring_of(const std::string& name) const {
  const std::int64_t j = streamed_index(name);
  if (j < 0) throw std::invalid_argument("layer '" + name + "' is not streamed");
  return j % ring_size;
}

Status check_streamable(const StreamableFacts& facts) {
  const auto refuse = [](const std::string& why) {
    return bad(std::string(kStreamingKey) + ": layer streaming cannot serve " + why);
  };
  if (facts.use_mla) {
    return refuse("a model with multi-head latent attention (MLA); turn streaming off for it");
  }
  if (!facts.one_full_attention_group) {
    return refuse("KV cache groups " + python_list(facts.group_kinds) +
                  ": it needs one full-attention group (no sliding-window or hybrid groups)");
  }
  if (facts.sliding_window) {
    return refuse("sliding-window attention; it needs full attention in every layer");
  }
  if (facts.kv_cache_layers != facts.attention_layers) {
    return refuse("a model whose layers share KV (" + std::to_string(facts.attention_layers) +
                  " attention layers, " + std::to_string(facts.kv_cache_layers) +
                  " with a KV cache of their own)");
  }
  if (facts.speculative) {
    return refuse("speculative decoding (speculative_config is set); turn one of them off");
  }
  if (facts.pipeline_parallel_size > 1) {
    return refuse("pipeline parallelism (pipeline_parallel_size " +
                  std::to_string(facts.pipeline_parallel_size) + "); use tensor parallelism");
  }
  return Status::Ok();
}

StartupReport StartupReport::of(const StreamingGeometry& geometry, std::int64_t num_blocks,
                                std::int64_t block_size, std::int64_t layer_bytes,
                                std::int64_t max_model_len) {
  const std::int64_t regions = geometry.resident_layers + geometry.ring_size;
  const std::int64_t streamed = geometry.num_streamed();
  StartupReport r;
  r.resident_layers = geometry.resident_layers;
  r.streamed_layers = streamed;
  r.ring_size = geometry.ring_size;
  r.device_blocks = num_blocks;
  r.device_blocks_without = num_blocks * regions / static_cast<std::int64_t>(geometry.layer_names.size());
  r.block_size = block_size;
  r.host_bytes = num_blocks * streamed * layer_bytes;
  r.decode_step_bytes = cdiv(max_model_len, block_size) * streamed * layer_bytes;
  return r;
}

std::string StartupReport::line() const {
  const std::int64_t tokens = device_blocks * block_size;
  const std::int64_t without = device_blocks_without * block_size;
  return "ActiveKV layer streaming: " + std::to_string(resident_layers) + " resident + " +
         std::to_string(streamed_layers) + " streamed layers, ring of " +
         std::to_string(ring_size) + "; the device holds " + std::to_string(device_blocks) +
         " blocks (" + std::to_string(tokens) + " tokens), " +
         std::to_string(without / block_size) + " blocks (" + std::to_string(without) +
         " tokens) without streaming; host memory reserved for the streamed layers " +
         std::to_string(host_bytes) + " bytes per worker; a full-context decode step moves " +
         std::to_string(decode_step_bytes) + " bytes host->device per worker";
}

Status StartupReport::check_host_memory(std::int64_t capacity_bytes,
                                        std::int64_t host_memory_bytes) const {
  if (capacity_bytes + host_bytes <= host_memory_bytes) return Status::Ok();
  return bad("kv_connector_extra_config['capacity_bytes']=" + std::to_string(capacity_bytes) +
             " plus the streamed layers' homes (" + std::to_string(host_bytes) + " bytes for " +
             std::to_string(device_blocks) + " blocks) exceed this host's memory (" +
             std::to_string(host_memory_bytes) +
             " bytes); lower capacity_bytes, raise "
             "kv_connector_extra_config['streaming']['resident_layers'], or give vLLM fewer KV "
             "cache blocks (gpu_memory_utilization, num_gpu_blocks_override)");
}

// ---- worker-side streamer ---------------------------------------------------------

Result<std::unique_ptr<LayerStreamer>> LayerStreamer::create(
    StreamingGeometry geometry, const std::unordered_map<std::string, at::Tensor>& kv_caches,
    std::int64_t fence_timeout_ms) {
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
  const std::int64_t num_blocks = first.size(0);
  const std::int64_t layer_bytes = first[0].numel() * static_cast<std::int64_t>(first.element_size());
  const std::int64_t num_streamed = geometry.num_streamed();
  auto homes = std::make_unique<HostArena>(num_blocks, num_streamed, layer_bytes,
                                           /*pin=*/first.device().type() != c10::DeviceType::CPU,
                                           chunk_bytes_for(num_streamed));
  // Every home starts as zeros (the reference's homes), allocated now: a step
  // never allocates host memory.
  std::vector<std::int64_t> all(static_cast<std::size_t>(num_blocks));
  for (std::int64_t b = 0; b < num_blocks; ++b) all[static_cast<std::size_t>(b)] = b;
  for (const auto& run : homes->runs(all)) {
    for (std::int64_t l = 0; l < num_streamed; ++l) {
      auto view = homes->run_view(l, run);
      if (!view.ok()) return view.status();
      view.value().zero_();
    }
  }
  return std::unique_ptr<LayerStreamer>(
      new LayerStreamer(std::move(geometry), std::move(streamed_kv), std::move(homes), fence_timeout_ms));
}

LayerStreamer::LayerStreamer(StreamingGeometry geometry, std::vector<at::Tensor> streamed_kv,
                             std::unique_ptr<HostArena> homes, std::int64_t fence_timeout_ms)
    : geometry_(std::move(geometry)),
      streamed_kv_(std::move(streamed_kv)),
      homes_(std::move(homes)),
      fence_timeout_ms_(fence_timeout_ms),
      device_(streamed_kv_.front().device()) {
  const auto names = geometry_.streamed();
  for (std::size_t j = 0; j < names.size(); ++j) streamed_index_[names[j]] = static_cast<std::int64_t>(j);
  const auto n = names.size();
  stage_issued_.assign(n, 0);
  staged_.assign(n, 0);
  stage_fences_.resize(n);
  poisoned_.assign(n * static_cast<std::size_t>(homes_->num_slots()), 0);
  if (has_streams()) {
    copy_stream_ = c10::impl::VirtualGuardImpl(device_.type())
                       .getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    device_gather_possible_ = init_device_gather();
    if (device_gather_possible_) copy_method_ = StreamCopy::kDeviceGather;
  }
}

bool LayerStreamer::init_device_gather() {
  // Pinned host memory is device-addressable on CUDA (unified addressing: the
  // host pointer is the device pointer) and XPU (USM host allocations).
  if (device_.type() != c10::DeviceType::CUDA && device_.type() != c10::DeviceType::XPU) return false;
  // A block must be one contiguous row of the buffer, as it is of its home.
  for (const auto& kv : streamed_kv_) {
    if (!kv.is_contiguous()) return false;
  }
  const std::int64_t row_bytes = homes_->layer_bytes();
  const auto layers = static_cast<std::int64_t>(streamed_kv_.size());
  // One strided view over every chunk: its row stride (the grain) divides
  // every row's offset from the lowest chunk.
  for (std::int64_t c = 0; c < homes_->num_chunks(); ++c) {
    chunk_starts_.push_back(reinterpret_cast<std::uintptr_t>(homes_->chunk_view(0, c).value().data_ptr()));
  }
  homes_base_ = *std::min_element(chunk_starts_.begin(), chunk_starts_.end());
  std::uintptr_t end = 0;
  auto grain = static_cast<std::uintptr_t>(row_bytes);
  for (std::int64_t c = 0; c < homes_->num_chunks(); ++c) {
    const at::Tensor last = homes_->chunk_view(layers - 1, c).value();
    end = std::max(end, reinterpret_cast<std::uintptr_t>(last.data_ptr()) +
                            static_cast<std::uintptr_t>(last.numel()));
    grain = std::gcd(grain, chunk_starts_[static_cast<std::size_t>(c)] - homes_base_);
  }
  homes_grain_ = static_cast<std::int64_t>(grain);
  word_type_ = word_type_for(homes_grain_);  // divides the grain, so the rows too
  const auto word = static_cast<std::int64_t>(c10::elementSize(word_type_));
  const std::int64_t words = row_bytes / word;
  const auto on_device = at::TensorOptions().dtype(word_type_).device(device_);
  const auto view_rows = static_cast<std::int64_t>((end - homes_base_) / grain) - row_bytes / homes_grain_ + 1;
  all_homes_ = at::for_blob(reinterpret_cast<void*>(homes_base_), {view_rows, words})
                   .strides({homes_grain_ / word, 1})
                   .options(on_device)
                   .target_device(device_)
                   .make_tensor();
  home_rows_.assign(streamed_kv_.size(), {});
  for (std::size_t j = 0; j < streamed_kv_.size(); ++j) {
    for (std::int64_t c = 0; c < homes_->num_chunks(); ++c) {
      auto bytes = homes_->chunk_view(static_cast<std::int64_t>(j), c);
      if (!bytes.ok()) throw std::runtime_error(bytes.status().error());
      // Not owning: the homes outlive every copy (synchronize before they go).
      home_rows_[j].push_back(at::for_blob(bytes.value().data_ptr(), {bytes.value().size(0), words})
                                  .options(on_device)
                                  .target_device(device_)
                                  .make_tensor());
    }
  }
  make_pieces();
  return true;
}

void LayerStreamer::make_pieces() {
  synchronize();
  const std::int64_t row_bytes = homes_->layer_bytes();
  const std::int64_t words = row_bytes / static_cast<std::int64_t>(c10::elementSize(word_type_));
  const std::int64_t piece_rows =
      std::clamp<std::int64_t>(tuning_.piece_bytes / row_bytes, 1, homes_->num_slots());
  pieces_.clear();
  for (std::int64_t k = 0; k < tuning_.pieces; ++k) {
    pieces_.push_back(at::empty({piece_rows, words}, at::TensorOptions().dtype(word_type_).device(device_)));
  }
  piece_free_.clear();
  piece_free_.resize(pieces_.size());
  next_piece_ = 0;
  gather_stream_ = c10::impl::VirtualGuardImpl(device_.type())
                       .getStreamFromGlobalPool(device_, tuning_.gather_high_priority);
}

void LayerStreamer::set_tuning(const StreamingTuning& tuning) {
  if (tuning.pieces < 1 || tuning.piece_bytes < 1 || tuning.copy_engine_run < 1) {
    throw std::invalid_argument("set_tuning: pieces, piece_bytes and copy_engine_run must be positive");
  }
  tuning_ = tuning;
  if (device_gather_possible_) make_pieces();
}

void LayerStreamer::set_copy_method(StreamCopy method) {
  if (method == StreamCopy::kDeviceGather && !device_gather_possible_) {
    throw std::invalid_argument(
        "kDeviceGather needs a CUDA or XPU device and ring buffers whose blocks are whole rows");
  }
  copy_method_ = method;
}

at::Tensor LayerStreamer::as_words(const at::Tensor& blocks) const {
  return blocks.reshape({blocks.size(0), -1}).view(at::kByte).view(word_type_);
}

at::Tensor LayerStreamer::as_blocks(const at::Tensor& words, const at::Tensor& like) const {
  std::vector<std::int64_t> shape = like.sizes().vec();
  shape[0] = words.size(0);
  return words.view(at::kByte).view(like.scalar_type()).view(shape);
}

LayerStreamer::DeviceIndex LayerStreamer::device_index(const std::vector<std::int64_t>& blocks) const {
  // Uploaded on the current stream (a device stream of ours).
  const auto n = static_cast<std::int64_t>(blocks.size());
  const std::int64_t per_chunk = homes_->slots_per_chunk();
  DeviceIndex out;
  const std::int64_t row_bytes = homes_->layer_bytes();
  at::Tensor host = at::empty({4, n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* ids = host.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t b = blocks[static_cast<std::size_t>(i)];
    const std::int64_t chunk = b / per_chunk;
    const std::int64_t row = b - chunk * per_chunk;
    ids[i] = b;
    ids[n + i] = row;
    if (out.spans.empty() || out.spans.back().chunk != chunk) out.spans.push_back({chunk, i, 0});
    ++out.spans.back().count;
    // The chunk is [layers, rows_in_chunk, row_bytes].
    const std::int64_t rows_in_chunk = std::min(per_chunk, homes_->num_slots() - chunk * per_chunk);
    const std::uintptr_t start = chunk_starts_[static_cast<std::size_t>(chunk)];
    ids[2 * n + i] = static_cast<std::int64_t>(start - homes_base_) / homes_grain_ + row * row_bytes / homes_grain_;
    ids[3 * n + i] = rows_in_chunk * row_bytes / homes_grain_;
  }
  const at::Tensor on_device = host.to(device_, /*non_blocking=*/true);
  out.blocks = on_device[0];
  out.local = on_device[1];
  out.base = on_device[2];
  out.step = on_device[3];
  return out;
}

void LayerStreamer::gather_stage(std::int64_t streamed) {
  // Every byte crosses the bus on the gather stream, into staging pieces: the
  // long runs by the copy engine, the other blocks by one gather kernel per
  // piece. The copy stream then scatters each piece into the ring, in its
  // order after the buffer's previous occupant's write-back. So the bus never
  // waits for the ring, only for a free piece.
  const auto j = static_cast<std::size_t>(streamed);
  at::Tensor& kv = streamed_kv_[j];
  c10::impl::VirtualGuardImpl guard_impl(device_.type());
  if (!stage_index_) {
    const c10::StreamGuard on_gather_stream(*gather_stream_);
    stage_index_ = device_index(piece_order_);
    // The copy stream scatters by these ids too (after waiting for a piece
    // read on the gather stream, so after the upload).
    guard_impl.recordDataPtrOnStream(stage_index_->blocks.storage().data_ptr(), *copy_stream_);
  }
  const DeviceIndex& index = *stage_index_;
  const auto n = static_cast<std::int64_t>(piece_order_.size());
  const std::int64_t piece_rows = pieces_.front().size(0);
  at::Tensor rows_of_layer;
  if (run_blocks_ < n) {
    const c10::StreamGuard on_gather_stream(*gather_stream_);
    rows_of_layer = at::add(index.base, index.step, streamed);
  }
  std::size_t run = 0;           // the first copy-engine run not yet fully read
  std::int64_t run_offset = 0;   // rows of it already read
  for (std::int64_t first = 0; first < n; first += piece_rows) {
    const std::int64_t rows = std::min(piece_rows, n - first);
    const std::size_t k = next_piece_++ % pieces_.size();
    const at::Tensor& piece = pieces_[k];
    c10::Event read(device_.type());
    {
      const c10::StreamGuard on_gather_stream(*gather_stream_);
      if (piece_free_[k]) piece_free_[k]->block(*gather_stream_);  // its last scatter is done
      const at::Tensor piece_bytes = piece.view(at::kByte);
      std::int64_t row = first;
      while (row < std::min(first + rows, run_blocks_)) {  // copy-engine rows of this piece
        const SlotRun& r = copy_engine_runs_[run];
        const std::int64_t count = std::min(r.count - run_offset, first + rows - row);
        const SlotRun part{r.first + run_offset, count, 0};
        piece_bytes.narrow(0, row - first, count)
            .copy_(homes_->run_view(streamed, part).value(), /*non_blocking=*/true);
        row += count;
        run_offset += count;
        if (run_offset == r.count) {
          ++run;
          run_offset = 0;
        }
      }
      if (row < first + rows) {  // gathered rows of this piece
        at::Tensor out = piece.narrow(0, row - first, first + rows - row);
        at::index_select_out(out, all_homes_, 0, rows_of_layer.narrow(0, row, first + rows - row));
      }
      read.record(*gather_stream_);
    }
    const c10::StreamGuard on_copy_stream(*copy_stream_);
    read.block(*copy_stream_);
    kv.index_copy_(0, index.blocks.narrow(0, first, rows), as_blocks(piece.narrow(0, 0, rows), kv));
    piece_free_[k].emplace(device_.type());
    piece_free_[k]->record(*copy_stream_);
  }
}

void LayerStreamer::gather_write_back(std::int64_t streamed) {
  // On the copy stream (the caller's guard).
  const auto j = static_cast<std::size_t>(streamed);
  if (!writeback_index_) writeback_index_ = device_index(writeback_blocks_);
  const DeviceIndex& index = *writeback_index_;
  const at::Tensor rows = as_words(streamed_kv_[j].index_select(0, index.blocks));
  for (const auto& span : index.spans) {
    home_rows_[j][static_cast<std::size_t>(span.chunk)].index_copy_(
        0, index.local.narrow(0, span.offset, span.count), rows.narrow(0, span.offset, span.count));
  }
}

LayerStreamer::~LayerStreamer() {
  try {
    synchronize();  // copies still landing in the homes must finish before they are freed
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
}

void LayerStreamer::synchronize() {
  if (gather_stream_) gather_stream_->synchronize();
  if (copy_stream_) copy_stream_->synchronize();
}

at::Tensor LayerStreamer::home_view(std::int64_t streamed, const SlotRun& run) {
  auto bytes = homes_->run_view(streamed, run);
  if (!bytes.ok()) throw std::runtime_error(bytes.status().error());
  const at::Tensor& kv = streamed_kv_[static_cast<std::size_t>(streamed)];
  std::vector<std::int64_t> shape = kv.sizes().vec();
  shape[0] = run.count;
  return bytes.value().view(kv.scalar_type()).view(shape);
}

void LayerStreamer::begin_step(std::vector<std::int64_t> stage_blocks,
                               std::vector<std::int64_t> writeback_blocks) {
  settle_writebacks();
  stage_blocks_ = std::move(stage_blocks);
  writeback_blocks_ = std::move(writeback_blocks);
  stage_runs_ = homes_->runs(stage_blocks_);
  writeback_runs_ = homes_->runs(writeback_blocks_);
  copy_engine_runs_.clear();
  piece_order_.clear();
  if (copy_method_ == StreamCopy::kDeviceGather) {
    // The pieces' rows: the long runs' blocks first, then the others.
    std::vector<std::int64_t> gathered;
    for (const auto& run : stage_runs_) {
      auto& to = run.count >= tuning_.copy_engine_run ? piece_order_ : gathered;
      if (run.count >= tuning_.copy_engine_run) copy_engine_runs_.push_back(run);
      for (std::int64_t b = run.first; b < run.first + run.count; ++b) to.push_back(b);
    }
    run_blocks_ = static_cast<std::int64_t>(piece_order_.size());
    piece_order_.insert(piece_order_.end(), gathered.begin(), gathered.end());
  }
  stage_index_.reset();
  writeback_index_.reset();
  std::fill(stage_issued_.begin(), stage_issued_.end(), 0);
  std::fill(staged_.begin(), staged_.end(), 0);
  for (auto& fence : stage_fences_) fence.reset();
  const auto num_blocks = static_cast<std::size_t>(homes_->num_slots());
  for (const auto block : stage_blocks_) {
    for (std::size_t l = 0; l < streamed_kv_.size(); ++l) {
      if (poisoned_[l * num_blocks + static_cast<std::size_t>(block)]) {
        poisoned_stages_.push_back(block);
        break;
      }
    }
  }
}

void LayerStreamer::settle_writebacks() {
  // In issue order (one copy stream). Bounded by each write-back's deadline:
  // the next step's staging reads these homes, so their outcome must be known
  // before it is planned. Simple and correct; overlap is later work.
  const auto num_blocks = static_cast<std::size_t>(homes_->num_slots());
  for (auto& p : pending_writebacks_) {
    const bool done = detail::fence_done_by(p.fence, p.deadline);
    for (const auto block : p.blocks) {
      // A write-back that completed rewrote the whole home row, which clears
      // an earlier write-back's poison; one with an unknown outcome poisons it.
      poisoned_[p.layer * num_blocks + static_cast<std::size_t>(block)] = done ? 0 : 1;
    }
  }
  pending_writebacks_.clear();
}

void LayerStreamer::start(Telemetry& stats) {
  if (!has_streams() || stage_blocks_.empty()) return;
  // The ring's previous occupants (the last layers of the previous step, and
  // whatever vLLM did to the cache before this step) are done with it.
  c10::Event compute_done(device_.type());
  compute_done.record(current_stream(device_));
  compute_done.block(*copy_stream_);
  const auto first = std::min<std::int64_t>(geometry_.ring_size, geometry_.num_streamed());
  for (std::int64_t j = 0; j < first; ++j) issue_stage(j, stats);
}

void LayerStreamer::issue_stage(std::int64_t streamed, Telemetry& stats) {
  const auto j = static_cast<std::size_t>(streamed);
  stage_issued_[j] = 1;
  if (stage_blocks_.empty()) return;
  const Stopwatch t;
  at::Tensor& kv = streamed_kv_[j];
  if (copy_method_ == StreamCopy::kDeviceGather) gather_stage(streamed);
  {
    const c10::StreamGuard on_copy_stream(*copy_stream_);
    if (copy_method_ == StreamCopy::kRuns) {
      for (const auto& run : stage_runs_) {
        kv.narrow(0, run.first, run.count).copy_(home_view(streamed, run), /*non_blocking=*/true);
      }
    }
    stage_fences_[j].emplace(device_.type());
    stage_fences_[j]->record(*copy_stream_);
  }
  stats.add(Counter::kStreamedBytesToDevice, run_bytes(stage_runs_, homes_->layer_bytes()));
  stats.add(Counter::kStreamUs, t.us());
}

void LayerStreamer::stage(const std::string& name, Telemetry& stats) {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) return;
  const std::int64_t j = it->second;
  const auto ju = static_cast<std::size_t>(j);
  if (staged_[ju]) return;
  staged_[ju] = 1;
  if (stage_blocks_.empty()) return;
  if (!has_streams()) {
    const Stopwatch t;
    at::Tensor& kv = streamed_kv_[ju];
    for (const auto& run : stage_runs_) kv.narrow(0, run.first, run.count).copy_(home_view(j, run));
    stats.add(Counter::kStreamedBytesToDevice, run_bytes(stage_runs_, homes_->layer_bytes()));
    stats.add(Counter::kStreamUs, t.us());
    return;
  }
  if (!stage_issued_[ju]) {
    // Not issued ahead (start or the write-back K layers before did not run):
    // the compute stream has queued every earlier layer's attention by now.
    c10::Event compute_done(device_.type());
    compute_done.record(current_stream(device_));
    compute_done.block(*copy_stream_);
    issue_stage(j, stats);
  }
  stage_fences_[ju]->block(current_stream(device_));
}

void LayerStreamer::write_back(const std::string& name, Telemetry& stats) {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) return;
  const std::int64_t j = it->second;
  at::Tensor& kv = streamed_kv_[static_cast<std::size_t>(j)];
  if (!has_streams()) {
    if (writeback_blocks_.empty()) return;
    const Stopwatch t;
    for (const auto& run : writeback_runs_) home_view(j, run).copy_(kv.narrow(0, run.first, run.count));
    stats.add(Counter::kStreamedBytesToHost, run_bytes(writeback_runs_, homes_->layer_bytes()));
    stats.add(Counter::kStreamUs, t.us());
    return;
  }
  // Always: the staging of layer j + K into this buffer follows on the copy
  // stream and must come after this layer's attention.
  c10::Event attended(device_.type());
  attended.record(current_stream(device_));
  attended.block(*copy_stream_);
  if (writeback_blocks_.empty()) return;
  const Stopwatch t;
  PendingWriteback p{writeback_blocks_, static_cast<std::size_t>(j), c10::Event(device_.type()),
                     std::chrono::steady_clock::now() + std::chrono::milliseconds(fence_timeout_ms_)};
  {
    const c10::StreamGuard on_copy_stream(*copy_stream_);
    if (copy_method_ == StreamCopy::kDeviceGather) {
      gather_write_back(j);
    } else {
      for (const auto& run : writeback_runs_) {
        home_view(j, run).copy_(kv.narrow(0, run.first, run.count), /*non_blocking=*/true);
      }
    }
    p.fence.record(*copy_stream_);
  }
  pending_writebacks_.push_back(std::move(p));
  stats.add(Counter::kStreamedBytesToHost, run_bytes(writeback_runs_, homes_->layer_bytes()));
  stats.add(Counter::kStreamUs, t.us());
}

void LayerStreamer::stage_ahead(const std::string& name, const c10::Event* gathered,
                                Telemetry& stats) {
  if (!has_streams()) return;
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) return;
  // The store save's gather reads this buffer too: the next occupant waits for it.
  if (gathered != nullptr) gathered->block(*copy_stream_);
  const std::int64_t next = it->second + geometry_.ring_size;
  if (next < geometry_.num_streamed() && !stage_issued_[static_cast<std::size_t>(next)]) {
    issue_stage(next, stats);
  }
}

std::string LayerStreamer::home_bytes(const std::string& name) {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) throw std::invalid_argument("layer '" + name + "' is not streamed");
  synchronize();
  std::vector<std::int64_t> all(static_cast<std::size_t>(homes_->num_slots()));
  for (std::size_t b = 0; b < all.size(); ++b) all[b] = static_cast<std::int64_t>(b);
  std::string out;
  for (const auto& run : homes_->runs(all)) {
    auto view = homes_->run_view(it->second, run);
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
