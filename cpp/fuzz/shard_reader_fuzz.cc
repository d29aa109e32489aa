// libFuzzer target: arbitrary bytes drive ReadShards over an in-memory source.
// The input's first bytes choose the chunk size, item count, and each item's
// offset/size/destination layout; the rest is the "file". Whatever the values,
// the reader must return a Status (never crash or read out of bounds).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pyckpt/crc32c.h"
#include "pyckpt/shard_reader.h"

namespace {

struct Input {
  const uint8_t* p;
  size_t n;
  uint64_t Take(size_t bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < bytes && n; ++i, ++p, --n) v |= static_cast<uint64_t>(*p) << (8 * i);
    return v;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  pyckpt::ShardReadOptions opt;
  opt.chunk_size = 1 + in.Take(2) % 4096;
  opt.piece_size = opt.chunk_size * (1 + in.Take(1) % 8);
  opt.max_gap = in.Take(2);
  opt.threads = 1 + static_cast<int>(in.Take(1) % 3);
  const size_t count = in.Take(1) % 8;
  struct Raw {
    uint64_t offset, nbytes, base;
    int64_t rows;
    bool transposed;
  };
  std::vector<Raw> raws(count);
  for (auto& r : raws) {
    r.offset = in.Take(3);
    r.nbytes = in.Take(3) % 65536;
    r.base = in.Take(1);
    r.rows = 1 + static_cast<int64_t>(in.Take(1) % 16);
    r.transposed = in.Take(1) & 1;
  }
  pyckpt::ShardSource src;
  src.name = "fuzz";
  src.in_memory = true;
  src.data = reinterpret_cast<const char*>(in.p);
  src.size = in.n;
  src.base = count ? raws[0].base : 0;

  std::vector<std::vector<char>> dst(count);
  std::vector<std::vector<uint32_t>> crcs(count);
  std::vector<pyckpt::ShardReadItem> items(count);
  for (size_t i = 0; i < count; ++i) {
    const Raw& r = raws[i];
    auto& it = items[i];
    it.key = "t" + std::to_string(i);
    it.offset = r.offset;
    it.nbytes = r.nbytes;
    const uint64_t chunks = (r.nbytes + opt.chunk_size - 1) / opt.chunk_size;
    crcs[i].assign(chunks, 0);
    // Right checksums where the range is inside the input, so verification passes sometimes.
    for (uint64_t c = 0; c < chunks; ++c) {
      uint64_t b = r.offset + c * opt.chunk_size;
      uint64_t e = std::min(r.offset + r.nbytes, b + opt.chunk_size);
      if (b >= src.base && e <= src.base + src.size)
        crcs[i][c] = pyckpt::crc32c::Mask(pyckpt::crc32c::Value(src.data + (b - src.base), e - b));
    }
    it.crcs = crcs[i].data();
    dst[i].assign(r.nbytes, 0);
    it.has_dst = true;
    if (r.transposed && r.nbytes % r.rows == 0) {
      const int64_t cols = static_cast<int64_t>(r.nbytes) / r.rows;
      it.dst.data = dst[i].data();
      it.dst.itemsize = 1;
      it.dst.shape = {r.rows, cols};
      it.dst.strides = {1, r.rows};
    } else {
      it.dst = pyckpt::TensorView::Bytes(dst[i].data(), r.nbytes);
    }
  }
  pyckpt::Status st = pyckpt::ReadShards({src}, items, opt);
  (void)st;
  return 0;
}
