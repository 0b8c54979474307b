// StoreFile (store_file.h): recovery after a restart and after a kill, with
// plain bytes in and out.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "activekv/store_file.h"
#include "temp_dir.h"

namespace activekv {
namespace {

constexpr std::int64_t kSlots = 64;
constexpr std::int64_t kSlotBytes = 3000;  // not a page: slots straddle pages
const std::string kIdentity = "model=tiny dtype=bfloat16 block=16 mode=exact activekv=test";

using test::TempDir;

StoreFileOptions options(const std::filesystem::path& file, std::string identity = kIdentity,
                         std::int64_t slots = kSlots) {
  StoreFileOptions o;
  o.path = file.string();
  o.num_slots = slots;
  o.slot_bytes = kSlotBytes;
  o.identity = std::move(identity);
  return o;
}

StoreTag tag_of(std::uint32_t n) {
  StoreTag t{};
  std::memcpy(t.data(), &n, sizeof(n));
  t[35] = 7;  // the TP rank's bytes
  return t;
}

// The bytes a slot written for tag n holds: a function of n alone, so a
// recovered slot can be checked against its tag.
void fill(std::uint8_t* data, std::uint32_t n) {
  std::mt19937 rng(n);
  for (std::int64_t i = 0; i < kSlotBytes; ++i) data[i] = static_cast<std::uint8_t>(rng());
}

bool holds(const std::uint8_t* data, std::uint32_t n) {
  std::vector<std::uint8_t> want(static_cast<std::size_t>(kSlotBytes));
  fill(want.data(), n);
  return std::memcmp(data, want.data(), want.size()) == 0;
}

std::uint32_t tag_number(const StoreTag& t) {
  std::uint32_t n = 0;
  std::memcpy(&n, t.data(), sizeof(n));
  return n;
}

std::unique_ptr<StoreFile> open_ok(const StoreFileOptions& o) {
  auto f = StoreFile::open(o);
  EXPECT_TRUE(f.ok()) << f.status().error();
  return f.ok() ? std::move(f.value()) : nullptr;
}

void write_slot(StoreFile& f, std::int64_t slot, std::uint32_t n) {
  f.begin_write(slot);
  fill(f.layer_data(slot, 0), n);
  f.commit(slot, tag_of(n));
}

// As a device copy lands: half the bytes, a pause, the rest. A kill then often
// falls between them, leaving a slot half old and half new.
void write_slot_slowly(StoreFile& f, std::int64_t slot, std::uint32_t n) {
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(kSlotBytes));
  fill(bytes.data(), n);
  f.begin_write(slot);
  const std::size_t half = bytes.size() / 2;
  std::memcpy(f.layer_data(slot, 0), bytes.data(), half);
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  std::memcpy(f.layer_data(slot, 0) + half, bytes.data() + half, bytes.size() - half);
  f.commit(slot, tag_of(n));
}

TEST(StoreFile, ARestartRecoversEverySealedSlotWithItsTagAndBytes) {
  TempDir dir;
  {
    auto f = open_ok(options(dir.path / "store"));
    ASSERT_TRUE(f);
    EXPECT_TRUE(f->recovered().empty());
    for (std::uint32_t n : {3U, 9U, 27U}) write_slot(*f, n, 1000 + n);
  }
  auto f = open_ok(options(dir.path / "store"));
  ASSERT_TRUE(f);
  ASSERT_EQ(f->recovered().size(), 3U);
  for (const auto& r : f->recovered()) {
    EXPECT_EQ(tag_number(r.tag), 1000 + r.slot);
    EXPECT_TRUE(holds(f->layer_data(r.slot, 0), 1000 + static_cast<std::uint32_t>(r.slot)));
    EXPECT_TRUE(f->sealed(r.slot));
  }
  EXPECT_EQ(f->dropped_writing() + f->dropped_checksum(), 0);
}

TEST(StoreFile, AnUnfinishedWriteAndADroppedSlotAreNotRecovered) {
  TempDir dir;
  {
    auto f = open_ok(options(dir.path / "store"));
    write_slot(*f, 1, 1);
    write_slot(*f, 2, 2);
    write_slot(*f, 5, 5);
    f->begin_write(2);  // rewritten, the process gone before its commit
    fill(f->layer_data(2, 0), 99);
    f->drop(5);  // evicted
  }
  auto f = open_ok(options(dir.path / "store"));
  ASSERT_EQ(f->recovered().size(), 1U);
  EXPECT_EQ(f->recovered()[0].slot, 1);
  EXPECT_EQ(f->dropped_writing(), 1);
  EXPECT_FALSE(f->sealed(2));
  // Counted once: the next start finds the slot empty.
  f.reset();
  f = open_ok(options(dir.path / "store"));
  EXPECT_EQ(f->dropped_writing(), 0);
}

TEST(StoreFile, BytesChangedBehindASealAreDroppedByTheChecksum) {
  TempDir dir;
  const auto file = dir.path / "store";
  std::size_t slot_at = 0;
  {
    auto f = open_ok(options(file));
    write_slot(*f, 4, 4);
    write_slot(*f, 6, 6);
    slot_at = static_cast<std::size_t>(f->layer_data(6, 0) - f->layer_data(0, 0));
  }
  // One byte of slot 6 flipped through the file: a torn write the seal did not see.
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(io.tellg());
  const auto at =
      static_cast<std::streamoff>(size - static_cast<std::size_t>(kSlots * kSlotBytes) + slot_at + 100);
  io.seekg(at);
  const auto byte = static_cast<char>(io.get() ^ 0x01);
  io.seekp(at);
  io.put(byte);
  io.close();
  auto f = open_ok(options(file));
  ASSERT_EQ(f->recovered().size(), 1U);
  EXPECT_EQ(f->recovered()[0].slot, 4);
  EXPECT_EQ(f->dropped_checksum(), 1);
}

TEST(StoreFile, AnotherIdentityOrGeometryIsRefusedAndTheFileKept) {
  TempDir dir;
  const auto file = dir.path / "store";
  write_slot(*open_ok(options(file)), 0, 42);
  const auto other = StoreFile::open(options(file, "model=other dtype=bfloat16"));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().error().find("holds '" + kIdentity + "', not 'model=other dtype=bfloat16'"),
            std::string::npos)
      << other.status().error();
  const auto bigger = StoreFile::open(options(file, kIdentity, 2 * kSlots));
  ASSERT_FALSE(bigger.ok());
  for (const char* part : {"holds 64 slots of 3000 bytes", "needs 128 of 3000"}) {
    EXPECT_NE(bigger.status().error().find(part), std::string::npos) << bigger.status().error();
  }
  auto layered = options(file);
  layered.num_layers = 3;
  const auto other_layout = StoreFile::open(layered);
  ASSERT_FALSE(other_layout.ok());
  EXPECT_NE(other_layout.status().error().find("3 layers"), std::string::npos)
      << other_layout.status().error();
  auto f = open_ok(options(file));  // untouched by the refusals
  ASSERT_EQ(f->recovered().size(), 1U);
  EXPECT_TRUE(holds(f->layer_data(0, 0), 42));
}

// The host arena's layout: chunks of slots, layer-major inside each, the last
// chunk partly filled; a slot is one piece per layer, and the checksum covers
// every piece.
TEST(StoreFile, ItsIdentityChangesWithTheModelModeDtypeAndRank) {
  const ModelIdentity id{"m", "bfloat16", 32, 8, 128, 16, 2};
  const std::string same = store_file_identity(id, Mode::kExact, 1);
  EXPECT_EQ(store_file_identity(ModelIdentity(id), Mode::kExact, 1), same);
  // The format files written before carry: read back only if it is unchanged.
  EXPECT_EQ(same.rfind("activekv-store model=", 0), 0u) << same;
  EXPECT_NE(same.find(" mode=exact dtype=bfloat16 rank=1/2"), std::string::npos) << same;
  ModelIdentity other_model = id, other_dtype = id, other_layers = id;
  other_model.model = "n";
  other_dtype.dtype = "float16";
  other_layers.num_layers = 31;
  for (const std::string& other :
       {store_file_identity(id, Mode::kCompressed, 1), store_file_identity(id, Mode::kExact, 0),
        store_file_identity(other_model, Mode::kExact, 1), store_file_identity(other_dtype, Mode::kExact, 1),
        store_file_identity(other_layers, Mode::kExact, 1)}) {
    EXPECT_NE(other, same);
  }
}

TEST(StoreFile, ASlotIsOnePiecePerLayerInTheArenasChunks) {
  TempDir dir;
  StoreFileOptions o = options(dir.path / "store", kIdentity, 10);
  o.num_layers = 3;
  o.slots_per_chunk = 4;  // chunks of 4, 4 and 2 slots
  const std::int64_t piece = kSlotBytes / 3;
  {
    auto f = open_ok(o);
    ASSERT_EQ(f->layer_bytes(), piece);
    // Chunk c is [layers, rows, piece]: slot 9 is row 1 of the last chunk (2 rows).
    EXPECT_EQ(f->layer_data(9, 2) - f->chunk_data(2), (2 * 2 + 1) * piece);
    EXPECT_EQ(f->chunk_data(1) - f->chunk_data(0), 4 * kSlotBytes);
    EXPECT_EQ(f->chunk_rows(2), 2);
    for (const std::int64_t slot : {0, 5, 9}) {
      f->begin_write(slot);
      for (std::int64_t l = 0; l < 3; ++l)
        std::memset(f->layer_data(slot, l), static_cast<int>(slot + l), piece);
      f->commit(slot, tag_of(static_cast<std::uint32_t>(slot)));
    }
    f->layer_data(5, 2)[piece - 1] ^= 1;  // slot 5's last layer torn after sealing
  }
  auto f = open_ok(o);
  std::vector<std::int64_t> recovered;
  for (const auto& r : f->recovered()) recovered.push_back(r.slot);
  EXPECT_EQ(recovered, (std::vector<std::int64_t>{0, 9}));
  EXPECT_EQ(f->dropped_checksum(), 1);
  EXPECT_EQ(f->layer_data(9, 2)[0], 11);
}

TEST(StoreFile, BadPathsSayWhatIsWrong) {
  TempDir dir;
  const auto missing = StoreFile::open(options(dir.path / "no-such-dir" / "store"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().error().find("its directory does not exist"), std::string::npos);
  {
    std::ofstream(dir.path / "junk") << "not a store";
  }
  const auto junk = StoreFile::open(options(dir.path / "junk"));
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().error().find("is not an ActiveKV store"), std::string::npos)
      << junk.status().error();
  if (::geteuid() != 0) {  // root writes anywhere
    ::mkdir((dir.path / "ro").c_str(), 0700);
    ::chmod((dir.path / "ro").c_str(), 0500);
    const auto ro = StoreFile::open(options(dir.path / "ro" / "store"));
    ASSERT_FALSE(ro.ok());
    EXPECT_NE(ro.status().error().find("cannot be opened for reading and writing"), std::string::npos);
  }
}

TEST(StoreFile, ASecondProcessJoinsALiveHoldersFileAndADeadOneLeavesNoLock) {
  TempDir dir;
  const auto file = dir.path / "store";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {  // another vLLM: one slot sealed, one killed mid-write
    auto f = StoreFile::open(options(file));
    char c = 'n';
    if (f.ok() && !f.value()->joined()) {
      write_slot(*f.value(), 3, 3);
      f.value()->begin_write(4);
      c = 'y';
    }
    (void)!::write(ready[1], &c, 1);
    ::pause();  // until killed
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  {
    auto joined = open_ok(options(file));
    ASSERT_TRUE(joined);
    EXPECT_TRUE(joined->joined());
    EXPECT_TRUE(joined->recovered().empty()) << "a joining process must not recover a live holder's file";
    ASSERT_TRUE(joined->sealed_tag(3));
    EXPECT_EQ(tag_number(*joined->sealed_tag(3)), 3u);
    EXPECT_TRUE(holds(joined->layer_data(3, 0), 3)) << "one mapping: the holder's bytes are the joiner's";
    EXPECT_FALSE(joined->sealed(4));
    write_slot(*joined, 5, 5);
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    EXPECT_TRUE(open_ok(options(file))->joined()) << "this process still holds it";
  }
  // Nobody holds it now (the kernel dropped the dead holder's locks): the next
  // open recovers it.
  auto again = open_ok(options(file));
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->joined());
  std::vector<std::uint32_t> recovered;
  for (const auto& r : again->recovered()) recovered.push_back(tag_number(r.tag));
  EXPECT_EQ(recovered, (std::vector<std::uint32_t>{3, 5})) << "in commit order, across both processes";
  EXPECT_EQ(again->dropped_writing(), 1);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(StoreFile, AFullDiskIsRefusedAtOpenAndLeavesNoFile) {
  TempDir dir;
  const auto file = dir.path / "store";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // a file system with 64 KiB free, as the file size limit makes it
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit limit{65536, 65536};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    const auto f = StoreFile::open(options(file));
    const bool said = !f.ok() && f.status().error().find("cannot reserve") != std::string::npos &&
                      f.status().error().find("lower capacity_bytes") != std::string::npos;
    ::_exit(said ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the open did not fail saying what to do";
  struct stat st{};
  EXPECT_TRUE(::stat(file.c_str(), &st) != 0 || st.st_size == 0) << "a refused open left data behind";
}

TEST(StoreFile, ACreationCutOffBeforeItsHeaderIsMadeAgain) {
  TempDir dir;
  const auto file = dir.path / "store";
  {
    std::ofstream out(file, std::ios::binary);  // the space reserved, the header never written
    out << std::string(64 * 1024, '\0');
  }
  auto f = open_ok(options(file));
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->recovered().empty());
  write_slot(*f, 2, 2);
  f.reset();
  auto again = open_ok(options(file));
  ASSERT_TRUE(again);
  ASSERT_EQ(again->recovered().size(), 1u);
  EXPECT_EQ(tag_number(again->recovered()[0].tag), 2u);
}

TEST(StoreFile, KilledAtRandomPointsOfASaveStormNothingTornIsRecovered) {
  TempDir dir(/*in_memory=*/true);  // many saves a millisecond, so kills land mid-save
  const auto file = dir.path / "store";
  std::mt19937 rng(24);
  std::uint32_t next = 1;
  std::size_t recovered = 0;
  for (int round = 0; round < 16; ++round) {
    const std::uint32_t first = next;
    next += 1u << 20;  // each round writes tags of its own
    const pid_t writer = ::fork();
    ASSERT_GE(writer, 0);
    if (writer == 0) {
      auto f = StoreFile::open(options(file));
      if (!f.ok()) ::_exit(3);
      std::mt19937 slots(first);
      for (std::uint32_t n = first;; ++n) {  // until killed
        const auto slot = static_cast<std::int64_t>(slots() % kSlots);
        if (slots() % 5 == 0) {
          f.value()->drop(slot);
        } else {
          write_slot_slowly(*f.value(), slot, n);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 20000));
    ::kill(writer, SIGKILL);
    int status = 0;
    ::waitpid(writer, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself (" << status << ")";
    auto f = open_ok(options(file));
    ASSERT_TRUE(f);
    for (const auto& r : f->recovered()) {
      EXPECT_TRUE(holds(f->layer_data(r.slot, 0), tag_number(r.tag)))
          << "round " << round << " slot " << r.slot;
    }
    recovered += f->recovered().size();
  }
  EXPECT_GT(recovered, 0U);  // the storm sealed something: the check above checked
}

// The scheduler's process reads the sealed slots while a worker holds the
// file, in commit order (the LRU order across restarts), and a file of
// another identity is refused there too.
TEST(StoreFile, TheSealedSlotsAreReadInCommitOrderWhileHeld) {
  TempDir dir;
  const auto file = dir.path / "store";
  {
    auto f = open_ok(options(file));
    for (const std::int64_t slot : {3, 1, 2}) write_slot(*f, slot, 500 + static_cast<std::uint32_t>(slot));
  }
  auto held = open_ok(options(file));
  write_slot(*held, 0, 500);  // committed after the restart: the newest
  std::vector<std::int64_t> order;
  for (const auto& r : held->recovered()) order.push_back(r.slot);
  EXPECT_EQ(order, (std::vector<std::int64_t>{3, 1, 2}));
  const auto sealed = StoreFile::read_sealed(file.string(), kIdentity);
  ASSERT_TRUE(sealed.ok()) << sealed.status().error();
  order.clear();
  for (const auto& r : sealed.value()) {
    order.push_back(r.slot);
    EXPECT_EQ(tag_number(r.tag), 500 + static_cast<std::uint32_t>(r.slot));
  }
  EXPECT_EQ(order, (std::vector<std::int64_t>{3, 1, 2, 0}));
  const auto other = StoreFile::read_sealed(file.string(), "model=other");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().error().find("not 'model=other'"), std::string::npos) << other.status().error();
}

}  // namespace
}  // namespace activekv
