// PlanPieces (slices, runs, gaps, file interleaving), the chunk checksums, and
// the small sizing helpers the writer, reader and copies share (pieces.h).
#include "pieces.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "pyckpt/crc32c.h"

namespace pyckpt {
namespace {

// Bit-at-a-time CRC-32C (reflected polynomial 0x82F63B78): a reference that
// shares no code with the library's implementations.
uint32_t ReferenceCrc32c(const char* data, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= static_cast<uint8_t>(data[i]);
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t ReferenceMasked(const char* data, size_t n) {
  const uint32_t crc = ReferenceCrc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// A piece as text, so that a wrong one fails with a readable message. A slice
// shows its item and where in it it starts; a run, its range of plan.order.
std::string Describe(const Piece& p) {
  auto n = [](uint64_t v) { return std::to_string(v); };
  const std::string where = "file " + n(p.file) + " [" + n(p.begin) + ", " + n(p.end) + ")";
  if (p.run) return "run " + where + " order[" + n(p.run_first) + ", " + n(p.run_last) + ")";
  return "slice " + where + " item " + n(p.item) + " from byte " + n(p.item_begin);
}

std::string SlicePiece(uint32_t file, uint64_t begin, uint64_t end, size_t item,
                       uint64_t item_begin) {
  Piece p;
  p.file = file, p.begin = begin, p.end = end, p.item = item, p.item_begin = item_begin;
  return Describe(p);
}

std::string RunPiece(uint32_t file, uint64_t begin, uint64_t end, size_t first, size_t last) {
  Piece p;
  p.run = true, p.file = file, p.begin = begin, p.end = end, p.run_first = first, p.run_last = last;
  return Describe(p);
}

TEST(PlanPieces, SlicesRunsGapsAndFileInterleaving) {
  // chunk 16, piece 64, max_gap 8; items given out of (file, offset) order.
  const std::vector<Span> items = {
      {1, 24, 8},   // 0: file 1, joins the run of item 1
      {1, 16, 8},   // 1: file 1, small: starts a run
      {0, 48, 100}, // 2: >= chunk: two slices (64 + 36 bytes)
      {0, 0, 10},   // 3: small: run [0, 22) with item 4 (gap 2)
      {0, 12, 10},  // 4
      {1, 0, 0},    // 5: empty: no piece, not in the order
      {0, 40, 5},   // 6: gap 18 > max_gap: a run of its own
      {1, 0, 16},   // 7: exactly one chunk: a slice, not a run
  };
  const PiecePlan plan = PlanPieces(items, 16, 64, 8);
  EXPECT_EQ((std::vector<size_t>{3, 4, 6, 2, 7, 1, 0}), plan.order);
  EXPECT_EQ(22u, plan.max_run_bytes);
  ASSERT_EQ(6u, plan.pieces.size());
  // Round-robin over the files: f0[0], f1[0], f0[1], f1[1], f0[2], f0[3].
  EXPECT_EQ(RunPiece(0, 0, 22, 0, 2), Describe(plan.pieces[0]));
  EXPECT_EQ(SlicePiece(1, 0, 16, 7, 0), Describe(plan.pieces[1]));
  EXPECT_EQ(RunPiece(0, 40, 45, 2, 3), Describe(plan.pieces[2]));
  EXPECT_EQ(RunPiece(1, 16, 32, 5, 7), Describe(plan.pieces[3]));
  EXPECT_EQ(SlicePiece(0, 48, 112, 2, 0), Describe(plan.pieces[4]));
  EXPECT_EQ(SlicePiece(0, 112, 148, 2, 64), Describe(plan.pieces[5]));
}

TEST(PlanPieces, EveryNonEmptyByteIsCoveredOnce) {
  std::mt19937_64 rng(7);
  std::vector<Span> items;
  uint64_t pos[3] = {0, 0, 0};
  for (int i = 0; i < 200; ++i) {
    const uint32_t f = static_cast<uint32_t>(rng() % 3);
    const uint64_t n = (i % 7 == 0) ? 0 : rng() % (i % 5 == 0 ? 5000 : 300);
    items.push_back({f, pos[f], n});
    pos[f] += n + rng() % 40;  // gaps, some over max_gap
  }
  const uint64_t chunk = 256, piece = 1024;
  const PiecePlan plan = PlanPieces(items, chunk, piece, 16);
  std::vector<uint64_t> covered(items.size(), 0);
  for (const Piece& p : plan.pieces) {
    ASSERT_LT(p.begin, p.end);
    EXPECT_LE(p.end - p.begin, piece);
    if (!p.run) {
      EXPECT_EQ(0u, p.item_begin % chunk);  // slices start on a chunk
      EXPECT_EQ(items[p.item].offset + p.item_begin, p.begin);
      covered[p.item] += p.end - p.begin;
      continue;
    }
    EXPECT_LE(p.end - p.begin, plan.max_run_bytes);
    for (size_t k = p.run_first; k < p.run_last; ++k) {
      const Span& s = items[plan.order[k]];
      EXPECT_LT(s.nbytes, chunk);  // only small items form runs
      EXPECT_EQ(p.file, s.file);
      EXPECT_GE(s.offset, p.begin);
      EXPECT_LE(s.offset + s.nbytes, p.end);
      covered[plan.order[k]] += s.nbytes;
    }
  }
  for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(items[i].nbytes, covered[i]) << "item " << i;
}

TEST(PlanPieces, RunsStopAtPieceSizeOverlapAndFileChange) {
  // piece 32, max_gap large: four 10-byte items back to back exceed one piece.
  PiecePlan plan = PlanPieces({{0, 0, 10}, {0, 10, 10}, {0, 20, 10}, {0, 30, 10}}, 16, 32, 1000);
  ASSERT_EQ(2u, plan.pieces.size());
  EXPECT_EQ(RunPiece(0, 0, 30, 0, 3), Describe(plan.pieces[0]));
  EXPECT_EQ(RunPiece(0, 30, 40, 3, 4), Describe(plan.pieces[1]));
  EXPECT_EQ(30u, plan.max_run_bytes);

  // An item that starts before the run's end (overlap) starts a new run.
  plan = PlanPieces({{0, 0, 10}, {0, 5, 10}}, 16, 64, 1000);
  ASSERT_EQ(2u, plan.pieces.size());
  EXPECT_EQ(RunPiece(0, 0, 10, 0, 1), Describe(plan.pieces[0]));
  EXPECT_EQ(RunPiece(0, 5, 15, 1, 2), Describe(plan.pieces[1]));

  // Adjacent items in different files never share a run; max_gap 0 still
  // merges touching items.
  plan = PlanPieces({{0, 0, 4}, {0, 4, 4}, {1, 8, 4}}, 16, 64, 0);
  ASSERT_EQ(2u, plan.pieces.size());
  EXPECT_EQ(RunPiece(0, 0, 8, 0, 2), Describe(plan.pieces[0]));
  EXPECT_EQ(RunPiece(1, 8, 12, 2, 3), Describe(plan.pieces[1]));
}

TEST(PlanPieces, WholeItemsKeepEachItemsSlicesInARow) {
  // chunk 16, piece 32: item 0 (file 0, 96 bytes) has 3 slices, item 1 (file 1,
  // 64 bytes) 2, item 2 (file 0, 32 bytes) 1. By piece the files alternate slice
  // by slice; by whole items, file 0's item 0 goes first in full.
  const std::vector<Span> items = {{0, 0, 96}, {1, 0, 64}, {0, 96, 32}};
  PiecePlan plan = PlanPieces(items, 16, 32, 0);
  ASSERT_EQ(6u, plan.pieces.size());
  EXPECT_EQ(SlicePiece(0, 0, 32, 0, 0), Describe(plan.pieces[0]));
  EXPECT_EQ(SlicePiece(1, 0, 32, 1, 0), Describe(plan.pieces[1]));
  plan = PlanPieces(items, 16, 32, 0, /*whole_items=*/true);
  std::vector<std::string> got;
  for (const Piece& p : plan.pieces) got.push_back(Describe(p));
  const std::vector<std::string> want = {
      SlicePiece(0, 0, 32, 0, 0),  SlicePiece(0, 32, 64, 0, 32), SlicePiece(0, 64, 96, 0, 64),
      SlicePiece(1, 0, 32, 1, 0),  SlicePiece(1, 32, 64, 1, 32), SlicePiece(0, 96, 128, 2, 0)};
  EXPECT_EQ(want, got);
}

TEST(PlanPieces, EmptyInputAndOnlyEmptyItems) {
  PiecePlan plan = PlanPieces({}, 16, 64, 8);
  EXPECT_TRUE(plan.order.empty());
  EXPECT_TRUE(plan.pieces.empty());
  EXPECT_EQ(0u, plan.max_run_bytes);
  plan = PlanPieces({{0, 0, 0}, {3, 100, 0}}, 16, 64, 8);
  EXPECT_TRUE(plan.order.empty());
  EXPECT_TRUE(plan.pieces.empty());
}

TEST(ChunkChecksums, KnownValues) {
  // CRC-32C("123456789") = 0xe3069283 (the standard check value); masked 0xc78ab0e5.
  const char digits[] = "123456789";
  uint32_t out[3] = {1, 1, 1};
  ChunkChecksums(digits, 0, 9, 16, out);
  EXPECT_EQ(0xc78ab0e5u, out[0]);
  EXPECT_EQ(1u, out[1]);  // one chunk only
  ChunkChecksums(digits, 0, 9, 4, out);  // "1234", "5678", "9"
  EXPECT_EQ(0x8c60d74du, out[0]);
  EXPECT_EQ(ReferenceMasked("5678", 4), out[1]);
  EXPECT_EQ(ReferenceMasked("9", 1), out[2]);
  EXPECT_EQ(crc32c::Unmask(out[0]), ReferenceCrc32c("1234", 4));
}

TEST(ChunkChecksums, OffsetStartAndPartialLastChunk) {
  std::vector<char> data(1000);
  std::mt19937 rng(3);
  for (char& c : data) c = static_cast<char>(rng());
  const uint64_t chunk = 64;
  // Logical bytes [640, 1000) of a tensor: chunks 10 .. 15, the last 40 bytes.
  std::vector<uint32_t> out(NumChunks(1000, chunk), 0);
  ChunkChecksums(data.data() + 640, 640, 360, chunk, out.data());
  for (size_t c = 0; c < 10; ++c) EXPECT_EQ(0u, out[c]) << "chunk " << c << " is not in the range";
  for (size_t c = 10; c < out.size(); ++c) {
    const uint64_t b = c * chunk, len = std::min<uint64_t>(chunk, 1000 - b);
    EXPECT_EQ(ReferenceMasked(data.data() + b, len), out[c]) << "chunk " << c;
  }
  EXPECT_EQ(ReferenceMasked(data.data() + 960, 40), out[15]);
}

TEST(ChunkChecksums, ZeroBytesWritesNothing) {
  uint32_t out[2] = {0xdeadbeefu, 0xdeadbeefu};
  ChunkChecksums(nullptr, 0, 0, 16, out);
  EXPECT_EQ(0xdeadbeefu, out[0]);
  EXPECT_EQ(0xdeadbeefu, out[1]);
}

TEST(PieceSizes, NumChunks) {
  EXPECT_EQ(0u, NumChunks(0, 16));
  EXPECT_EQ(1u, NumChunks(1, 16));
  EXPECT_EQ(1u, NumChunks(16, 16));
  EXPECT_EQ(2u, NumChunks(17, 16));
  EXPECT_EQ(4096u, NumChunks(uint64_t{1} << 32, 1u << 20));
}

TEST(PieceSizes, RoundToChunks) {
  EXPECT_EQ(16u, RoundToChunks(0, 16));     // at least one chunk
  EXPECT_EQ(16u, RoundToChunks(5, 16));
  EXPECT_EQ(32u, RoundToChunks(47, 16));    // rounded down
  EXPECT_EQ(48u, RoundToChunks(48, 16));
  EXPECT_EQ(8u << 20, RoundToChunks(8u << 20, 1u << 20));
  EXPECT_EQ(3000u * 2796, RoundToChunks(8u << 20, 3000));
}

TEST(PieceSizes, StepSizeIsAboutOneMiBOfWholeChunks) {
  EXPECT_EQ(1u << 20, StepSize(1u << 20));
  EXPECT_EQ(4u << 20, StepSize(4u << 20));  // never below one chunk
  EXPECT_EQ(1u << 20, StepSize(1));
  EXPECT_EQ(1u << 20, StepSize(64u << 10));
  EXPECT_EQ(349u * 3000, StepSize(3000));   // 1048576 / 3000 = 349 whole chunks
}

TEST(SplitItem, CutsIntoPiecesAndAppends) {
  std::vector<ItemRange> out = {{9, 1, 2}};
  EXPECT_EQ(3u, SplitItem(4, 10, 4, &out));
  ASSERT_EQ(4u, out.size());
  EXPECT_EQ(9u, out[0].item);  // existing entries are kept
  const uint64_t want[3][2] = {{0, 4}, {4, 8}, {8, 10}};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(4u, out[k + 1].item);
    EXPECT_EQ(want[k][0], out[k + 1].begin);
    EXPECT_EQ(want[k][1], out[k + 1].end);
  }
  EXPECT_EQ(2u, SplitItem(5, 8, 4, &out));  // an exact multiple: no empty tail
  EXPECT_EQ(8u, out.back().end);
  EXPECT_EQ(4u, out.back().begin);
  EXPECT_EQ(1u, SplitItem(6, 3, 4, &out));  // smaller than a piece
  EXPECT_EQ(3u, out.back().end);
  const size_t before = out.size();
  EXPECT_EQ(0u, SplitItem(7, 0, 4, &out));  // empty: nothing
  EXPECT_EQ(before, out.size());
}

}  // namespace
}  // namespace pyckpt
