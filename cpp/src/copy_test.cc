// CopyTensors (copy.h): byte-for-byte copies between contiguous, strided and
// reversed views, split into pieces that cut through elements; the errors it
// documents; and CopyRangeDirect, the gather/scatter step it shares with
// StagedWrite::Stage.
#include "pyckpt/copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "pyckpt/tensor_view.h"
#include "test_util.h"

namespace pyckpt {
namespace {

using testutil::LogicalBytes;
using testutil::RandomBytes;
using testutil::View;

TEST(CopyTensors, ContiguousRoundTripAcrossManyPieces) {
  const size_t sizes[3] = {1, 1000003, 4097};
  std::vector<std::vector<char>> src, dst;
  std::vector<TensorView> s, d;
  for (size_t i = 0; i < 3; ++i) {
    src.push_back(RandomBytes(sizes[i], static_cast<unsigned>(i + 1)));
    dst.emplace_back(sizes[i], 0);
  }
  for (size_t i = 0; i < 3; ++i) {
    s.push_back(TensorView::Bytes(src[i].data(), sizes[i]));
    d.push_back(TensorView::Bytes(dst[i].data(), sizes[i]));
  }
  ASSERT_TRUE(CopyTensors(s, d, 3, 4096).ok());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(src[i], dst[i]) << "tensor " << i;
}

TEST(CopyTensors, UnalignedBuffersLeaveTheirNeighboursAlone) {
  std::vector<char> src = RandomBytes(12345 + 8, 11);
  std::vector<char> dst(12345 + 8, 'g');
  ASSERT_TRUE(CopyTensors({TensorView::Bytes(src.data() + 1, 12345)},
                          {TensorView::Bytes(dst.data() + 3, 12345)}, 2, 1000)
                  .ok());
  EXPECT_EQ(0, std::memcmp(src.data() + 1, dst.data() + 3, 12345));
  for (size_t k : {size_t{0}, size_t{1}, size_t{2}, size_t{12348}, size_t{12349}})
    EXPECT_EQ('g', dst[k]) << "byte " << k;
}

TEST(CopyTensors, StridedSourceIntoContiguousDestination) {
  // A 37 x 53 int32 matrix read as its transpose; pieces of 100 bytes split elements.
  std::vector<char> base = RandomBytes(37 * 53 * 4, 5);
  const TensorView tr = View(base.data(), 4, {53, 37}, {4, 53 * 4});
  std::vector<char> out(base.size(), 0);
  ASSERT_TRUE(CopyTensors({tr}, {TensorView::Bytes(out.data(), out.size())}, 4, 100).ok());
  EXPECT_EQ(LogicalBytes(tr), out);
  EXPECT_NE(base, out);  // really transposed, not a plain memcpy
}

TEST(CopyTensors, ContiguousSourceIntoStridedDestination) {
  // Destination: 20 x 30 int16 with rows padded to 40 elements; padding stays untouched.
  std::vector<char> src = RandomBytes(20 * 30 * 2, 6);
  std::vector<char> buf(20 * 40 * 2, 'p');
  const TensorView d = View(buf.data(), 2, {20, 30}, {80, 2});
  ASSERT_TRUE(CopyTensors({TensorView::Bytes(src.data(), src.size())}, {d}, 2, 33).ok());
  EXPECT_EQ(src, LogicalBytes(d));
  for (int r = 0; r < 20; ++r)
    for (int c = 60; c < 80; ++c) ASSERT_EQ('p', buf[r * 80 + c]) << "padding " << r << "," << c;
}

TEST(CopyTensors, StridedToStridedThroughScratch) {
  // Source: every other column of a 16 x 24 int32 matrix, rows reversed (negative stride).
  std::vector<char> sbuf = RandomBytes(16 * 24 * 4, 7);
  const TensorView s = View(sbuf.data() + 15 * 24 * 4, 4, {16, 12}, {-24 * 4, 8});
  // Destination: a 12 x 16 buffer seen as its transpose (16 x 12), with a column of padding.
  std::vector<char> dbuf(12 * 17 * 4, 'q');
  const TensorView d = View(dbuf.data(), 4, {16, 12}, {4, 17 * 4});
  ASSERT_FALSE(s.IsContiguous());
  ASSERT_FALSE(d.IsContiguous());
  ASSERT_TRUE(CopyTensors({s}, {d}, 3, 7).ok());
  EXPECT_EQ(LogicalBytes(s), LogicalBytes(d));
  for (int r = 0; r < 12; ++r)
    for (int c = 64; c < 68; ++c) ASSERT_EQ('q', dbuf[r * 68 + c]) << "padding " << r << "," << c;
}

TEST(CopyTensors, ManyTensorsOfMixedLayouts) {
  std::vector<char> a = RandomBytes(999, 1), b = RandomBytes(64 * 64 * 8, 2);
  std::vector<char> a_out(999, 0), b_out(64 * 64 * 8, 0);
  const TensorView b_t = View(b.data(), 8, {64, 64}, {8, 64 * 8});
  ASSERT_TRUE(CopyTensors({TensorView::Bytes(a.data(), 999), b_t},
                          {TensorView::Bytes(a_out.data(), 999),
                           TensorView::Bytes(b_out.data(), b_out.size())},
                          /*threads=*/0, /*piece_size=*/0)  // both defaults
                  .ok());
  EXPECT_EQ(a, a_out);
  EXPECT_EQ(LogicalBytes(b_t), b_out);
}

TEST(CopyTensors, ZeroSizeAndEmptyLists) {
  EXPECT_TRUE(CopyTensors({}, {}, 2).ok());
  char x = 'x', y = 'y';
  EXPECT_TRUE(CopyTensors({TensorView::Bytes(&x, 0)}, {TensorView::Bytes(&y, 0)}, 2).ok());
  EXPECT_EQ('y', y);
  // An empty strided view (a zero dimension) copies nothing.
  const TensorView empty = View(&x, 4, {3, 0}, {40, 8});
  EXPECT_TRUE(CopyTensors({empty}, {View(&y, 4, {0, 5}, {4, 0})}, -1).ok());
  EXPECT_EQ('y', y);
}

TEST(CopyTensors, CountMismatchIsInvalidArgument) {
  char a[4] = {1, 2, 3, 4}, b[4] = {0, 0, 0, 0};
  const Status st = CopyTensors({TensorView::Bytes(a, 4), TensorView::Bytes(a, 4)},
                                {TensorView::Bytes(b, 4)}, 1);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
  EXPECT_EQ(0, b[0]);
}

TEST(CopyTensors, SizeMismatchFailsBeforeCopyingAnything) {
  std::vector<char> a(100, 'a'), b(100, 'b'), c(50, 'c'), out_a(100, 0), out_b(51, 0);
  const Status st = CopyTensors(
      {TensorView::Bytes(a.data(), 100), TensorView::Bytes(c.data(), 50)},
      {TensorView::Bytes(out_a.data(), 100), TensorView::Bytes(out_b.data(), 51)}, 2);
  ASSERT_EQ(Status::Code::kInvalidArgument, st.code());
  EXPECT_NE(std::string::npos, st.message().find("copy 1")) << st.message();
  EXPECT_EQ(std::vector<char>(100, 0), out_a);  // the valid first pair was not copied either
}

TEST(CopyTensors, InvalidViewsAreNamed) {
  char a[8] = {}, b[8] = {};
  Status st = CopyTensors({View(a, 1, {-1}, {1})}, {TensorView::Bytes(b, 8)}, 1);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
  EXPECT_NE(std::string::npos, st.message().find("source 0")) << st.message();
  st = CopyTensors({TensorView::Bytes(a, 8)}, {View(b, 1, {8}, {})}, 1);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
  EXPECT_NE(std::string::npos, st.message().find("destination 0")) << st.message();
  st = CopyTensors({TensorView::Bytes(a, 8)}, {View(b, 0, {8}, {1})}, 1);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
}

TEST(CopyRangeDirect, GathersIntoAContiguousDestination) {
  std::vector<char> base = RandomBytes(6 * 5 * 4, 9);
  const TensorView tr = View(base.data(), 4, {5, 6}, {4, 20});
  std::vector<char> out(120, 0);
  // Logical bytes [5, 71): starts and ends inside elements.
  ASSERT_TRUE(CopyRangeDirect(tr, TensorView::Bytes(out.data(), 120), 5, 66));
  const std::vector<char> want = LogicalBytes(tr);
  for (size_t k = 0; k < 120; ++k)
    EXPECT_EQ(k >= 5 && k < 71 ? want[k] : 0, out[k]) << "byte " << k;
}

TEST(CopyRangeDirect, ScattersFromAContiguousSource) {
  std::vector<char> src = RandomBytes(120, 10);
  std::vector<char> buf(120, 0);
  const TensorView tr = View(buf.data(), 4, {5, 6}, {4, 20});
  ASSERT_TRUE(CopyRangeDirect(TensorView::Bytes(src.data(), 120), tr, 13, 50));
  const std::vector<char> got = LogicalBytes(tr);
  for (size_t k = 0; k < 120; ++k)
    EXPECT_EQ(k >= 13 && k < 63 ? src[k] : 0, got[k]) << "logical byte " << k;
}

TEST(CopyRangeDirect, BothStridedCopiesNothing) {
  std::vector<char> a = RandomBytes(120, 12), b(120, 'z');
  const TensorView sa = View(a.data(), 4, {5, 6}, {4, 20});
  const TensorView sb = View(b.data(), 4, {5, 6}, {4, 20});
  EXPECT_FALSE(CopyRangeDirect(sa, sb, 0, 120));
  EXPECT_EQ(std::vector<char>(120, 'z'), b);
}

}  // namespace
}  // namespace pyckpt
