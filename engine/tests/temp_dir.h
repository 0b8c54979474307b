// A directory for one test, removed with everything in it when the test ends.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace activekv::test {

// On disk by default; `in_memory`: /dev/shm where it exists (a store there
// survives a process, not a reboot, and its flushes cost nothing).
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(bool in_memory = false) {
    const std::filesystem::path base = in_memory && std::filesystem::is_directory("/dev/shm")
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    std::string t = (base / "activekv-store-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace activekv::test
