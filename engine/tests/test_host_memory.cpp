// The memory a host store may take: a cgroup's limit (v2 and v1, on the
// process's cgroup or an ancestor) where it is below the host's memory, read
// from a cgroup tree written here.
#include "activekv/host_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace activekv {
namespace {

namespace fs = std::filesystem;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::temp_directory_path() /
        ("activekv-cgroup-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "fs");
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& relative, const std::string& text) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::optional<HostMemory> limit() const {
    return cgroup_memory_limit((root_ / "proc-cgroup").string(), (root_ / "fs").string());
  }
  std::string file(const std::string& relative) const { return (root_ / "fs" / relative).string(); }
  fs::path root_;
};

TEST_F(CgroupTree, V2TheSmallestLimitOnTheCgroupAndItsAncestorsNamingItsFile) {
  write("proc-cgroup", "0::/system.slice/vllm.service\n");
  write("fs/memory.max", "max\n");
  write("fs/system.slice/memory.max", "8192\n");
  write("fs/system.slice/vllm.service/memory.max", "16384\n");  // its parent's cap still holds
  const auto found = limit();
  ASSERT_TRUE(found);
  EXPECT_EQ(found->bytes, 8192);
  EXPECT_EQ(found->what, "the memory limit of this process's cgroup, " + file("system.slice/memory.max"));
}

TEST_F(CgroupTree, V2InsideAContainerTheNamespacesRootHoldsTheLimit) {
  write("proc-cgroup", "0::/\n");
  write("fs/memory.max", "1073741824\n");
  ASSERT_TRUE(limit());
  EXPECT_EQ(limit()->bytes, 1073741824);
}

TEST_F(CgroupTree, V2MaxEverywhereIsNoLimit) {
  write("proc-cgroup", "0::/a\n");
  write("fs/memory.max", "max\n");
  write("fs/a/memory.max", "max\n");
  EXPECT_FALSE(limit());
}

TEST_F(CgroupTree, V1TheMemoryControllersLimitAndItsNoLimitNumber) {
  write("proc-cgroup", "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n");
  write("fs/memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  write("fs/memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  ASSERT_TRUE(limit());
  EXPECT_EQ(limit()->bytes, 2147483648);
  EXPECT_EQ(limit()->what,
            "the memory limit of this process's cgroup, " + file("memory/docker/abc/memory.limit_in_bytes"));
}

TEST_F(CgroupTree, V1AContainersOwnMountWithoutTheHostsPathIsFoundAbove) {
  write("proc-cgroup", "4:memory:/docker/abc\n");  // the host's path; the container mounts its own cgroup
  write("fs/memory/memory.limit_in_bytes", "536870912\n");
  ASSERT_TRUE(limit());
  EXPECT_EQ(limit()->bytes, 536870912);
}

TEST_F(CgroupTree, NothingReadableIsNoLimit) {
  EXPECT_FALSE(limit());  // no /proc file
  write("proc-cgroup", "garbage\n0::relative\n");
  EXPECT_FALSE(limit());
  write("proc-cgroup", "0::/\n");
  write("fs/memory.max", "-1\n");
  EXPECT_FALSE(limit());
}

TEST(HostMemory, TheSmallerOfTheHostAndTheCgroupLimit) {
  const HostMemory cgroup{4096, "the memory limit of this process's cgroup, X"};
  EXPECT_EQ(usable_host_memory(8192, cgroup).bytes, 4096);
  EXPECT_EQ(usable_host_memory(8192, cgroup).what, cgroup.what);
  EXPECT_EQ(usable_host_memory(2048, cgroup).bytes, 2048);
  EXPECT_EQ(usable_host_memory(2048, cgroup).what, "this host's memory");
  EXPECT_EQ(usable_host_memory(2048, std::nullopt).what, "this host's memory");
  EXPECT_GT(usable_host_memory().bytes, 0);
}

}  // namespace
}  // namespace activekv
