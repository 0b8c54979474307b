// The benchmarks' machine lines (bench/bench_device.h): a raw output names
// its GPU, so figures of different machines are not compared unawares.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <vector>

#include "bench_device.h"
#include "temp_dir.h"

namespace activekv::bench {
namespace {

// A GPU's directory as the NVIDIA driver lists it (POSIX: temp_dir.h says why).
void write_gpu(const std::string& driver, const std::string& bus, const std::string& information) {
  ASSERT_EQ(::mkdir(driver.c_str(), 0755) == 0 || errno == EEXIST, true);
  ASSERT_EQ(::mkdir((driver + "/" + bus).c_str(), 0755), 0);
  std::ofstream(driver + "/" + bus + "/information") << information;
}

TEST(BenchDevice, NamesEachGpuModelInBusOrder) {
  const test::TempDir dir;
  const std::string driver = dir.path.string() + "/gpus";
  write_gpu(driver, "0000:c1:00.0", "Model: \t NVIDIA H200 \r\nIRQ:   42\n");
  write_gpu(driver, "0000:41:00.0", "IRQ:   17\nModel:           NVIDIA H100 80GB HBM3\nBus Type: PCIe\n");
  EXPECT_EQ(detail::gpu_models(driver), (std::vector<std::string>{"NVIDIA H100 80GB HBM3", "NVIDIA H200"}));
  EXPECT_EQ(gpu_model_names(driver), "NVIDIA H100 80GB HBM3, NVIDIA H200");
}

TEST(BenchDevice, SeveralOfAModelAreCounted) {
  const test::TempDir dir;
  const std::string driver = dir.path.string() + "/gpus";
  for (const char* bus : {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"})
    write_gpu(driver, bus, "Model: NVIDIA H200\n");
  EXPECT_EQ(gpu_model_names(driver), "NVIDIA H200 x3");
}

TEST(BenchDevice, NoDriverListsNoGpu) {
  const test::TempDir dir;
  const std::string driver = dir.path.string() + "/gpus";
  EXPECT_TRUE(detail::gpu_models(driver).empty());  // no driver directory
  write_gpu(driver, "0000:01:00.0", "IRQ: 17\n");   // no Model line
  EXPECT_TRUE(detail::gpu_models(driver).empty());
  EXPECT_EQ(gpu_model_names(driver), "");
}

}  // namespace
}  // namespace activekv::bench
