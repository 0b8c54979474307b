// Opening the files a store maps, as the store file and its shared index both
// do it (internal): create or open, wait at the gate, reserve the space, map
// every page. Each failure is one Status naming the file and what to do.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "activekv/status.h"
#include "ofd_lock.h"

namespace activekv::detail {

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

inline std::size_t page_bytes() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

// A file of the store, as its messages name it ("ActiveKV store file PATH").
struct MappedFile {
  std::string kind;  // "ActiveKV store file", "ActiveKV shared store index"
  std::string path;

  Status failed(const std::string& what) const {
    return {ErrorCode::kInvalidConfig, kind + " " + path + ": " + what};
  }

  // Opened for reading and writing (made, mode 0600, where missing), then
  // held at the gate: `gate_byte` write-locked, waiting for whoever holds it.
  Result<int> open_at_gate(off_t gate_byte) const {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == ENOENT) return failed("its directory does not exist; create it or choose another path");
      return failed("cannot be opened for reading and writing (" + std::string(std::strerror(errno)) +
                    "); choose a writable path");
    }
    if (!ofd_lock(fd, F_OFD_SETLKW, F_WRLCK, gate_byte)) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return failed("cannot be locked (" + why + "); choose a path on a local file system");
    }
    return fd;
  }

  // All of its `bytes` on disk now: a full disk fails here, not in the middle
  // of a save. `advice` says what the operator can do instead.
  Status reserve(int fd, std::size_t bytes, const std::string& advice) const {
    if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
      return failed("cannot reserve " + std::to_string(bytes) + " bytes (" + std::strerror(e) + "); " +
                    advice);
    }
    return Status::Ok();
  }

  // Mapped shared, every page mapped now (MAP_POPULATE): a save never pays a
  // page fault (a 2 MiB slot is 512 of them; without it sealing ran at
  // 0.2-0.4 GB/s).
  Result<std::uint8_t*> map(int fd, std::size_t bytes) const {
    void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) return failed("cannot be mapped (" + std::string(std::strerror(errno)) + ")");
    return static_cast<std::uint8_t*>(map);
  }
};

}  // namespace activekv::detail
