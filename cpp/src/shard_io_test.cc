// Round trips through WriteShardFiles/ReadShards, and the failures a reader
// must report: flipped bits, truncated and missing files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "pyckpt/crc32c.h"
#include "pyckpt/layout.h"
#include "pyckpt/shard_reader.h"
#include "pyckpt/shard_writer.h"
#include "pyckpt/staged_writer.h"
#include <algorithm>

namespace pyckpt {
namespace {

class ShardIo : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pyckpt_shard_io_XXXXXX";
    ASSERT_NE(nullptr, mkdtemp(tmpl));
    dir_ = tmpl;
    big_.resize(3 * 1000 * 1000 + 17);
    std::iota(big_.begin(), big_.end(), 0);
    small_.assign(100, 0);
    for (size_t i = 0; i < small_.size(); ++i) small_[i] = static_cast<float>(i) * 0.5f;
  }
  void TearDown() override {
    for (auto& f : files_) std::remove(f.c_str());
    rmdir(dir_.c_str());
  }

  // Writes big_ (1-d uint32), small_ (as a 10x10 transposed view) into 2 files.
  void Write() {
    TensorView big = TensorView::Bytes(reinterpret_cast<char*>(big_.data()), big_.size() * 4);
    TensorView tr;
    tr.data = reinterpret_cast<char*>(small_.data());
    tr.itemsize = 4;
    tr.shape = {10, 10};
    tr.strides = {4, 40};
    items_ = {{"big", big, 0, 0}, {"small_t", tr, 0, 0}};
    Layout l;
    ASSERT_TRUE(PlanLayout({big.NumBytes(), tr.NumBytes()}, 2, 64, &l).ok());
    for (size_t i = 0; i < items_.size(); ++i) {
      items_[i].file = l.file[i];
      items_[i].offset = l.offset[i];
    }
    files_ = {dir_ + "/a.bin", dir_ + "/b.bin"};
    ShardWriteOptions opt;
    opt.chunk_size = 1 << 16;
    opt.piece_size = 1 << 18;
    opt.threads = 3;
    ASSERT_TRUE(WriteShardFiles(files_, l.file_sizes, items_, opt, &sums_).ok());
  }

  Status ReadBack(std::vector<uint32_t>* big, std::vector<float>* small) {
    std::vector<ShardSource> srcs(2);
    srcs[0].name = files_[0];
    srcs[1].name = files_[1];
    big->assign(big_.size(), 0);
    small->assign(100, 0);
    std::vector<ShardReadItem> items(2);
    for (size_t i = 0; i < 2; ++i) {
      items[i].key = items_[i].key;
      items[i].source = items_[i].file;
      items[i].offset = items_[i].offset;
      items[i].nbytes = items_[i].src.NumBytes();
      items[i].crcs = &sums_.crcs[sums_.crc_begin[i]];
      items[i].has_dst = true;
    }
    items[0].dst = TensorView::Bytes(reinterpret_cast<char*>(big->data()), big->size() * 4);
    items[1].dst = TensorView::Bytes(reinterpret_cast<char*>(small->data()), 400);
    ShardReadOptions opt;
    opt.chunk_size = 1 << 16;
    opt.piece_size = 1 << 18;
    opt.threads = 3;
    return ReadShards(srcs, items, opt);
  }

  void FlipByte(const std::string& path, long pos) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(pos);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(pos);
    f.write(&c, 1);
  }

  std::string dir_;
  std::vector<uint32_t> big_;
  std::vector<float> small_;
  std::vector<ShardWriteItem> items_;
  std::vector<std::string> files_;
  ChecksumResult sums_;
};

TEST_F(ShardIo, RoundTrip) {
  Write();
  std::vector<uint32_t> big;
  std::vector<float> small;
  ASSERT_TRUE(ReadBack(&big, &small).ok());
  EXPECT_EQ(big_, big);
  for (int i = 0; i < 10; ++i)
    for (int j = 0; j < 10; ++j) EXPECT_EQ(small_[j * 10 + i], small[i * 10 + j]);
  EXPECT_EQ(sums_.crc_begin[1], (big_.size() * 4 + (1 << 16) - 1) >> 16);
}

TEST_F(ShardIo, ChecksumsMatchComputeChecksums) {
  Write();
  ChecksumResult again;
  ShardWriteOptions opt;
  opt.chunk_size = 1 << 16;
  ASSERT_TRUE(ComputeChecksums(items_, opt, &again).ok());
  EXPECT_EQ(sums_.crcs, again.crcs);
}

TEST_F(ShardIo, BitFlipIsCorruptionNamingKeyFileAndRange) {
  Write();
  const ShardWriteItem& big = items_[0];
  FlipByte(files_[big.file], static_cast<long>(big.offset + 200000));
  std::vector<uint32_t> b;
  std::vector<float> s;
  Status st = ReadBack(&b, &s);
  ASSERT_EQ(Status::Code::kCorruption, st.code());
  EXPECT_NE(std::string::npos, st.message().find("'big'"));
  EXPECT_NE(std::string::npos, st.message().find(files_[big.file]));
  EXPECT_NE(std::string::npos, st.message().find("[196608, 262144)")) << st.message();
}

TEST_F(ShardIo, TruncatedFileFailsBeforeReading) {
  Write();
  const ShardWriteItem& big = items_[0];
  ASSERT_EQ(0, truncate(files_[big.file].c_str(), static_cast<off_t>(big.offset + 1000)));
  std::vector<uint32_t> b;
  std::vector<float> s;
  Status st = ReadBack(&b, &s);
  ASSERT_EQ(Status::Code::kCorruption, st.code()) << st.ToString();
  EXPECT_NE(std::string::npos, st.message().find("truncated"));
  EXPECT_EQ(std::vector<uint32_t>(big_.size(), 0), b);  // nothing was read
}

TEST_F(ShardIo, MissingFileIsNotFound) {
  Write();
  std::remove(files_[0].c_str());
  std::vector<uint32_t> b;
  std::vector<float> s;
  EXPECT_EQ(Status::Code::kNotFound, ReadBack(&b, &s).code());
}

TEST_F(ShardIo, WriterRefusesToOverwrite) {
  Write();
  ShardWriteOptions opt;
  ChecksumResult r;
  Status st = WriteShardFiles({files_[0]}, {16}, {}, opt, &r);
  EXPECT_EQ(Status::Code::kIOError, st.code());
}

TEST(ShardIoMemory, VerifiesInPlace) {
  std::vector<char> data(5000, 'x');
  ChecksumResult sums;
  ShardWriteItem it{"m", TensorView::Bytes(data.data(), data.size()), 0, 0};
  ShardWriteOptions wopt;
  wopt.chunk_size = 1024;
  ASSERT_TRUE(ComputeChecksums({it}, wopt, &sums).ok());
  ShardSource src;
  src.name = "mem";
  src.in_memory = true;
  src.data = data.data();
  src.base = 0;
  src.size = data.size();
  ShardReadItem r;
  r.key = "m";
  r.nbytes = data.size();
  r.crcs = sums.crcs.data();
  ShardReadOptions ropt;
  ropt.chunk_size = 1024;
  EXPECT_TRUE(ReadShards({src}, {r}, ropt).ok());
  data[4500] ^= 1;
  Status st = ReadShards({src}, {r}, ropt);
  EXPECT_EQ(Status::Code::kCorruption, st.code());
  EXPECT_NE(std::string::npos, st.message().find("[4096, 5000)")) << st.message();
  r.nbytes = 6000;  // beyond the buffer
  r.crcs = nullptr;
  ropt.verify = false;
  EXPECT_EQ(Status::Code::kCorruption, ReadShards({src}, {r}, ropt).code());
}

// One CRC per item (TensorFlow bundles): pieces read in parallel, CRCs combined.
TEST(ShardIoMemory, WholeItemCrcAcrossPieces) {
  std::vector<char> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 9));
  const uint32_t crcs[3] = {crc32c::Mask(crc32c::Value(data.data(), 40000)),
                            crc32c::Mask(crc32c::Value(data.data() + 40000, 100)),
                            crc32c::Mask(crc32c::Value(data.data() + 40100, 59900))};
  ShardSource src;
  src.name = "mem";
  src.in_memory = true;
  src.data = data.data();
  src.size = data.size();
  std::vector<char> out(data.size(), 0);
  std::vector<ShardReadItem> items(3);
  const uint64_t offs[3] = {0, 40000, 40100}, lens[3] = {40000, 100, 59900};
  for (int k = 0; k < 3; ++k) {
    items[k].key = "t" + std::to_string(k);
    items[k].offset = offs[k];
    items[k].nbytes = lens[k];
    items[k].crcs = &crcs[k];
    items[k].has_dst = true;
    items[k].dst = TensorView::Bytes(out.data() + offs[k], lens[k]);
  }
  ShardReadOptions ropt;
  ropt.chunk_size = 1024;  // the read step
  ropt.piece_size = 4096;  // many pieces per large item
  ropt.threads = 4;
  ropt.whole_item_crc = true;
  ASSERT_TRUE(ReadShards({src}, items, ropt).ok());
  EXPECT_EQ(data, out);
  data[70001] ^= 4;  // inside t2, in a middle piece
  Status st = ReadShards({src}, items, ropt);
  EXPECT_EQ(Status::Code::kCorruption, st.code());
  EXPECT_NE(std::string::npos, st.message().find("'t2'")) << st.message();
  EXPECT_NE(std::string::npos, st.message().find("[40100, 100000)")) << st.message();
}

}  // namespace
}  // namespace pyckpt

namespace pyckpt {
namespace {

TEST(StagedWriteTest, WritesTheStagedCopyNotLaterChanges) {
  char tmpl[] = "/tmp/pyckpt_staged_XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/a.bin";
  std::vector<uint32_t> live(3 << 20), staging(live.size());
  std::iota(live.begin(), live.end(), 7u);
  ShardWriteItem item{"t", TensorView::Bytes(reinterpret_cast<char*>(staging.data()), staging.size() * 4), 0, 0};
  std::vector<TensorView> lives = {TensorView::Bytes(reinterpret_cast<char*>(live.data()), live.size() * 4)};
  ShardWriteOptions opt;
  opt.threads = 2;
  opt.sync = false;
  StagedWrite w;
  ASSERT_TRUE(w.Start({path}, {live.size() * 4}, {item}, lives, opt).ok());
  ASSERT_TRUE(w.Stage(2).ok());
  std::vector<uint32_t> expected = live;
  std::fill(live.begin(), live.end(), 0u);  // the caller mutates right after staging
  ChecksumResult sums;
  ASSERT_TRUE(w.Wait(&sums).ok());
  std::vector<uint32_t> back(expected.size());
  ShardSource src;
  src.name = path;
  ShardReadItem r;
  r.key = "t";
  r.nbytes = back.size() * 4;
  r.crcs = sums.crcs.data();
  r.has_dst = true;
  r.dst = TensorView::Bytes(reinterpret_cast<char*>(back.data()), r.nbytes);
  ASSERT_TRUE(ReadShards({src}, {r}, ShardReadOptions()).ok());
  EXPECT_EQ(expected, back);
  std::remove(path.c_str());
  rmdir(tmpl);
}

TEST(StagedWriteTest, WaitWithoutStageIsAnError) {
  char tmpl[] = "/tmp/pyckpt_staged_XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/b.bin";
  std::vector<char> a(1000, 1), b(1000);
  ShardWriteItem item{"t", TensorView::Bytes(b.data(), b.size()), 0, 0};
  StagedWrite w;
  ASSERT_TRUE(w.Start({path}, {1000}, {item}, {TensorView::Bytes(a.data(), a.size())},
                      ShardWriteOptions()).ok());
  ChecksumResult sums;
  EXPECT_EQ(Status::Code::kIOError, w.Wait(&sums).code());
  std::remove(path.c_str());
  rmdir(tmpl);
}

}  // namespace
}  // namespace pyckpt
