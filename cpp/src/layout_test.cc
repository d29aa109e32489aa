#include "pyckpt/layout.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace pyckpt {
namespace {

TEST(Layout, BalancedAlignedAndNonOverlapping) {
  std::vector<uint64_t> sizes = {1000, 5, 700, 0, 300, 64, 1};
  Layout l;
  ASSERT_TRUE(PlanLayout(sizes, 2, 64, &l).ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    EXPECT_EQ(0u, l.offset[i] % 64);
    EXPECT_LT(l.file[i], 2u);
    EXPECT_LE(l.offset[i] + sizes[i], l.file_sizes[l.file[i]]);
    for (size_t j = 0; j < i; ++j) {
      if (sizes[j] == 0 || l.file[i] != l.file[j]) continue;
      bool disjoint = l.offset[i] + sizes[i] <= l.offset[j] || l.offset[j] + sizes[j] <= l.offset[i];
      EXPECT_TRUE(disjoint) << i << " overlaps " << j;
    }
  }
  // The two largest go to different files.
  EXPECT_NE(l.file[0], l.file[2]);
}

TEST(Layout, InputOrderInsideAFile) {
  std::vector<uint64_t> sizes = {10, 10, 10};
  Layout l;
  ASSERT_TRUE(PlanLayout(sizes, 1, 16, &l).ok());
  EXPECT_EQ((std::vector<uint64_t>{0, 16, 32}), l.offset);
  EXPECT_EQ(42u, l.file_sizes[0]);
}

TEST(Layout, RejectsBadArguments) {
  Layout l;
  EXPECT_FALSE(PlanLayout({1}, 0, 64, &l).ok());
  EXPECT_FALSE(PlanLayout({1}, 1, 48, &l).ok());
}

}  // namespace
}  // namespace pyckpt
