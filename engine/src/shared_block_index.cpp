// SharedBlockIndex (shared_block_index.h): the host store's index in a
// memory-mapped file every instance on the host shares, under one robust
// process-shared mutex.
#include "activekv/shared_block_index.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "mapped_file.h"
#include "ofd_lock.h"
#include "shared_block_index_layout.h"

namespace activekv {
namespace {

constexpr char kMagic[8] = {'A', 'K', 'V', 'I', 'N', 'D', 'E', 'X'};
constexpr std::uint32_t kFormat =
    4;  // 2: the LRU list in the slots; 3: dead holders counted; 4: visible counted

// Open file description locks (ofd_lock.h): the gate serializes attaching,
// and instance i holds byte kFirstInstance + i.
constexpr off_t kGateByte = detail::kFirstLockByte;
constexpr off_t kFirstInstance = kGateByte + 16;

detail::MappedFile index_file(const std::string& path) { return {"ActiveKV shared store index", path}; }

Status failed(const std::string& path, const std::string& what) { return index_file(path).failed(what); }

}  // namespace

using namespace shared_index;  // NOLINT: the file's own layout

// The index's mutex, held for the scope. A holder that died inside it left
// the derived tables possibly half-updated: they are rebuilt from the slots,
// and the dead holder's pending saves and pins dropped.
class SharedBlockIndex::Locked {
 public:
  explicit Locked(const SharedBlockIndex& index) : mutex_(&index.header().mutex) {
    const int e = pthread_mutex_lock(mutex_);
    if (e == EOWNERDEAD) {
      ++index.header().dead_holders;
      index.rebuild_derived();
      index.reclaim_dead();
      pthread_mutex_consistent(mutex_);
    } else if (e != 0) {
      throw std::runtime_error("ActiveKV shared store index " + index.path_ + ": its lock failed (" +
                               std::strerror(e) + "); restart every vLLM that shares it");
    }
  }
  ~Locked() { pthread_mutex_unlock(mutex_); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  pthread_mutex_t* mutex_;
};

Result<std::unique_ptr<SharedBlockIndex>> SharedBlockIndex::open(
    const std::string& path, std::int64_t num_slots,
    const std::function<Result<std::vector<std::pair<BlockKey, std::int64_t>>>()>& sealed_blocks) {
  if (num_slots < 1 || num_slots > std::numeric_limits<std::int32_t>::max()) {
    return failed(path, "cannot index " + std::to_string(num_slots) + " slots");
  }
  static_assert(sizeof(Header) <= kHeaderBytes);
  std::unique_ptr<SharedBlockIndex> ix(new SharedBlockIndex());
  ix->path_ = path;
  ix->num_slots_ = num_slots;
  ix->table_size_ = 16;
  while (ix->table_size_ < 2 * num_slots) ix->table_size_ *= 2;  // at most half full
  const std::size_t bytes = kHeaderBytes + static_cast<std::size_t>(num_slots) * sizeof(Slot) +
                            static_cast<std::size_t>(num_slots + ix->table_size_) * sizeof(std::int32_t);
  ix->map_bytes_ = detail::round_up(bytes, detail::page_bytes());

  const detail::MappedFile file = index_file(path);
  auto fd = file.open_at_gate(kGateByte);
  if (!fd.ok()) return fd.status();
  ix->fd_ = fd.value();
  struct flock held{};
  detail::ofd_lock(ix->fd_, F_OFD_GETLK, F_WRLCK, kFirstInstance, kMaxInstances, &held);
  ix->joined_ = held.l_type != F_UNLCK;
  if (Status s = ix->size_file(file); !s.ok()) return s;
  auto map = file.map(ix->fd_, ix->map_bytes_);
  if (!map.ok()) return map.status();
  ix->map_ = map.value();
  if (!ix->joined_) {
    ix->init_header();
  } else if (Status s = ix->check_header(); !s.ok()) {
    return s;
  }
  for (int i = 0; i < kMaxInstances && ix->instance_ < 0; ++i) {
    if (detail::ofd_lock(ix->fd_, F_OFD_SETLK, F_WRLCK, kFirstInstance + i)) ix->instance_ = i;
  }
  if (ix->instance_ < 0) {
    return failed(path, "is shared by " + std::to_string(kMaxInstances) + " running vLLM instances already");
  }
  {
    Locked lock(*ix);
    // What a dead earlier holder of this instance's number left, then the
    // other dead instances'.
    ix->abandon(ix->instance_);
    ix->reclaim_dead();
  }
  if (!ix->joined_) {
    auto blocks = sealed_blocks();
    if (!blocks.ok()) return blocks.status();
    ix->restored_ = ix->restore(blocks.value());
  }
  detail::ofd_lock(ix->fd_, F_OFD_SETLK, F_UNLCK, kGateByte);
  return ix;
}

Status SharedBlockIndex::size_file(const detail::MappedFile& file) const {
  if (!joined_) {  // nobody uses it: (re)made from the store files
    if (::ftruncate(fd_, 0) != 0 || ::ftruncate(fd_, static_cast<off_t>(map_bytes_)) != 0) {
      return file.failed(std::string("cannot be sized (") + std::strerror(errno) + ")");
    }
    return file.reserve(fd_, map_bytes_, "free space there or choose another path");
  }
  struct stat st{};
  if (::fstat(fd_, &st) != 0 || static_cast<std::size_t>(st.st_size) != map_bytes_) {
    return file.failed("is in use for a store of another size (" + std::to_string(st.st_size) +
                       " bytes, this store's index takes " + std::to_string(map_bytes_) +
                       "): give every vLLM that shares a store the same capacity_bytes");
  }
  return Status::Ok();
}

void SharedBlockIndex::init_header() const {
  Header& h = header();
  std::memset(map_, 0, map_bytes_);  // every slot kFree
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.format = kFormat;
  h.max_instances = kMaxInstances;
  h.num_slots = num_slots_;
  h.table_size = table_size_;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h.mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  for (std::int64_t s = 0; s < num_slots_; ++s) slot_at(s).owner = -1;
  rebuild_derived();
}

Status SharedBlockIndex::check_header() const {
  const Header& h = header();
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.format != kFormat || h.num_slots != num_slots_ ||
      h.table_size != table_size_) {
    return failed(path_, "is in use by vLLM instances with another store (" + std::to_string(h.num_slots) +
                             " slots, this one has " + std::to_string(num_slots_) +
                             "): give every vLLM that shares a store the same capacity_bytes");
  }
  return Status::Ok();
}

SharedBlockIndex::~SharedBlockIndex() {
  if (map_ != nullptr && instance_ >= 0) {
    try {  // saves that never completed and loads that never finished: not this instance's any more
      Locked lock(*this);
      abandon(instance_);
    } catch (const std::exception&) {  // the others reclaim it once this instance's lock is gone
    }
  }
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);  // drops this instance's lock
}

std::uint64_t SharedBlockIndex::tick() const { return ++header().clock; }

bool SharedBlockIndex::alive(int instance) const {
  if (instance == instance_) return true;
  if (instance < 0 || instance >= kMaxInstances) return false;
  struct flock held{};
  if (!detail::ofd_lock(fd_, F_OFD_GETLK, F_WRLCK, kFirstInstance + instance, 1, &held))
    return true;  // unknown: keep
  return held.l_type != F_UNLCK;
}

int SharedBlockIndex::live_instances() const {
  int n = 0;
  for (int i = 0; i < kMaxInstances; ++i) n += alive(i) ? 1 : 0;
  return n;
}

std::optional<std::int64_t> SharedBlockIndex::lookup(const BlockKey& key) const {
  Locked lock(*this);
  const std::int64_t s = find(key);
  if (s < 0 || slot_at(s).state != kVisible) return std::nullopt;
  used(s);
  return s;
}

bool SharedBlockIndex::contains(const BlockKey& key) const {
  Locked lock(*this);
  const std::int64_t s = find(key);
  if (s < 0) return false;
  const Slot& e = slot_at(s);
  if (e.state == kPending && !alive(e.owner)) {  // its saver died: take the save over
    reclaim_dead();
    return find(key) >= 0;
  }
  return true;
}

void SharedBlockIndex::touch(const BlockKey& key) {
  Locked lock(*this);
  const std::int64_t s = find(key);
  if (s >= 0 && slot_at(s).state == kVisible) used(s);
}

std::optional<std::int64_t> SharedBlockIndex::pin(const BlockKey& key) {
  Locked lock(*this);
  const std::int64_t s = find(key);
  if (s < 0 || slot_at(s).state != kVisible) return std::nullopt;
  Slot& e = slot_at(s);
  e.pinned_by |= std::uint64_t{1} << instance_;
  used(s);
  ++pins_[s];
  return s;
}

void SharedBlockIndex::unpin(std::int64_t slot) {
  const auto it = pins_.find(slot);
  if (it == pins_.end()) {
    throw std::logic_error("unpin of slot " + std::to_string(slot) + " without a load in flight");
  }
  if (--it->second > 0) return;
  pins_.erase(it);
  Locked lock(*this);
  slot_at(slot).pinned_by &= ~(std::uint64_t{1} << instance_);
}

SharedBlockIndex::Reservation SharedBlockIndex::reserve(const BlockKey& key) {
  Locked lock(*this);
  Reservation r;
  // Probes get long as tombstones pile up: past a quarter, the table is made again.
  if (header().tombstones > table_size_ / 4) rebuild_derived();
  if (find(key) >= 0) {
    r.stored_elsewhere = true;
    return r;
  }
  Header& h = header();
  const auto victim = [this, &h] {  // the least recently used visible slot no instance is loading
    std::int64_t s = h.lru_head;
    while (s >= 0 && slot_at(s).pinned_by != 0) s = slot_at(s).lru_next;
    return s;
  };
  if (h.free_top == 0) {
    std::int64_t v = victim();
    if (v < 0) {  // every slot pending or pinned: some may be a dead instance's
      reclaim_dead();
      if (h.free_top == 0) v = victim();
    }
    if (h.free_top == 0) {
      if (v < 0) return r;
      r.evicted.push_back(slot_at(v).key);
      erase(slot_at(v).key);
      free_slot(v);
    }
  }
  const std::int64_t s = free_stack()[--h.free_top];
  Slot& e = slot_at(s);
  e.key = key;
  e.owner = instance_;
  e.pinned_by = 0;
  e.state = kPending;
  insert(key, s);
  r.slot = s;
  return r;
}

void SharedBlockIndex::commit(std::int64_t slot) {
  Locked lock(*this);
  Slot& e = slot_at(slot);
  if (e.state != kPending || e.owner != instance_) {
    throw std::logic_error("slot " + std::to_string(slot) + " committed but not pending for this instance");
  }
  e.state = kVisible;
  e.owner = -1;
  e.last_use = tick();
  link_newest(slot);
}

void SharedBlockIndex::discard(std::int64_t slot) {
  if (slot < 0 || slot >= num_slots_) return;
  Locked lock(*this);
  Slot& e = slot_at(slot);
  // Another instance may have evicted the block since this one's report and
  // reserved the slot for its own save: that save is not this one's to drop.
  if (e.state == kPending && e.owner != instance_) return;
  if ((e.state != kPending && e.state != kVisible) || e.pinned_by != 0) return;
  erase(e.key);
  free_slot(slot);
}

void SharedBlockIndex::retire(std::int64_t slot) {
  if (slot < 0 || slot >= num_slots_) return;
  Locked lock(*this);
  Slot& e = slot_at(slot);
  if (e.state != kPending && e.state != kVisible) return;
  erase(e.key);
  if (e.state == kVisible) unlink(slot);
  e.state = kRetired;  // never handed out again while the index lives
  e.owner = -1;
}

std::int64_t SharedBlockIndex::restore(const std::vector<std::pair<BlockKey, std::int64_t>>& blocks) {
  Locked lock(*this);
  std::int64_t restored = 0;
  for (const auto& [key, slot] : blocks) {
    if (slot < 0 || slot >= num_slots_ || slot_at(slot).state != kFree || find(key) >= 0) continue;
    Slot& e = slot_at(slot);
    e.key = key;
    e.owner = -1;
    e.pinned_by = 0;
    e.state = kVisible;
    e.last_use = tick();  // oldest first: the LRU order the files kept
    insert(key, slot);
    ++restored;
  }
  // The free stack still lists the restored slots: made again from the slots.
  rebuild_derived();
  return restored;
}

std::uint64_t SharedBlockIndex::dead_holders() const {
  Locked lock(*this);
  return header().dead_holders;
}

StoreIndex::Occupancy SharedBlockIndex::occupancy() const {
  Locked lock(*this);
  return {header().visible, header().free_top};
}

std::int64_t SharedBlockIndex::visible_blocks() const {
  Locked lock(*this);
  std::int64_t n = 0;
  for (std::int64_t s = 0; s < num_slots_; ++s) n += slot_at(s).state == kVisible ? 1 : 0;
  return n;
}

}  // namespace activekv
