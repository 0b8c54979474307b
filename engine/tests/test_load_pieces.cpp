// A step's loads in pieces (activekv/load_pieces.h), without a device: every
// layer's rows covered once, in layer order, no piece over its bound; a
// piece's runs are the slots of exactly its rows.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "activekv/load_pieces.h"

namespace activekv {
namespace {

using detail::LoadPiece;

TEST(LoadPieces, CoverEveryLayersRowsOnceInLayerOrderWithinTheBound) {
  const std::int64_t layers = 3, rows = 10, piece_rows = 4;
  const std::vector<LoadPiece> pieces = detail::load_pieces(layers, rows, piece_rows);
  std::vector<std::vector<int>> seen(static_cast<std::size_t>(layers),
                                     std::vector<int>(static_cast<std::size_t>(rows), 0));
  std::int64_t last_layer = 0;
  for (const auto& p : pieces) {
    EXPECT_GE(p.layer, last_layer) << "pieces out of layer order";
    last_layer = p.layer;
    EXPECT_GT(p.rows, 0);
    EXPECT_LE(p.rows, piece_rows);
    for (std::int64_t r = p.row; r < p.row + p.rows; ++r) {
      ++seen[static_cast<std::size_t>(p.layer)][static_cast<std::size_t>(r)];
    }
  }
  for (const auto& layer : seen) EXPECT_EQ(layer, std::vector<int>(static_cast<std::size_t>(rows), 1));
  EXPECT_EQ(pieces.size(), 9u);  // 4 + 4 + 2 rows a layer
}

TEST(LoadPieces, ABoundOverTheRowsIsOnePieceALayerAndNoRowsNoPiece) {
  const auto pieces = detail::load_pieces(2, 5, 100);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1].layer, 1);
  EXPECT_EQ(pieces[1].row, 0);
  EXPECT_EQ(pieces[1].rows, 5);
  EXPECT_TRUE(detail::load_pieces(2, 0, 4).empty());
}

TEST(LoadPieces, RunsWithinAPieceAreTheSlotsOfExactlyItsRows) {
  // Load order rows 0-3 from slots 5-8, row 4 from slot 20, rows 5-6 from 30-31.
  const std::vector<std::int64_t> slots{5, 6, 7, 8, 20, 30, 31};
  const std::vector<SlotRun> runs{{5, 4, 0}, {20, 1, 4}, {30, 2, 5}};
  for (std::int64_t row = 0; row < 7; ++row) {
    for (std::int64_t n = 1; row + n <= 7; ++n) {
      std::vector<std::int64_t> got(static_cast<std::size_t>(n), -1);
      for (const auto& part : detail::runs_within(runs, row, n)) {
        ASSERT_GE(part.offset, 0);
        ASSERT_LE(part.offset + part.count, n);
        for (std::int64_t i = 0; i < part.count; ++i) {
          EXPECT_EQ(got[static_cast<std::size_t>(part.offset + i)], -1) << "a row copied twice";
          got[static_cast<std::size_t>(part.offset + i)] = part.first + i;
        }
      }
      const std::vector<std::int64_t> want(slots.begin() + row, slots.begin() + row + n);
      EXPECT_EQ(got, want) << "rows " << row << ".." << row + n - 1;
    }
  }
}

}  // namespace
}  // namespace activekv
