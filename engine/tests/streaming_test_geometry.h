// The five-layer model both streaming test files plan their geometries on.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "activekv/streaming_geometry.h"

namespace activekv::streaming_test {

using Names = std::vector<std::string>;

inline const Names kLayers = {"l0", "l1", "l2", "l3", "l4"};

inline StreamingGeometry geometry(std::int64_t resident = 1, std::int64_t ring = 2,
                                  Mode homes = Mode::kExact) {
  auto g = StreamingGeometry::plan(StreamingConfig{resident, ring, homes}, kLayers);
  EXPECT_TRUE(g.ok()) << g.status().error();
  return g.value();
}

}  // namespace activekv::streaming_test
