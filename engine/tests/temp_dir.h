// A directory for one test, removed with everything in it when the test ends.
#pragma once

#include <ftw.h>
#include <stdlib.h>

#include <cstdio>

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
  // POSIX, not std::filesystem::remove_all: the CUDA torch 2.11 wheel's
  // libtorch exports std::filesystem symbols of its own, and its remove_all
  // crashed the tests there (a call through a null pointer, on the H200
  // machine). Tests keep to POSIX for what touches the disk.
  ~TempDir() {
    ::nftw(
        path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace activekv::test
