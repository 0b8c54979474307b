// The benchmarks' machine lines (bench/bench_device.h): a raw output names
// its GPU, so figures of different machines are not compared unawares.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_device.h"
#include "temp_dir.h"

namespace activekv::bench {
namespace {

void write_gpu(const std::filesystem::path& driver, const std::string& bus, const std::string& information) {
  std::filesystem::create_directories(driver / bus);
  std::ofstream(driver / bus / "information") << information;
}

TEST(BenchDevice, NamesEachGpuModelInBusOrder) {
  const test::TempDir driver;
  write_gpu(driver.path, "0000:c1:00.0", "Model: \t NVIDIA H200\nIRQ:   42\n");
  write_gpu(driver.path, "0000:41:00.0", "IRQ:   17\nModel:           NVIDIA H100 80GB HBM3\nBus Type: PCIe\n");
  EXPECT_EQ(detail::gpu_models(driver.path), (std::vector<std::string>{"NVIDIA H100 80GB HBM3", "NVIDIA H200"}));
}

TEST(BenchDevice, NoDriverListsNoGpu) {
  const test::TempDir driver;
  EXPECT_TRUE(detail::gpu_models(driver.path / "absent").empty());
  write_gpu(driver.path, "0000:01:00.0", "IRQ: 17\n");  // no Model line
  EXPECT_TRUE(detail::gpu_models(driver.path).empty());
}

}  // namespace
}  // namespace activekv::bench
