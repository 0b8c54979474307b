// The host store's start-up cost: a store full of sealed slots, closed, then
// opened again as a restarted vLLM does (the worker's reopen verifies every
// sealed slot's checksum: it reads every byte; the scheduler then rebuilds the
// shared index from the sealed records), and attached by a second vLLM while
// the first holds it (no verification, no rebuild). Prints one line per size
// and RESULT JSON.
//
//   store_file_bench [--dir /dev/shm] [--gib 1,8] [--slot-bytes 2097152]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "activekv/host_arena.h"
#include "activekv/shared_block_index.h"
#include "activekv/store_file.h"
#include "bench_flags.h"

namespace {

constexpr const char* kUsage =
    "usage: store_file_bench [--dir /dev/shm] [--gib 1,8] [--slot-bytes 2097152]\n";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using Blocks = std::vector<std::pair<activekv::BlockKey, std::int64_t>>;

// A check the measured path must pass; the run stops with the message.
void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// The arena's layout at 32 layers: 256 MiB chunks, so a slot is 32 pieces.
activekv::StoreFileOptions store_options(const std::filesystem::path& path, std::int64_t gib,
                                         std::int64_t slot_bytes) {
  activekv::StoreFileOptions o;
  o.path = path.string();
  o.num_slots = (gib << 30) / slot_bytes;
  o.slot_bytes = slot_bytes;
  o.num_layers = 32;
  o.slots_per_chunk = std::max<std::int64_t>(1, activekv::chunk_bytes_for(32) / slot_bytes);
  o.identity = "bench";
  return o;
}

// A new store file with every slot written and sealed, then closed: the
// seconds to create it and to fill it.
std::pair<double, double> fill_store(const activekv::StoreFileOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  auto f = activekv::StoreFile::open(o);
  require(f.ok(), f.ok() ? "" : f.status().error());
  const double create_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = 0; s < o.num_slots; ++s) {
    f.value()->begin_write(s);
    for (std::int64_t l = 0; l < o.num_layers; ++l) {
      std::memset(f.value()->layer_data(s, l), static_cast<int>((s + l) & 0xff),
                  static_cast<std::size_t>(o.slot_bytes / o.num_layers));
    }
    activekv::StoreTag tag{};
    std::memcpy(tag.data(), &s, sizeof(s));
    f.value()->commit(s, tag);
  }
  return {create_s, seconds_since(t0)};
}

// Saves into the full index, each evicting the least recently used block
// (what every save costs the scheduler once the store has filled): us a save.
double evicting_save_us(activekv::SharedBlockIndex& index, std::int64_t num_slots) {
  constexpr int kSaves = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kSaves; ++i) {
    activekv::BlockKey key{};
    const std::int64_t n = num_slots + i;
    std::memcpy(key.data(), &n, sizeof(n));
    key[31] = 0x5a;
    const auto r = index.reserve(key);
    require(r.slot && r.evicted.size() == 1, "a save into the full index did not evict one block");
    index.commit(*r.slot);
  }
  return seconds_since(t0) * 1e6 / kSaves;
}

// One store of `gib` GiB in `dir`: filled, reopened as a restarted vLLM
// does, its index rebuilt, saved into, and joined by a second vLLM.
void measure(const std::string& dir, std::int64_t gib, std::int64_t slot_bytes) {
  const std::filesystem::path path =
      std::filesystem::path(dir) / ("activekv-store-bench-" + std::to_string(gib));
  std::filesystem::remove(path);
  const activekv::StoreFileOptions o = store_options(path, gib, slot_bytes);
  const auto [create_s, fill_s] = fill_store(o);
  std::printf("store %lld GiB in %s: created in %.2f s, %lld slots written and sealed in %.2f s\n",
              static_cast<long long>(gib), dir.c_str(), create_s, static_cast<long long>(o.num_slots),
              fill_s);
  auto t0 = std::chrono::steady_clock::now();
  auto f = activekv::StoreFile::open(o);
  const double open_s = seconds_since(t0);
  require(f.ok() && static_cast<std::int64_t>(f.value()->recovered().size()) == o.num_slots,
          "reopen did not recover every slot");
  std::printf("store %lld GiB: reopened in %.2f s, %zu slots verified (%.1f GB/s)\n",
              static_cast<long long>(gib), open_s, f.value()->recovered().size(),
              static_cast<double>(gib << 30) / open_s / 1e9);
  // The scheduler's side of the same restart: the sealed records read and
  // the shared index made from them, as SchedulerSide does.
  const std::string index_path = path.string() + ".index";
  std::filesystem::remove(index_path);
  const auto sealed_blocks = [&]() -> activekv::Result<Blocks> {
    auto sealed = activekv::StoreFile::read_sealed(o.path, "");
    if (!sealed.ok()) return sealed.status();
    Blocks blocks;
    for (const auto& r : sealed.value()) blocks.emplace_back(activekv::key_of(r.tag), r.slot);
    return blocks;
  };
  t0 = std::chrono::steady_clock::now();
  auto index = activekv::SharedBlockIndex::open(index_path, o.num_slots, sealed_blocks);
  const double rebuild_s = seconds_since(t0);
  require(index.ok() && index.value()->restored() == o.num_slots,
          "the index rebuild did not restore every slot");
  const double save_us = evicting_save_us(*index.value(), o.num_slots);
  std::printf("store %lld GiB: an evicting save costs the index %.1f us (%lld slots)\n",
              static_cast<long long>(gib), save_us, static_cast<long long>(o.num_slots));
  // A second vLLM attaching while this one holds the store.
  t0 = std::chrono::steady_clock::now();
  auto second_file = activekv::StoreFile::open(o);
  auto second_index = activekv::SharedBlockIndex::open(index_path, o.num_slots, sealed_blocks);
  const double join_s = seconds_since(t0);
  require(second_file.ok() && second_file.value()->joined() && second_index.ok() &&
              second_index.value()->joined(),
          "the second attach did not join");
  std::printf(
      "store %lld GiB: index rebuilt from the sealed records in %.2f s (%lld blocks); "
      "a second vLLM joined the store in %.3f s\n",
      static_cast<long long>(gib), rebuild_s, static_cast<long long>(index.value()->restored()), join_s);
  std::printf(
      "RESULT {\"gib\": %lld, \"dir\": \"%s\", \"slot_bytes\": %lld, \"slots\": %lld, \"fill_s\": %.3f, "
      "\"reopen_s\": %.3f, \"index_rebuild_s\": %.3f, \"evicting_save_us\": %.2f, \"second_join_s\": "
      "%.3f}\n",
      static_cast<long long>(gib), dir.c_str(), static_cast<long long>(slot_bytes),
      static_cast<long long>(o.num_slots), fill_s, open_s, rebuild_s, save_us, join_s);
  second_index.value().reset();
  second_file.value().reset();
  index.value().reset();
  f.value().reset();
  std::filesystem::remove(path);
  std::filesystem::remove(index_path);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/dev/shm";
  std::vector<std::int64_t> gib = {1, 8};
  std::int64_t slot_bytes = std::int64_t{2} << 20;  // a 16-token block of Llama-3-8B, 32 layers, exact
  const auto stop =
      activekv::bench::parse_flags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
        namespace bench = activekv::bench;
        if (k == "--dir") {
          dir = v;
        } else if (k == "--slot-bytes") {
          slot_bytes = bench::whole_number(k, v, 1);
        } else if (k == "--gib") {
          gib.clear();
          for (const auto& part : bench::parts(k, v)) gib.push_back(bench::whole_number(k, part, 1));
        } else {
          return false;
        }
        return true;
      });
  if (stop) return *stop;
  try {
    for (const std::int64_t g : gib) measure(dir, g, slot_bytes);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
