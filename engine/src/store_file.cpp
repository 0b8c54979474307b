// StoreFile (store_file.h): the host store's slots in a memory-mapped file,
// sealed in an order a crash cannot tear, recovered by checksum.
#include "activekv/store_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "mapped_file.h"
#include "ofd_lock.h"

namespace activekv {
namespace {

constexpr char kMagic[8] = {'A', 'K', 'V', 'S', 'T', 'O', 'R', 'E'};
constexpr std::uint32_t kFormat = 3;  // 2: the data in the arena's chunks; 3: shared, one commit counter
constexpr std::size_t kHeaderBytes = 4096;
constexpr std::size_t kIdentityBytes = 2048;

enum State : std::uint64_t { kEmpty = 0, kWriting = 1, kSealed = 2 };

struct Header {
  char magic[8];
  std::uint32_t format;
  std::uint32_t record_bytes;
  std::int64_t num_slots;
  std::int64_t slot_bytes;
  std::int64_t num_layers;
  std::int64_t slots_per_chunk;
  std::uint64_t data_offset;
  std::uint64_t last_sequence;    // the last commit's, of every process sharing the file (atomic_ref)
  char identity[kIdentityBytes];  // NUL-terminated
};
static_assert(sizeof(Header) <= kHeaderBytes);

using detail::page_bytes;
using detail::round_up;

detail::MappedFile store_file(const std::string& path) { return {"ActiveKV store file", path}; }

Status failed(const std::string& path, const std::string& what) { return store_file(path).failed(what); }

std::string errno_text() { return std::strerror(errno); }

// A file's header against what this ActiveKV reads: its magic, format and
// record size, and (identity not null) what it holds.
Status check_header(const Header& h, const std::string& path, const std::string* identity,
                    std::size_t record_bytes) {
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return failed(path, "is not an ActiveKV store; remove it or choose another path");
  }
  if (h.format != kFormat || h.record_bytes != record_bytes) {
    return failed(path, "was written in store format " + std::to_string(h.format) + "; this ActiveKV reads " +
                            std::to_string(kFormat) + ": remove it");
  }
  const std::string held(h.identity, strnlen(h.identity, kIdentityBytes));
  if (identity != nullptr && held != *identity) {
    return failed(path, "holds '" + held + "', not '" + *identity +
                            "'; point this vLLM at another store file, or remove it");
  }
  return Status::Ok();
}

// Open file description locks (ofd_lock.h) on two bytes: the gate
// serializes attaching, and every process that uses the file holds the attach
// byte shared.
constexpr off_t kGateByte = detail::kFirstLockByte;
constexpr off_t kAttachByte = kGateByte + 1;

// Whether the file's header was never written: no magic (all zeros, as
// posix_fallocate leaves it).
bool never_headed(int fd) {
  char magic[sizeof(kMagic)] = {};
  if (::pread(fd, magic, sizeof(magic), 0) != static_cast<ssize_t>(sizeof(magic))) return false;
  return std::all_of(std::begin(magic), std::end(magic), [](char c) { return c == 0; });
}

// What a store file can be made of: slots that split into layers, an
// identity the header holds.
Status check_options(const StoreFileOptions& o) {
  if (o.num_slots < 1 || o.slot_bytes < 1)
    return failed(o.path, "needs at least one slot of at least one byte");
  if (o.num_layers < 1 || o.slot_bytes % o.num_layers != 0 || o.slots_per_chunk < 0) {
    return failed(o.path, "slots of " + std::to_string(o.slot_bytes) + " bytes do not split into " +
                              std::to_string(o.num_layers) + " layers");
  }
  if (o.identity.size() >= kIdentityBytes) {
    return failed(o.path, "identity of " + std::to_string(o.identity.size()) +
                              " bytes is over the header's " + std::to_string(kIdentityBytes - 1));
  }
  return Status::Ok();
}

// A new file's header: what it holds and how it is laid out.
void write_header(Header& h, const StoreFileOptions& o, std::int64_t slots_per_chunk, std::size_t data_offset,
                  std::size_t record_bytes) {
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.format = kFormat;
  h.record_bytes = static_cast<std::uint32_t>(record_bytes);
  h.num_slots = o.num_slots;
  h.slot_bytes = o.slot_bytes;
  h.num_layers = o.num_layers;
  h.slots_per_chunk = slots_per_chunk;
  h.data_offset = data_offset;
  h.last_sequence = 0;
  std::memcpy(h.identity, o.identity.c_str(), o.identity.size() + 1);
}

// An existing file's slots, layers and chunks against this configuration's
// (`whole`: the file is as long as that layout needs).
Status check_geometry(const Header& h, const StoreFileOptions& o, std::int64_t slots_per_chunk, bool whole) {
  if (h.num_slots == o.num_slots && h.slot_bytes == o.slot_bytes && h.num_layers == o.num_layers &&
      h.slots_per_chunk == slots_per_chunk && whole) {
    return Status::Ok();
  }
  return failed(o.path, "holds " + std::to_string(h.num_slots) + " slots of " + std::to_string(h.slot_bytes) +
                            " bytes (" + std::to_string(h.num_layers) + " layers, chunks of " +
                            std::to_string(h.slots_per_chunk) + " slots); this configuration needs " +
                            std::to_string(o.num_slots) + " of " + std::to_string(o.slot_bytes) + " (" +
                            std::to_string(o.num_layers) + " layers, chunks of " +
                            std::to_string(slots_per_chunk) +
                            " slots; capacity_bytes or the model changed): restore it, or remove the file");
}

// Oldest commit first: the LRU order across restarts.
void sort_by_commit(std::vector<RecoveredSlot>& slots) {
  std::sort(slots.begin(), slots.end(),
            [](const RecoveredSlot& a, const RecoveredSlot& b) { return a.sequence < b.sequence; });
}

}  // namespace

struct StoreFile::Record {
  std::uint64_t state;  // State; read and written through std::atomic_ref
  std::uint64_t checksum;
  std::uint64_t sequence;
  StoreTag tag;
  std::uint8_t reserved[128 - 24 - sizeof(StoreTag)];  // one record is 128 bytes
};

std::string store_file_of_rank(const std::string& store_path, std::int64_t tp_rank, std::int64_t tp_size) {
  return tp_size == 1 ? store_path : store_path + ".rank" + std::to_string(tp_rank);
}

std::string store_file_identity(const ModelIdentity& id, Mode mode, std::int64_t tp_rank) {
  std::string digest;
  for (const auto b : id.digest()) digest += "0123456789abcdef"[b >> 4], digest += "0123456789abcdef"[b & 15];
  return "activekv-store model=" + digest + " mode=" + mode_name(mode) + " dtype=" + id.dtype +
         " rank=" + std::to_string(tp_rank) + "/" + std::to_string(id.tp_size);
}

std::uint64_t store_checksum(const std::uint8_t* data, std::size_t bytes) {
  std::uint64_t h = 0x243F6A8885A308D3ULL ^ bytes;
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, data + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 32;
  }
  for (; i < bytes; ++i) h = (h ^ data[i]) * 0x100000001B3ULL;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  return h ^ (h >> 32);
}

Result<std::unique_ptr<StoreFile>> StoreFile::open(const StoreFileOptions& o) {
  if (Status s = check_options(o); !s.ok()) return s;
  std::unique_ptr<StoreFile> f(new StoreFile());
  f->path_ = o.path;
  f->num_slots_ = o.num_slots;
  f->slot_bytes_ = o.slot_bytes;
  f->num_layers_ = o.num_layers;
  f->layer_bytes_ = o.slot_bytes / o.num_layers;
  f->slots_per_chunk_ = o.slots_per_chunk == 0 ? o.num_slots : std::min(o.slots_per_chunk, o.num_slots);
  const auto records = static_cast<std::size_t>(o.num_slots) * sizeof(Record);
  f->data_offset_ = round_up(kHeaderBytes + records, page_bytes());
  const std::size_t total = f->data_offset_ + static_cast<std::size_t>(o.num_slots * o.slot_bytes);

  struct stat before{};
  const bool existed = ::stat(o.path.c_str(), &before) == 0;
  const detail::MappedFile file = store_file(o.path);
  // Attach under the gate: the first process (nobody holds the attach byte)
  // recovers the file, the others join it as it is.
  auto fd = file.open_at_gate(kGateByte);
  if (!fd.ok()) return fd.status();
  f->fd_ = fd.value();
  f->joined_ = !detail::ofd_lock(f->fd_, F_OFD_SETLK, F_WRLCK, kAttachByte);
  const auto attached = [&f] {  // shared from here on; converting is atomic
    detail::ofd_lock(f->fd_, F_OFD_SETLKW, F_RDLCK, kAttachByte);
    detail::ofd_lock(f->fd_, F_OFD_SETLK, F_UNLCK, kGateByte);
  };
  struct stat st{};
  if (::fstat(f->fd_, &st) != 0) return failed(o.path, "cannot be read (" + errno_text() + ")");
  // A killed process never loses what it stored into a shared mapping (the
  // page cache keeps it); flushes are for a disk's durability across a crash
  // of the machine, which tmpfs does not survive anyway.
  struct statfs fs{};
  f->durable_ = ::fstatfs(f->fd_, &fs) != 0 || fs.f_type != TMPFS_MAGIC;
  // A first attacher also remakes a file whose header was never written (a
  // creation cut off after reserving the space): nothing in it was ever served.
  const bool fresh = st.st_size == 0 || (!f->joined_ && never_headed(f->fd_));
  if (fresh) {
    if (Status s =
            file.reserve(f->fd_, total, "free space there, lower capacity_bytes or choose another path");
        !s.ok()) {
      // Emptied, not unlinked: a process waiting at the gate holds this file
      // (it then finds it empty and tries for itself), and a path some other
      // process made meanwhile is not ours to remove.
      if (!existed) (void)!::ftruncate(f->fd_, 0);
      return s;
    }
  } else if (static_cast<std::size_t>(st.st_size) < kHeaderBytes) {
    return failed(o.path, "is not an ActiveKV store (" + std::to_string(st.st_size) +
                              " bytes); remove it or choose another path");
  }
  const auto mapped = fresh ? total : static_cast<std::size_t>(st.st_size);
  auto map = file.map(f->fd_, mapped);
  if (!map.ok()) return map.status();
  f->map_ = map.value();
  f->map_bytes_ = mapped;
  auto* h = reinterpret_cast<Header*>(f->map_);
  if (fresh) {
    write_header(*h, o, f->slots_per_chunk_, f->data_offset_, sizeof(Record));
    f->flush(h, kHeaderBytes);
    attached();
    return f;
  }
  if (Status s = check_header(*h, o.path, &o.identity, sizeof(Record)); !s.ok()) return s;
  if (Status s = check_geometry(*h, o, f->slots_per_chunk_, mapped == total); !s.ok()) return s;
  // A live process holds the file: its slots are as it left them (sealed
  // ones verified when the first process recovered them).
  if (!f->joined_) {
    if (Status s = f->recover(); !s.ok()) return s;
  }
  attached();
  return f;
}

StoreFile::~StoreFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);  // releases the locks
}

StoreFile::Record& StoreFile::record(std::int64_t slot) const {
  static_assert(sizeof(Record) == 128);
  return reinterpret_cast<Record*>(map_ + kHeaderBytes)[slot];
}

std::uint8_t* StoreFile::chunk_data(std::int64_t chunk) const {
  // Every chunk before the last is full.
  return map_ + data_offset_ + static_cast<std::size_t>(chunk * slots_per_chunk_ * slot_bytes_);
}

std::int64_t StoreFile::chunk_rows(std::int64_t chunk) const {
  return std::min(slots_per_chunk_, num_slots_ - chunk * slots_per_chunk_);
}

std::uint8_t* StoreFile::layer_data(std::int64_t slot, std::int64_t layer) const {
  const std::int64_t chunk = slot / slots_per_chunk_;
  const std::int64_t row = slot - chunk * slots_per_chunk_;
  return chunk_data(chunk) + static_cast<std::size_t>((layer * chunk_rows(chunk) + row) * layer_bytes_);
}

std::uint64_t StoreFile::slot_checksum(std::int64_t slot) const {
  std::uint64_t h = 0;
  for (std::int64_t l = 0; l < num_layers_; ++l) {
    h = (h ^ store_checksum(layer_data(slot, l), static_cast<std::size_t>(layer_bytes_))) *
        0x9E3779B97F4A7C15ULL;
  }
  return h ^ (h >> 31);
}

void StoreFile::flush_slot(std::int64_t slot) const {
  for (std::int64_t l = 0; l < num_layers_; ++l)
    flush(layer_data(slot, l), static_cast<std::size_t>(layer_bytes_));
}

void StoreFile::flush(const void* at, std::size_t bytes) const {
  // msync takes whole pages. Its failure (EIO) cannot be undone here: the
  // slot then stays unsealed or fails its checksum at the next start.
  if (!durable_) return;
  const auto start = reinterpret_cast<std::uintptr_t>(at) / page_bytes() * page_bytes();
  const auto end = reinterpret_cast<std::uintptr_t>(at) + bytes;
  ::msync(reinterpret_cast<void*>(start), end - start, MS_SYNC);
}

void StoreFile::begin_write(std::int64_t slot) {
  Record& r = record(slot);
  std::atomic_ref<std::uint64_t>(r.state).store(kWriting, std::memory_order_release);
  flush(&r, sizeof(Record));  // durable before any byte of the data changes
}

void StoreFile::commit(std::int64_t slot, const StoreTag& tag) {
  Record& r = record(slot);
  r.checksum = slot_checksum(slot);
  r.sequence = std::atomic_ref<std::uint64_t>(last_sequence()).fetch_add(1) + 1;
  r.tag = tag;
  flush_slot(slot);
  flush(&r, sizeof(Record));
  std::atomic_ref<std::uint64_t>(r.state).store(kSealed, std::memory_order_release);
  flush(&r, sizeof(Record));
}

void StoreFile::drop(std::int64_t slot) {
  Record& r = record(slot);
  std::atomic_ref<std::uint64_t>(r.state).store(kEmpty, std::memory_order_release);
  flush(&r, sizeof(Record));
}

bool StoreFile::sealed(std::int64_t slot) const {
  return std::atomic_ref<std::uint64_t>(record(slot).state).load(std::memory_order_acquire) == kSealed;
}

std::optional<StoreTag> StoreFile::sealed_tag(std::int64_t slot) const {
  if (slot < 0 || slot >= num_slots_ || !sealed(slot)) return std::nullopt;
  return record(slot).tag;
}

std::uint64_t& StoreFile::last_sequence() const { return reinterpret_cast<Header*>(map_)->last_sequence; }

Status StoreFile::recover() {
  // Verifying reads every sealed byte (one thread: 2.6 GB/s, 26 s for 64 GiB
  // on the H200's host): the checksums are computed on up to 16 threads, each
  // over its own range of slots, and the records settled in slot order after.
  std::vector<char> verified(static_cast<std::size_t>(num_slots_), 0);
  const auto threads =
      static_cast<std::int64_t>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 16));
  const std::int64_t per = (num_slots_ + threads - 1) / threads;
  {
    std::vector<std::jthread> workers;
    for (std::int64_t first = 0; first < num_slots_; first += per) {
      workers.emplace_back([this, &verified, first, last = std::min(num_slots_, first + per)] {
        for (std::int64_t s = first; s < last; ++s) {
          const Record& r = record(s);
          verified[static_cast<std::size_t>(s)] = r.state == kSealed && r.checksum == slot_checksum(s);
        }
      });
    }
  }  // joined
  for (std::int64_t s = 0; s < num_slots_; ++s) {
    Record& r = record(s);
    const std::uint64_t state = r.state;
    if (state == kEmpty) continue;
    if (verified[static_cast<std::size_t>(s)] != 0) {
      recovered_.push_back({s, r.tag, r.sequence});
      last_sequence() = std::max(last_sequence(), r.sequence);
      continue;
    }
    ++(state == kSealed ? dropped_checksum_ : dropped_writing_);
    r.state = kEmpty;
  }
  flush(map_ + kHeaderBytes, static_cast<std::size_t>(num_slots_) * sizeof(Record));
  sort_by_commit(recovered_);
  return Status::Ok();
}

Result<std::vector<RecoveredSlot>> StoreFile::read_sealed(const std::string& path,
                                                          const std::string& identity) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return failed(path, "cannot be read (" + errno_text() + ")");
  struct stat st{};
  Header h{};
  const bool headed = ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= kHeaderBytes &&
                      ::pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h));
  if (!headed) {
    ::close(fd);
    return failed(path, "is not an ActiveKV store; remove it or choose another path");
  }
  if (Status s = check_header(h, path, identity.empty() ? nullptr : &identity, sizeof(Record)); !s.ok()) {
    ::close(fd);
    return s;
  }
  // The records must fit in the file before they are read (a damaged header
  // must not ask for a huge buffer).
  if (h.num_slots < 1 || static_cast<std::uint64_t>(h.num_slots) >
                             (static_cast<std::uint64_t>(st.st_size) - kHeaderBytes) / sizeof(Record)) {
    ::close(fd);
    return failed(path, "is shorter than its header says");
  }
  std::vector<Record> records(static_cast<std::size_t>(h.num_slots));
  const auto bytes = static_cast<ssize_t>(records.size() * sizeof(Record));
  const bool read = ::pread(fd, records.data(), static_cast<std::size_t>(bytes), kHeaderBytes) == bytes;
  ::close(fd);
  if (!read) return failed(path, "is shorter than its header says");
  std::vector<RecoveredSlot> out;
  for (std::size_t s = 0; s < records.size(); ++s) {
    if (records[s].state == kSealed)
      out.push_back({static_cast<std::int64_t>(s), records[s].tag, records[s].sequence});
  }
  sort_by_commit(out);
  return out;
}

}  // namespace activekv
