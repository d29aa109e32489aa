#include "pyckpt/tensor_view.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace pyckpt {
namespace {

// A strided view over `base`: element (i, j) of a rows x cols int32 matrix
// stored with the given element strides.
TensorView Int32View(int32_t* base, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  TensorView v;
  v.data = reinterpret_cast<char*>(base);
  v.itemsize = 4;
  v.shape = {rows, cols};
  v.strides = {rs * 4, cs * 4};
  return v;
}

std::vector<int32_t> Logical(const int32_t* base, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out.push_back(base[i * rs + j * cs]);
  return out;
}

TEST(TensorView, Contiguity) {
  std::vector<int32_t> m(12);
  EXPECT_TRUE(Int32View(m.data(), 3, 4, 4, 1).IsContiguous());
  EXPECT_FALSE(Int32View(m.data(), 4, 3, 1, 4).IsContiguous());  // transpose
  EXPECT_TRUE(Int32View(m.data(), 1, 4, 100, 1).IsContiguous());  // size-1 dim: stride ignored
  EXPECT_EQ(48u, Int32View(m.data(), 3, 4, 4, 1).NumBytes());
}

TEST(TensorView, GatherAnyRangeOfATranspose) {
  std::vector<int32_t> m(6 * 5);
  std::iota(m.begin(), m.end(), 0);
  TensorView t = Int32View(m.data(), 5, 6, 1, 5);  // transpose of a 6x5 matrix
  std::vector<int32_t> want = Logical(m.data(), 5, 6, 1, 5);
  const char* want_bytes = reinterpret_cast<const char*>(want.data());
  for (uint64_t b = 0; b <= 120; b += 7) {
    for (uint64_t len : {0ull, 1ull, 3ull, 4ull, 13ull, 120ull - b}) {
      if (b + len > 120) continue;
      std::vector<char> got(len + 1, 0);
      GatherRange(t, b, len, got.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want_bytes + b, len)) << b << "+" << len;
    }
  }
}

TEST(TensorView, ScatterInvertsGather) {
  std::vector<int32_t> m(8 * 8, -1);
  TensorView v = Int32View(m.data(), 4, 3, 16, 2);  // every other column of every other row
  std::vector<int32_t> src(12);
  std::iota(src.begin(), src.end(), 100);
  ScatterRange(v, 0, 20, reinterpret_cast<char*>(src.data()));
  ScatterRange(v, 20, 28, reinterpret_cast<char*>(src.data()) + 20);
  EXPECT_EQ(src, Logical(m.data(), 4, 3, 16, 2));
  EXPECT_EQ(-1, m[1]);  // untouched gaps
}

TEST(TensorView, NegativeStrides) {
  std::vector<int32_t> m = {0, 1, 2, 3, 4, 5};
  TensorView v;
  v.data = reinterpret_cast<char*>(m.data() + 5);
  v.itemsize = 4;
  v.shape = {6};
  v.strides = {-4};
  std::vector<int32_t> got(6);
  GatherRange(v, 0, 24, reinterpret_cast<char*>(got.data()));
  EXPECT_EQ((std::vector<int32_t>{5, 4, 3, 2, 1, 0}), got);
}

TEST(TensorView, ValidateRejectsOverflowAndNegative) {
  TensorView v;
  v.itemsize = 8;
  v.shape = {1ll << 40, 1ll << 40};
  v.strides = {8, 8};
  EXPECT_FALSE(ValidateView(v, "x").ok());
  v.shape = {-1, 2};
  EXPECT_FALSE(ValidateView(v, "x").ok());
  v.shape = {3};
  EXPECT_FALSE(ValidateView(v, "x").ok());  // strides length differs
}

}  // namespace
}  // namespace pyckpt
