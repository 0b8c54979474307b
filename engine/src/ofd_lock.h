// Open file description locks, as the store file and the shared index use
// them (internal). The kernel drops such a lock when the last descriptor of
// its open closes, so with its holder's death: no stale lock survives a crash.
#pragma once

#include <fcntl.h>

#include <cerrno>

namespace activekv::detail {

// The lock bytes lie far past any data, so they never cover what is mapped.
inline constexpr off_t kFirstLockByte = off_t{1} << 62;

// fcntl(fd, cmd) on [start, start + len) with lock `type`, retried on EINTR;
// with F_OFD_GETLK, `out` receives what the kernel answered. False on failure
// (errno says why).
inline bool ofd_lock(int fd, int cmd, short type, off_t start, off_t len = 1, struct flock* out = nullptr) {
  struct flock l{};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = start;
  l.l_len = len;
  while (::fcntl(fd, cmd, &l) != 0) {
    if (errno != EINTR) return false;
  }
  if (out != nullptr) *out = l;
  return true;
}

}  // namespace activekv::detail
