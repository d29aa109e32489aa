// StagedWrite (staged_writer.h): the files hold exactly the staged bytes (not
// later changes to the live tensors), with the chunk CRCs to match; external
// staging through Order/MarkReady; and the errors of every misuse it documents.
#include "pyckpt/staged_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "pyckpt/crc32c.h"
#include "pyckpt/layout.h"
#include "test_util.h"

namespace pyckpt {
namespace {

using testutil::LogicalBytes;
using testutil::RandomBytes;
using testutil::TempDir;
using testutil::View;

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// One tensor of a test write: its live bytes and its staging buffer.
struct Tensor {
  std::string key;
  std::vector<char> live_buf, staging_buf;
  TensorView live, staging;
};

class StagedWriteFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    opt_.chunk_size = 4096;
    opt_.piece_size = 16384;
    opt_.threads = 2;
    opt_.sync = false;
  }

  // A contiguous tensor of n random bytes with a zeroed staging buffer.
  void AddBytes(const std::string& key, size_t n, unsigned seed) {
    tensors_.push_back(Tensor());
    Tensor& t = tensors_.back();
    t.key = key;
    t.live_buf = RandomBytes(n, seed);
    t.staging_buf.assign(n, 0);
  }

  // Views into the buffers (taken once tensors_ no longer grows), the layout
  // into two files, and the write items.
  void Plan(size_t num_files = 2) {
    std::vector<uint64_t> sizes;
    for (Tensor& t : tensors_) {
      if (t.live.data == nullptr) t.live = TensorView::Bytes(t.live_buf.data(), t.live_buf.size());
      if (t.staging.data == nullptr)
        t.staging = TensorView::Bytes(t.staging_buf.data(), t.staging_buf.size());
      sizes.push_back(t.staging.NumBytes());
    }
    ASSERT_TRUE(PlanLayout(sizes, static_cast<uint32_t>(num_files), 64, &layout_).ok());
    files_.clear();
    for (size_t f = 0; f < num_files; ++f) files_.push_back(dir_ + "/f" + std::to_string(f));
    items_.clear();
    lives_.clear();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      items_.push_back({tensors_[i].key, tensors_[i].staging, layout_.file[i], layout_.offset[i]});
      lives_.push_back(tensors_[i].live);
    }
  }

  // Expected file images: each tensor's `bytes[i]` at its offset, zero padding.
  void ExpectFiles(const std::vector<std::vector<char>>& bytes) {
    for (size_t f = 0; f < files_.size(); ++f) {
      std::vector<char> want(layout_.file_sizes[f], 0);
      for (size_t i = 0; i < bytes.size(); ++i)
        if (layout_.file[i] == f && !bytes[i].empty())
          std::copy(bytes[i].begin(), bytes[i].end(), want.begin() + layout_.offset[i]);
      const std::vector<char> got = ReadFile(files_[f]);
      ASSERT_EQ(want.size(), got.size()) << files_[f];
      EXPECT_TRUE(want == got) << files_[f] << " differs";
    }
  }

  // Every tensor's chunk CRCs are the masked CRC-32C of its chunks of `bytes[i]`.
  void ExpectCrcs(const std::vector<std::vector<char>>& bytes, const ChecksumResult& sums) {
    const uint64_t chunk = opt_.chunk_size;
    ASSERT_EQ(bytes.size() + 1, sums.crc_begin.size());
    ASSERT_EQ(sums.crc_begin.back(), sums.crcs.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      const uint64_t n = bytes[i].size();
      ASSERT_EQ((n + chunk - 1) / chunk, sums.crc_begin[i + 1] - sums.crc_begin[i]) << i;
      for (uint64_t c = 0; c * chunk < n; ++c) {
        const uint64_t len = std::min(chunk, n - c * chunk);
        EXPECT_EQ(crc32c::Mask(crc32c::Value(bytes[i].data() + c * chunk, len)),
                  sums.crcs[sums.crc_begin[i] + c])
            << "tensor " << i << " chunk " << c;
      }
    }
  }

  TempDir tmp_;  // removed after each test
  const std::string dir_ = tmp_.path();
  ShardWriteOptions opt_;
  std::vector<Tensor> tensors_;
  Layout layout_;
  std::vector<std::string> files_;
  std::vector<ShardWriteItem> items_;
  std::vector<TensorView> lives_;
};

TEST_F(StagedWriteFiles, WritesExactlyTheStagedBytes) {
  AddBytes("big", (5u << 20) + 3, 1);  // several copy pieces and many write pieces
  AddBytes("small", 100, 2);           // small ones share runs
  AddBytes("empty", 0, 3);
  AddBytes("tiny", 7, 4);
  // A strided live tensor (a 33 x 45 int32 transpose) into a contiguous staging buffer.
  AddBytes("transposed_live", 33 * 45 * 4, 5);
  Tensor& tl = tensors_.back();
  tl.live = View(tl.live_buf.data(), 4, {45, 33}, {4, 45 * 4});
  // A contiguous live tensor into a strided staging buffer (20 x 30 int16, rows padded).
  AddBytes("strided_staging", 20 * 30 * 2, 6);
  Tensor& ss = tensors_.back();
  ss.staging_buf.assign(20 * 40 * 2, 0);
  ss.staging = View(ss.staging_buf.data(), 2, {20, 30}, {80, 2});
  Plan();

  std::vector<std::vector<char>> want;
  for (const Tensor& t : tensors_) want.push_back(LogicalBytes(t.live));
  StagedWrite w;
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, lives_, opt_).ok());
  ASSERT_TRUE(w.Stage(3).ok());
  for (Tensor& t : tensors_) std::fill(t.live_buf.begin(), t.live_buf.end(), '\xee');
  ChecksumResult sums;
  const Status st = w.Wait(&sums);
  ASSERT_TRUE(st.ok()) << st.ToString();

  for (size_t i = 0; i < tensors_.size(); ++i)
    EXPECT_TRUE(want[i] == LogicalBytes(tensors_[i].staging)) << tensors_[i].key;
  ExpectFiles(want);
  ExpectCrcs(want, sums);
}

TEST_F(StagedWriteFiles, ExternalStagingInOrderWithMarkReady) {
  AddBytes("a", 50000, 1);
  AddBytes("b", 10, 2);
  AddBytes("c", 0, 3);
  AddBytes("d", 4096, 4);
  AddBytes("e", 1, 5);
  Plan();
  std::atomic<uint64_t> progress{0};
  opt_.progress = &progress;
  StagedWrite w;
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, {}, opt_).ok());
  EXPECT_EQ(Status::Code::kInvalidArgument, w.Stage(2).code());  // staged externally
  std::vector<size_t> order = w.Order();
  std::vector<size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ((std::vector<size_t>{0, 1, 2, 3, 4}), sorted);  // each item once
  std::vector<std::vector<char>> want;
  for (const Tensor& t : tensors_) want.push_back(t.live_buf);
  for (size_t i : order) {
    std::copy(want[i].begin(), want[i].end(), tensors_[i].staging_buf.begin());
    ASSERT_TRUE(w.MarkReady(i).ok());
    ASSERT_TRUE(w.MarkReady(i).ok());  // marking twice is harmless
  }
  EXPECT_EQ(Status::Code::kInvalidArgument, w.MarkReady(5).code());
  ChecksumResult sums;
  const Status st = w.Wait(&sums);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectFiles(want);
  ExpectCrcs(want, sums);
  // Every written byte is counted: the tensors' bytes plus padding inside runs.
  uint64_t data_bytes = 0;
  for (const auto& b : want) data_bytes += b.size();
  EXPECT_GE(progress.load(), data_bytes);
  EXPECT_LE(progress.load(), layout_.file_sizes[0] + layout_.file_sizes[1]);
}

TEST_F(StagedWriteFiles, ExternalStagingNotEveryItemMarkedIsIOError) {
  AddBytes("a", 3000, 1);
  AddBytes("b", 3000, 2);
  Plan(1);
  StagedWrite w;
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, {}, opt_).ok());
  ASSERT_TRUE(w.MarkReady(0).ok());
  ChecksumResult sums;
  EXPECT_EQ(Status::Code::kIOError, w.Wait(&sums).code());
}

TEST_F(StagedWriteFiles, WaitWithoutStageIsIOError) {
  AddBytes("a", 3000, 1);
  Plan(1);
  StagedWrite w;
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, lives_, opt_).ok());
  ChecksumResult sums;
  EXPECT_EQ(Status::Code::kIOError, w.Wait(&sums).code());
}

TEST_F(StagedWriteFiles, CallsOutOfOrderAreInvalidArgument) {
  StagedWrite w;
  ChecksumResult sums;
  EXPECT_EQ(Status::Code::kInvalidArgument, w.Stage(1).code());
  EXPECT_EQ(Status::Code::kInvalidArgument, w.Wait(&sums).code());
  EXPECT_EQ(Status::Code::kInvalidArgument, w.MarkReady(0).code());
  EXPECT_TRUE(w.Order().empty());

  AddBytes("a", 100, 1);
  Plan(1);
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, lives_, opt_).ok());
  EXPECT_EQ(Status::Code::kInvalidArgument, w.MarkReady(0).code());  // not external
  ASSERT_TRUE(w.Stage(1).ok());
  ASSERT_TRUE(w.Wait(&sums).ok());
  ExpectFiles({tensors_[0].live_buf});
}

TEST_F(StagedWriteFiles, BadArgumentsFailStartAndCreateNoFile) {
  AddBytes("a", 1000, 1);
  AddBytes("b", 200, 2);
  Plan(1);
  auto start = [&](const std::vector<std::string>& files, const std::vector<uint64_t>& sizes,
                   const std::vector<ShardWriteItem>& items, const std::vector<TensorView>& live,
                   const ShardWriteOptions& opt) {
    StagedWrite w;
    return w.Start(files, sizes, items, live, opt);
  };
  // One live tensor per item.
  Status st = start(files_, layout_.file_sizes, items_, {lives_[0]}, opt_);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
  // A live tensor of another byte size than its staging buffer.
  std::vector<TensorView> lives = lives_;
  lives[1] = TensorView::Bytes(tensors_[1].live_buf.data(), 199);
  st = start(files_, layout_.file_sizes, items_, lives, opt_);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
  EXPECT_NE(std::string::npos, st.message().find("'b'")) << st.message();
  EXPECT_NE(std::string::npos, st.message().find("size differs")) << st.message();
  // A tensor placed past the end of its file.
  st = start(files_, {layout_.file_sizes[0] - 1}, items_, lives_, opt_);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
  EXPECT_NE(std::string::npos, st.message().find("outside its file")) << st.message();
  // One size per file; a tensor naming a missing file.
  EXPECT_EQ(Status::Code::kInvalidArgument, start(files_, {}, items_, lives_, opt_).code());
  std::vector<ShardWriteItem> items = items_;
  items[0].file = 1;
  EXPECT_EQ(Status::Code::kInvalidArgument,
            start(files_, layout_.file_sizes, items, lives_, opt_).code());
  // chunk_size 0.
  ShardWriteOptions bad = opt_;
  bad.chunk_size = 0;
  EXPECT_EQ(Status::Code::kInvalidArgument,
            start(files_, layout_.file_sizes, items_, lives_, bad).code());
  // An invalid live view.
  lives = lives_;
  lives[0].strides.clear();
  EXPECT_EQ(Status::Code::kInvalidArgument,
            start(files_, layout_.file_sizes, items_, lives, opt_).code());
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(StagedWriteFiles, StridedOnBothSidesIsRejected) {
  AddBytes("t", 6 * 5 * 4, 1);
  Tensor& t = tensors_.back();
  t.live = View(t.live_buf.data(), 4, {5, 6}, {4, 20});  // a transpose on both sides
  t.staging = View(t.staging_buf.data(), 4, {5, 6}, {4, 20});
  Plan(1);
  StagedWrite w;
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, lives_, opt_).ok());
  const Status st = w.Stage(2);
  EXPECT_EQ(Status::Code::kInvalidArgument, st.code());
  EXPECT_NE(std::string::npos, st.message().find("contiguous")) << st.message();
  EXPECT_EQ(std::vector<char>(t.staging_buf.size(), 0), t.staging_buf);
  ChecksumResult sums;
  EXPECT_EQ(Status::Code::kIOError, w.Wait(&sums).code());
}

TEST_F(StagedWriteFiles, ExistingFileIsIOErrorAndKept) {
  AddBytes("a", 5000, 1);
  Plan(1);
  { std::ofstream(files_[0], std::ios::binary) << "keep"; }
  StagedWrite w;
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, lives_, opt_).ok());
  EXPECT_TRUE(w.Stage(2).ok());  // the copy itself succeeds
  ChecksumResult sums;
  EXPECT_EQ(Status::Code::kIOError, w.Wait(&sums).code());
  const std::vector<char> kept = ReadFile(files_[0]);
  EXPECT_EQ(std::string("keep"), std::string(kept.begin(), kept.end()));
}

TEST_F(StagedWriteFiles, OnlyEmptyTensors) {
  AddBytes("x", 0, 1);
  AddBytes("y", 0, 2);
  Plan(1);
  StagedWrite w;
  ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, lives_, opt_).ok());
  ASSERT_TRUE(w.Stage(2).ok());
  ChecksumResult sums;
  ASSERT_TRUE(w.Wait(&sums).ok());
  EXPECT_EQ((std::vector<uint64_t>{0, 0, 0}), sums.crc_begin);
  EXPECT_TRUE(sums.crcs.empty());
  EXPECT_TRUE(std::filesystem::exists(files_[0]));
  EXPECT_EQ(0u, std::filesystem::file_size(files_[0]));
}

TEST_F(StagedWriteFiles, DestroyedWithoutWaitAbandonsTheWriter) {
  AddBytes("a", 100000, 1);
  Plan(1);
  {
    StagedWrite w;
    ASSERT_TRUE(w.Start(files_, layout_.file_sizes, items_, lives_, opt_).ok());
  }  // must return: the destructor abandons the gate and joins the writer
  {
    StagedWrite w;
    ASSERT_TRUE(w.Start({dir_ + "/g"}, layout_.file_sizes, items_, lives_, opt_).ok());
    ASSERT_TRUE(w.Stage(2).ok());
  }  // staged but never waited for: the writer finishes, then joins
  EXPECT_EQ(tensors_[0].live_buf, ReadFile(dir_ + "/g"));
}

}  // namespace
}  // namespace pyckpt
