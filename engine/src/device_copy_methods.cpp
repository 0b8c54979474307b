// A device's copy methods (device_ring_copies.h) past kRuns. kDeviceGather: the device
// reads and writes the pinned homes itself, through one strided view over
// every home chunk, in staging pieces the copy stream scatters into the ring.
// kCopyEngineBatch: the copy engines move each run between the homes and the
// ring, a layer's runs in one batch (compressed homes: between the homes and
// the staging pieces, a piece's runs in one batch).
#include "device_ring_copies.h"

#include "cuda_batch_copy.h"
#include "cuda_codec_kernels.h"
#include "step_timing.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace activekv::detail {
namespace {

// The widest element a home row divides into: a gather kernel's thread moves
// one element, and wide elements make each warp read long runs of the row.
at::ScalarType word_type_for(std::int64_t row_bytes) {
  if (row_bytes % 16 == 0) return at::kComplexDouble;  // 16 bytes, bit patterns only
  if (row_bytes % 8 == 0) return at::kLong;
  if (row_bytes % 4 == 0) return at::kInt;
  return at::kByte;
}

}  // namespace

bool DeviceRingCopies::init_device_gather() {
  // Pinned host memory is device-addressable on CUDA (unified addressing: the
  // host pointer is the device pointer) and XPU (USM host allocations).
  if (ring_.device.type() != c10::DeviceType::CUDA && ring_.device.type() != c10::DeviceType::XPU)
    return false;
  // A block must be one contiguous row of the buffer, as it is of its home.
  for (const auto& kv : ring_.kv) {
    if (!kv.is_contiguous()) return false;
  }
  const std::int64_t row_bytes = ring_.homes->layer_bytes();
  const auto layers = static_cast<std::int64_t>(ring_.kv.size());
  // One strided view over every chunk: its row stride (the grain) divides
  // every row's offset from the lowest chunk.
  for (std::int64_t c = 0; c < ring_.homes->num_chunks(); ++c) {
    chunk_starts_.push_back(
        reinterpret_cast<std::uintptr_t>(ring_.homes->chunk_view(0, c).value().data_ptr()));
  }
  homes_base_ = *std::min_element(chunk_starts_.begin(), chunk_starts_.end());
  std::uintptr_t end = 0;
  auto grain = static_cast<std::uintptr_t>(row_bytes);
  for (std::int64_t c = 0; c < ring_.homes->num_chunks(); ++c) {
    const at::Tensor last = ring_.homes->chunk_view(layers - 1, c).value();
    end = std::max(
        end, reinterpret_cast<std::uintptr_t>(last.data_ptr()) + static_cast<std::uintptr_t>(last.numel()));
    grain = std::gcd(grain, chunk_starts_[static_cast<std::size_t>(c)] - homes_base_);
  }
  homes_grain_ = static_cast<std::int64_t>(grain);
  word_type_ = word_type_for(homes_grain_);  // divides the grain, so the rows too
  const auto word = static_cast<std::int64_t>(c10::elementSize(word_type_));
  const std::int64_t words = row_bytes / word;
  const auto on_device = at::TensorOptions().dtype(word_type_).device(ring_.device);
  const auto view_rows =
      static_cast<std::int64_t>((end - homes_base_) / grain) - row_bytes / homes_grain_ + 1;
  all_homes_ = at::for_blob(reinterpret_cast<void*>(homes_base_), {view_rows, words})
                   .strides({homes_grain_ / word, 1})
                   .options(on_device)
                   .target_device(ring_.device)
                   .make_tensor();
  home_rows_.assign(ring_.kv.size(), {});
  for (std::size_t j = 0; j < ring_.kv.size(); ++j) {
    for (std::int64_t c = 0; c < ring_.homes->num_chunks(); ++c) {
      auto bytes = ring_.homes->chunk_view(static_cast<std::int64_t>(j), c);
      if (!bytes.ok()) throw std::runtime_error(bytes.status().error());
      // Not owning: the homes outlive every copy (synchronize before they go).
      home_rows_[j].push_back(at::for_blob(bytes.value().data_ptr(), {bytes.value().size(0), words})
                                  .options(on_device)
                                  .target_device(ring_.device)
                                  .make_tensor());
    }
  }
  gather_stream_ = c10::impl::VirtualGuardImpl(ring_.device.type())
                       .getStreamFromGlobalPool(ring_.device, tuning_.gather_high_priority);
  make_pieces();
  return true;
}

void DeviceRingCopies::load_fused_codec(std::int64_t head_size) {
  const at::Tensor& kv = ring_.kv.front();
  if (env_says("ACTIVEKV_FUSED_CODEC", "0")) {  // an operator's way around them
    codec_kernels_missing_ = "turned off by ACTIVEKV_FUSED_CODEC=0";
  } else if (kv.scalar_type() != at::kBFloat16) {
    codec_kernels_missing_ = std::string("the KV cache is ") + c10::toString(kv.scalar_type()) + ", not bf16";
  } else {
    const c10::DeviceGuard on_device(ring_.device);
    codec_kernels_ = CudaCodecKernels::load(
        ring_.device.index(), CompressedRows{kv[0].numel(), head_size, ring_.homes->layer_bytes()},
        codec_kernels_missing_);
  }
}

void DeviceRingCopies::make_pieces() {
  // Nothing in flight reads the old pieces: the constructor and set_tuning
  // (which synchronizes first) call this.
  const std::int64_t row_bytes = ring_.homes->layer_bytes();
  const std::int64_t words = row_bytes / static_cast<std::int64_t>(c10::elementSize(word_type_));
  const std::int64_t piece_rows =
      std::clamp<std::int64_t>(tuning_.piece_bytes / row_bytes, 1, ring_.homes->num_slots());
  pieces_.clear();
  for (std::int64_t k = 0; k < tuning_.pieces; ++k) {
    pieces_.push_back(
        at::empty({piece_rows, words}, at::TensorOptions().dtype(word_type_).device(ring_.device)));
  }
  piece_free_.clear();
  piece_free_.resize(pieces_.size());
  next_piece_ = 0;
}

at::Tensor DeviceRingCopies::upload_ids(const std::vector<std::int64_t>& ids) const {
  // From pinned memory: the upload never waits for the host.
  at::Tensor host = at::empty({static_cast<std::int64_t>(ids.size())},
                              at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(ids.begin(), ids.end(), host.data_ptr<std::int64_t>());
  return host.to(ring_.device, /*non_blocking=*/true);
}

DeviceRingCopies::DeviceIndex DeviceRingCopies::device_index(const std::vector<std::int64_t>& blocks,
                                                             const std::vector<std::int64_t>& rows) const {
  // Uploaded on the current stream (a device stream of ours).
  const auto n = static_cast<std::int64_t>(blocks.size());
  const std::int64_t per_chunk = ring_.homes->slots_per_chunk();
  DeviceIndex out;
  const std::int64_t row_bytes = ring_.homes->layer_bytes();
  at::Tensor host = at::empty({4, n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* ids = host.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t home = rows[static_cast<std::size_t>(i)];
    const std::int64_t chunk = home / per_chunk;
    const std::int64_t row = home - chunk * per_chunk;
    ids[i] = blocks[static_cast<std::size_t>(i)];
    ids[n + i] = row;
    if (out.spans.empty() || out.spans.back().chunk != chunk) out.spans.push_back({chunk, i, 0});
    ++out.spans.back().count;
    // The chunk is [layers, rows_in_chunk, row_bytes].
    const std::int64_t rows_in_chunk = std::min(per_chunk, ring_.homes->num_slots() - chunk * per_chunk);
    const std::uintptr_t start = chunk_starts_[static_cast<std::size_t>(chunk)];
    ids[2 * n + i] =
        static_cast<std::int64_t>(start - homes_base_) / homes_grain_ + row * row_bytes / homes_grain_;
    ids[3 * n + i] = rows_in_chunk * row_bytes / homes_grain_;
  }
  const at::Tensor on_device = host.to(ring_.device, /*non_blocking=*/true);
  out.blocks = on_device[0];
  out.local = on_device[1];
  out.base = on_device[2];
  out.step = on_device[3];
  return out;
}

void DeviceRingCopies::gather_stage(std::int64_t streamed) {
  // Every byte crosses the bus on the gather stream, into staging pieces: the
  // long runs by the copy engine (batched pieces: every run, one batch a
  // piece), the other blocks by one gather kernel per piece. The copy stream
  // then scatters each piece into the ring, in its order after the buffer's
  // previous occupant's write-back. So the bus never waits for the ring, only
  // for a free piece.
  const auto j = static_cast<std::size_t>(streamed);
  at::Tensor& kv = ring_.kv[j];
  c10::impl::VirtualGuardImpl guard_impl(ring_.device.type());
  if (!stage_index_) {
    const c10::StreamGuard on_gather_stream(*gather_stream_);
    if (batched_pieces()) {  // nothing is gathered: the ring's ids are all the device needs
      stage_index_.emplace();
      stage_index_->blocks = upload_ids(pieces_plan_.blocks);
    } else {
      stage_index_ = device_index(pieces_plan_.blocks, pieces_plan_.rows);
    }
    // The copy stream scatters by these ids too (after waiting for a piece
    // read on the gather stream, so after the upload).
    guard_impl.recordDataPtrOnStream(stage_index_->blocks.storage().data_ptr(), copy_stream_);
  }
  const DeviceIndex& index = *stage_index_;
  const auto n = static_cast<std::int64_t>(pieces_plan_.blocks.size());
  const std::int64_t piece_rows = pieces_.front().size(0);
  at::Tensor rows_of_layer;
  if (pieces_plan_.run_blocks < n) {
    const c10::StreamGuard on_gather_stream(*gather_stream_);
    rows_of_layer = at::add(index.base, index.step, streamed);
  }
  std::size_t run = 0;          // the first copy-engine run not yet fully read
  std::int64_t run_offset = 0;  // rows of it already read
  for (std::int64_t first = 0; first < n; first += piece_rows) {
    const std::int64_t rows = std::min(piece_rows, n - first);
    const std::size_t k = next_piece_++ % pieces_.size();
    const at::Tensor& piece = pieces_[k];
    c10::Event read(ring_.device.type());
    {
      const c10::StreamGuard on_gather_stream(*gather_stream_);
      if (piece_free_[k]) piece_free_[k]->block(*gather_stream_);  // its last scatter is done
      const at::Tensor piece_bytes = piece.view(at::kByte);
      const bool batched = batched_pieces();
      if (batched) batch_->clear();
      std::int64_t row = first;
      while (row < std::min(first + rows, pieces_plan_.run_blocks)) {  // copy-engine rows of this piece
        const SlotRun& r = pieces_plan_.copy_engine_runs[run];
        const std::int64_t count = std::min(r.count - run_offset, first + rows - row);
        const SlotRun part{r.first + run_offset, count, 0};
        at::Tensor to = piece_bytes.narrow(0, row - first, count);
        if (batched) {
          batch_->add(reinterpret_cast<std::uintptr_t>(to.data_ptr()), home_address(j, part.first),
                      static_cast<std::size_t>(to.numel()));
        } else {
          to.copy_(ring_.homes->run_view(streamed, part).value(), /*non_blocking=*/true);
        }
        row += count;
        run_offset += count;
        if (run_offset == r.count) {
          ++run;
          run_offset = 0;
        }
      }
      if (batched) {
        cuda_batch_copy(*batch_, gather_stream_->native_handle(), /*to_device=*/true, batch_first_call());
      }
      if (row < first + rows) {  // gathered rows of this piece
        at::Tensor out = piece.narrow(0, row - first, first + rows - row);
        at::index_select_out(out, all_homes_, 0, rows_of_layer.narrow(0, row, first + rows - row));
      }
      read.record(*gather_stream_);
    }
    const c10::StreamGuard on_copy_stream(copy_stream_);
    read.block(copy_stream_);
    decode_into_ring(kv, index.blocks.narrow(0, first, rows), piece.narrow(0, 0, rows));
    piece_free_[k].emplace(ring_.device.type());
    piece_free_[k]->record(copy_stream_);
  }
}

at::Tensor DeviceRingCopies::encode_words(const at::Tensor& blocks) const {
  if (ring_.codec) return ring_.codec->encode(blocks).view(word_type_);
  return blocks.reshape({blocks.size(0), -1}).view(at::kByte).view(word_type_);
}

at::Tensor DeviceRingCopies::encode_ring_words(const at::Tensor& kv, const at::Tensor& ids) const {
  if (!fused_codec_in_use()) return encode_words(kv.index_select(0, ids));
  at::Tensor rows = at::empty({ids.size(0), ring_.homes->layer_bytes()}, kv.options().dtype(at::kByte));
  codec_kernels_->encode_gather(kv.data_ptr(), ids.data_ptr<std::int64_t>(), ids.size(0), rows.data_ptr(),
                                current_stream(ring_.device).native_handle());
  return rows.view(word_type_);
}

void DeviceRingCopies::decode_into_ring(at::Tensor& kv, const at::Tensor& ids, const at::Tensor& rows) const {
  if (!fused_codec_in_use()) {
    kv.index_copy_(0, ids, ring_.decode(rows));
    return;
  }
  codec_kernels_->decode_scatter(rows.data_ptr(), rows.size(0), ids.data_ptr<std::int64_t>(), kv.data_ptr(),
                                 current_stream(ring_.device).native_handle());
}

void DeviceRingCopies::gather_write_back(std::int64_t streamed) {
  // On the copy stream (the caller's guard). Long runs of home rows: the
  // ring's blocks gathered on the device, then one copy-engine copy per run
  // (batched pieces: every run, one batch; no SM writes over the bus). The
  // other blocks: the device writes them into the mapped homes. (Compressed
  // homes' long runs crossing on a stream of their own read no faster on the
  // H200: docs/benchmarks/history.md, 2026-12-04.)
  const auto j = static_cast<std::size_t>(streamed);
  const at::Tensor& kv = ring_.kv[j];
  if (!writeback_split_.long_blocks.empty()) {
    if (!writeback_long_ids_)
      writeback_long_ids_ = upload_ids(writeback_split_.long_blocks);  // once per step
    const at::Tensor gathered = encode_ring_words(kv, *writeback_long_ids_).view(at::kByte);
    if (batched_pieces()) {
      batch_->clear();
      for (const auto& run : writeback_split_.long_runs) {
        const at::Tensor from = gathered.narrow(0, run.offset, run.count);
        batch_->add(home_address(j, run.first), reinterpret_cast<std::uintptr_t>(from.data_ptr()),
                    static_cast<std::size_t>(from.numel()));
      }
      cuda_batch_copy(*batch_, current_stream(ring_.device).native_handle(), /*to_device=*/false,
                      batch_first_call());
    } else {
      for (const auto& run : writeback_split_.long_runs) {
        ring_.home_bytes_of(streamed, SlotRun{run.first, run.count, 0})
            .copy_(gathered.narrow(0, run.offset, run.count), /*non_blocking=*/true);
      }
    }
  }
  if (!writeback_split_.short_blocks.empty()) {
    if (!writeback_index_)
      writeback_index_ = device_index(writeback_split_.short_blocks, writeback_split_.short_rows);
    const DeviceIndex& index = *writeback_index_;
    const at::Tensor rows = encode_ring_words(kv, index.blocks);
    for (const auto& span : index.spans) {
      home_rows_[j][static_cast<std::size_t>(span.chunk)].index_copy_(
          0, index.local.narrow(0, span.offset, span.count), rows.narrow(0, span.offset, span.count));
    }
  }
}

at::Tensor DeviceRingCopies::ring_words(const at::Tensor& kv) {
  const at::Tensor rows = kv.view({kv.size(0), -1}).view(at::kByte);
  return rows.view(word_type_for(rows.size(1)));
}

bool DeviceRingCopies::init_batch_copy() {
  if (ring_.device.type() != c10::DeviceType::CUDA || !cuda_batch_copy_available()) return false;
  batch_ = std::make_unique<CopyBatch>();
  // One copy through the driver before any step relies on it: the first home
  // row (zeros) onto a device row of ones, compared.
  try {
    const c10::StreamGuard on_copy_stream(copy_stream_);
    const at::Tensor row = ring_.homes->run_view(0, SlotRun{0, 1, 0}).value();  // host bytes [1, layer_bytes]
    const at::Tensor scratch = at::full(row.sizes(), 1, row.options().device(ring_.device));
    batch_->add(reinterpret_cast<std::uintptr_t>(scratch.data_ptr()),
                reinterpret_cast<std::uintptr_t>(row.data_ptr()), static_cast<std::size_t>(row.numel()));
    cuda_batch_copy(*batch_, copy_stream_.native_handle(), /*to_device=*/true, /*first_call=*/0);
    batch_->clear();
    if (!at::equal(scratch.cpu(), row)) return false;
    writeback_stream_ =
        c10::impl::VirtualGuardImpl(ring_.device.type()).getStreamFromGlobalPool(ring_.device, false);
    return true;
  } catch (const std::exception&) {
    return false;  // the device gather serves instead
  }
}

void DeviceRingCopies::batch_copy(std::int64_t streamed, const std::vector<PairRun>& runs, bool to_home,
                                  const c10::Stream& stream, bool one_call) {
  if (runs.empty()) return;
  const auto j = static_cast<std::size_t>(streamed);
  const std::int64_t row_bytes = ring_.homes->layer_bytes();  // one block of the ring, exact homes
  const auto ring = reinterpret_cast<std::uintptr_t>(ring_.kv[j].data_ptr());
  batch_->clear();
  for (const auto& run : runs) {  // inside one home chunk (HostArena::runs)
    const std::uint64_t home = home_address(j, run.row);
    const auto block = ring + static_cast<std::uintptr_t>(run.block * row_bytes);
    const auto bytes = static_cast<std::size_t>(run.count * row_bytes);
    if (to_home) {
      batch_->add(home, block, bytes);
    } else {
      batch_->add(block, home, bytes);
    }
  }
  cuda_batch_copy(*batch_, stream.native_handle(), /*to_device=*/!to_home, one_call ? 0 : batch_first_call());
}

std::uint64_t DeviceRingCopies::home_address(std::size_t streamed, std::int64_t row) const {
  const std::int64_t per_chunk = ring_.homes->slots_per_chunk();
  const std::int64_t chunk = row / per_chunk;
  return reinterpret_cast<std::uintptr_t>(home_rows_[streamed][static_cast<std::size_t>(chunk)].data_ptr()) +
         static_cast<std::uint64_t>((row - chunk * per_chunk) * ring_.homes->layer_bytes());
}

}  // namespace activekv::detail
