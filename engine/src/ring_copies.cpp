// What every ring copier shares (ring_copies.h): the copy thread's posting
// and waiting, and the step's record of what was issued.
#include "ring_copies.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace activekv::detail {

bool env_says(const char* name, std::string_view value) {
  const char* set = std::getenv(name);
  return set != nullptr && std::string_view(set) == value;
}

RingCopies::RingCopies(StreamedRing& ring)
    : ring_(ring),
      stage_issued_(static_cast<std::size_t>(ring.num_streamed()), 0),
      stage_tasks_(static_cast<std::size_t>(ring.num_streamed()), 0),
      occupant_writeback_tasks_(static_cast<std::size_t>(ring.num_streamed()), 0) {}

RingCopies::~RingCopies() = default;

const std::vector<int>& RingCopies::copy_thread_cpus() const {
  static const std::vector<int> none;
  return none;
}

const std::string& RingCopies::fused_codec_missing() const {
  static const std::string none;
  return none;
}

std::uint64_t RingCopies::issue(std::function<void()> task, bool wake) {
  if (copy_thread_) return copy_thread_->post(std::move(task), wake);
  task();
  return 0;
}

void RingCopies::wait_issued(std::uint64_t task) {
  if (copy_thread_ && task != 0) copy_thread_->wait_for(task);
}

void RingCopies::drain_thread() {
  if (copy_thread_) copy_thread_->drain();
}

void RingCopies::replace_thread(std::unique_ptr<CopyThread> thread) {
  drain_thread();
  copy_thread_ = std::move(thread);
}

void RingCopies::check_can_copy_by(StreamCopy method) const {
  if (can_copy_by(method)) return;
  throw std::invalid_argument(
      method == StreamCopy::kDeviceGather
          ? "kDeviceGather needs a CUDA or XPU device and ring buffers whose blocks are whole rows"
          : "kCopyEngineBatch needs what kDeviceGather needs, on CUDA with a driver that has "
            "cuMemcpyBatchAsync (12.8 or later)");
}

void RingCopies::note_stage_issued(std::int64_t streamed, Telemetry& stats) {
  stage_issued_[static_cast<std::size_t>(streamed)] = 1;
  if (ring_.stages_this_step()) {
    stats.add(Counter::kStreamedBytesToDevice, ring_.layer_bytes_of(ring_.stage_blocks));
  }
}

void RingCopies::clear_step_tasks() {
  std::fill(stage_issued_.begin(), stage_issued_.end(), 0);
  std::fill(stage_tasks_.begin(), stage_tasks_.end(), 0);
  std::fill(occupant_writeback_tasks_.begin(), occupant_writeback_tasks_.end(), 0);
}

}  // namespace activekv::detail
