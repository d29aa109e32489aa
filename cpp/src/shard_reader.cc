#include "pyckpt/shard_reader.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>

#include "file_io.h"
#include "pieces.h"
#include "pyckpt/crc32c.h"
#include "pyckpt/parallel.h"
#include "scratch.h"

namespace pyckpt {
namespace {

// One opened source. Read() returns a pointer to the requested bytes: into
// `buf` for files, in place for memory.
class Reader {
 public:
  Status Open(const ShardSource& s) {
    src_ = &s;
    if (s.in_memory) return Status::OK();
    PYCKPT_RETURN_IF_ERROR(file_.OpenRead(s.name));
    file_.AdviseSequential();
    return Status::OK();
  }

  // Checks that [begin, end) lies inside the source before any read.
  Status CheckRange(uint64_t begin, uint64_t end, const std::string& key) {
    uint64_t lo = 0, hi = 0;
    if (src_->in_memory) {
      lo = src_->base;
      hi = src_->base + src_->size;
    } else {
      if (!size_known_) {
        PYCKPT_RETURN_IF_ERROR(file_.Size(&size_));
        size_known_ = true;
      }
      hi = size_;
    }
    if (begin < lo || end > hi)
      return Status::Corruption("tensor '" + key + "': bytes " + RangeString(begin, end) +
                                " lie outside '" + src_->name + "', which holds " +
                                RangeString(lo, hi) + " (truncated file?)");
    return Status::OK();
  }

  Status Read(uint64_t begin, uint64_t n, char* buf, const char** out) const {
    if (src_->in_memory) {
      *out = src_->data + (begin - src_->base);
      return Status::OK();
    }
    PYCKPT_RETURN_IF_ERROR(file_.PRead(buf, n, begin));
    *out = buf;
    return Status::OK();
  }

  const std::string& name() const { return src_->name; }

 private:
  const ShardSource* src_ = nullptr;
  File file_;
  bool size_known_ = false;
  uint64_t size_ = 0;
};

Status Mismatch(const ShardReadItem& it, const std::string& source, uint64_t chunk_index,
                uint64_t chunk_size, uint32_t expected, uint32_t actual) {
  uint64_t b = it.offset + chunk_index * chunk_size;
  uint64_t e = std::min(it.offset + it.nbytes, b + chunk_size);
  char crcs[64];
  std::snprintf(crcs, sizeof(crcs), "stored 0x%08" PRIx32 ", computed 0x%08" PRIx32, expected,
                actual);
  return Status::Corruption("checksum mismatch in tensor '" + it.key + "', file '" + source +
                            "', bytes " + RangeString(b, e) + " (" + crcs + ")");
}

// Verifies the chunks of data[0, n), logical bytes [logical_begin, +n) of it.
Status VerifyChunks(const ShardReadItem& it, const std::string& source, const char* data,
                    uint64_t logical_begin, uint64_t n, uint64_t chunk) {
  uint64_t c = logical_begin / chunk;
  for (uint64_t off = 0; off < n; off += chunk, ++c) {
    uint64_t len = std::min(chunk, n - off);
    uint32_t actual = crc32c::Mask(crc32c::Value(data + off, len));
    if (actual != it.crcs[c]) return Mismatch(it, source, c, chunk, it.crcs[c], actual);
  }
  return Status::OK();
}

}  // namespace

Status ReadShards(const std::vector<ShardSource>& sources, const std::vector<ShardReadItem>& items,
                  const ShardReadOptions& options) {
  if (options.chunk_size == 0) return Status::InvalidArgument("chunk_size must be positive");
  const uint64_t chunk = options.chunk_size;
  std::vector<Span> spans(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const ShardReadItem& it = items[i];
    if (it.nbytes > 0 && it.source >= sources.size())
      return Status::InvalidArgument("tensor '" + it.key + "' names a missing source");
    if (it.offset > UINT64_MAX - it.nbytes)
      return Status::Corruption("tensor '" + it.key + "': offset overflows");
    if (it.has_dst) {
      PYCKPT_RETURN_IF_ERROR(ValidateView(it.dst, "destination of '" + it.key + "'"));
      if (it.dst.NumBytes() != it.nbytes)
        return Status::InvalidArgument("destination of '" + it.key + "' has the wrong size");
    }
    if (it.nbytes > 0 && it.crcs == nullptr && options.verify)
      return Status::InvalidArgument("tensor '" + it.key + "' has no checksums");
    spans[i] = Span{it.source, it.offset, it.nbytes};
  }

  // Open only the sources that are used, and check every range up front so
  // that a truncated file fails before any destination is touched.
  std::vector<std::unique_ptr<Reader>> readers(sources.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const ShardReadItem& it = items[i];
    if (it.nbytes == 0) continue;
    auto& r = readers[it.source];
    if (!r) {
      r = std::make_unique<Reader>();
      PYCKPT_RETURN_IF_ERROR(r->Open(sources[it.source]));
    }
    PYCKPT_RETURN_IF_ERROR(r->CheckRange(it.offset, it.offset + it.nbytes, it.key));
  }

  uint64_t piece = std::max(options.piece_size, chunk) / chunk * chunk;
  const uint64_t step = chunk >= (1u << 20) ? chunk : (1u << 20) / chunk * chunk;
  PiecePlan plan = PlanPieces(spans, chunk, piece, options.max_gap);
  int threads = options.threads > 0 ? options.threads : DefaultThreads();
  ScratchSet scratch(threads);

  return ParallelFor(plan.pieces.size(), threads, [&](size_t i, int w) -> Status {
    const Piece& p = plan.pieces[i];
    const Reader& rd = *readers[p.file];
    const uint64_t n = p.end - p.begin;
    if (!p.run) {
      // Read in steps of about 1 MiB and verify each right away, while it is in cache.
      const ShardReadItem& it = items[p.item];
      const bool direct = it.has_dst && it.dst.IsContiguous();
      const uint64_t end = p.item_begin + n;
      for (uint64_t b = p.item_begin; b < end; b += step) {
        const uint64_t len = std::min(step, end - b);
        char* buf = direct ? it.dst.data + b : scratch[w].Get(len);
        if (!buf) return Status::IOError("out of memory for a scratch buffer");
        const char* data = nullptr;
        PYCKPT_RETURN_IF_ERROR(rd.Read(it.offset + b, len, buf, &data));
        if (options.verify) PYCKPT_RETURN_IF_ERROR(VerifyChunks(it, rd.name(), data, b, len, chunk));
        if (it.has_dst && data != it.dst.data + b) ScatterRange(it.dst, b, len, data);
        if (options.progress) options.progress->fetch_add(len, std::memory_order_relaxed);
      }
      return Status::OK();
    }
    char* buf = scratch[w].Get(n);
    if (!buf) return Status::IOError("out of memory for a scratch buffer");
    const char* data = nullptr;
    PYCKPT_RETURN_IF_ERROR(rd.Read(p.begin, n, buf, &data));
    for (size_t k = p.run_first; k < p.run_last; ++k) {
      const ShardReadItem& it = items[plan.order[k]];
      const char* bytes = data + (it.offset - p.begin);
      if (options.verify) PYCKPT_RETURN_IF_ERROR(VerifyChunks(it, rd.name(), bytes, 0, it.nbytes, chunk));
      if (it.has_dst) ScatterRange(it.dst, 0, it.nbytes, bytes);
      if (options.progress) options.progress->fetch_add(it.nbytes, std::memory_order_relaxed);
    }
    return Status::OK();
  });
}

}  // namespace pyckpt
