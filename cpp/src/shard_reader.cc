#include "pyckpt/shard_reader.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// 4K aliasing. The kernel copies file pages into user memory with `rep movsb` on CPUs with
// fast strings, and that copy runs 2.5-4x slower when the destination lies 1-31 bytes past
// the source modulo 4 KiB (measured on AMD EPYC, Linux 6.18: 6.4 GB/s per core aligned,
// 1.7-2.5 GB/s at 1-31 bytes). The source is the page cache, at the file offset's page
// offset; the destination is wherever the caller's array starts, and glibc puts the data of
// every block it maps by itself 16 bytes past a page boundary: a large np.empty, read from a
// tensor that starts at a page boundary of the file, hits the slow case for every byte.
// Such reads go through scratch memory at the file's page offset instead, and a copy that
// does not use `rep movsb` moves the verified bytes on: measured 2-2.5x less CPU than the
// aliased direct read, about the cost of an unaliased one.
constexpr uint64_t kPage = 4096;
constexpr uint64_t kAliasWindow = 64;  // the measured 1-31 bytes, with a margin

bool Aliased(const void* dst, const void* src) {
  const uint64_t r = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) &
                     (kPage - 1);
  return r != 0 && r < kAliasWindow;
}

bool AliasedWithFile(const char* dst, uint64_t file_offset) {
  return Aliased(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(file_offset)));
}

// n bytes of scratch memory at the page offset of file offset `offset` (so that reading the
// file there is never aliased), or nullptr when memory is exhausted.
char* ScratchAt(ScratchBuffer& s, uint64_t n, uint64_t offset) {
  char* base = s.Get(static_cast<size_t>(n + kPage));
  if (!base) return nullptr;
  return base + ((offset - reinterpret_cast<uintptr_t>(base)) & (kPage - 1));
}

// memcpy without `rep movsb`, for the aliased copies above (glibc's memcpy uses `rep movsb`
// for mid-sized copies, measured just as slow there at 128-256 KiB). Large copies use
// non-temporal stores: the destination is not read again soon, and streaming stores skip
// reading its lines first (1.5-2x faster than cached stores here).
#if defined(__SSE2__)
template <bool kStream>
void CopyBlocks(char* dst, const char* src, uint64_t n) {  // dst 16-byte aligned, n % 64 == 0
  for (; n > 0; n -= 64, dst += 64, src += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    __m128i* out = reinterpret_cast<__m128i*>(dst);
    if (kStream) {
      _mm_stream_si128(out, a);
      _mm_stream_si128(out + 1, b);
      _mm_stream_si128(out + 2, c);
      _mm_stream_si128(out + 3, d);
    } else {
      _mm_store_si128(out, a);
      _mm_store_si128(out + 1, b);
      _mm_store_si128(out + 2, c);
      _mm_store_si128(out + 3, d);
    }
  }
  if (kStream) _mm_sfence();  // streaming stores are weakly ordered
}
#endif

constexpr uint64_t kStreamMin = 64u << 10;

void CopyUnaliased(char* dst, const char* src, uint64_t n) {
#if defined(__SSE2__)
  uint64_t head = (0 - reinterpret_cast<uintptr_t>(dst)) & 15;  // up to 16-byte alignment
  if (head > n) head = n;
  std::memcpy(dst, src, static_cast<size_t>(head));
  dst += head;
  src += head;
  n -= head;
  const uint64_t body = n / 64 * 64;
  if (body >= kStreamMin) CopyBlocks<true>(dst, src, body);
  else CopyBlocks<false>(dst, src, body);
  std::memcpy(dst + body, src + body, static_cast<size_t>(n - body));
#else
  std::memcpy(dst, src, static_cast<size_t>(n));
#endif
}

// Copies verified bytes [begin, begin + n) of an item into its destination.
void CopyOut(const ShardReadItem& it, uint64_t begin, uint64_t n, const char* data) {
  char* dst = it.dst.data + begin;
  if (it.dst.IsContiguous() && Aliased(dst, data)) CopyUnaliased(dst, data, n);
  else ScatterRange(it.dst, begin, n, data);
}

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

  const uint64_t step = StepSize(chunk);
  PiecePlan plan = PlanPieces(spans, chunk, RoundToChunks(options.piece_size, chunk), options.max_gap);
  const int threads = ResolveThreads(options.threads);
  ScratchSet scratch(threads);
  const bool whole = options.verify && options.whole_item_crc;
  std::vector<uint32_t> piece_crcs(whole ? plan.pieces.size() : 0);

  Status st = ParallelFor(plan.pieces.size(), threads, [&](size_t i, int w) -> Status {
    const Piece& p = plan.pieces[i];
    const Reader& rd = *readers[p.file];
    const uint64_t n = p.end - p.begin;
    if (!p.run) {
      uint32_t crc = 0;  // whole_item_crc: of this piece's bytes so far
      // Read in steps of about 1 MiB and verify each right away, while it is in cache.
      // A contiguous destination is read into directly unless that read is aliased.
      const ShardReadItem& it = items[p.item];
      const bool direct = it.has_dst && it.dst.IsContiguous() &&
                          !AliasedWithFile(it.dst.data, it.offset);
      const uint64_t end = p.item_begin + n;
      for (uint64_t b = p.item_begin; b < end; b += step) {
        const uint64_t len = std::min(step, end - b);
        char* buf = direct ? it.dst.data + b : ScratchAt(scratch[w], len, it.offset + b);
        if (!buf) return Status::IOError("out of memory for a scratch buffer");
        const char* data = nullptr;
        PYCKPT_RETURN_IF_ERROR(rd.Read(it.offset + b, len, buf, &data));
        if (whole) crc = crc32c::Extend(crc, data, len);
        else if (options.verify)
          PYCKPT_RETURN_IF_ERROR(VerifyChunks(it, rd.name(), data, b, len, chunk));
        if (it.has_dst && data != it.dst.data + b) CopyOut(it, b, len, data);
        if (options.progress) options.progress->fetch_add(len, std::memory_order_relaxed);
      }
      if (whole) piece_crcs[i] = crc;
      return Status::OK();
    }
    char* buf = ScratchAt(scratch[w], n, p.begin);
    if (!buf) return Status::IOError("out of memory for a scratch buffer");
    const char* data = nullptr;
    PYCKPT_RETURN_IF_ERROR(rd.Read(p.begin, n, buf, &data));
    for (size_t k = p.run_first; k < p.run_last; ++k) {
      const ShardReadItem& it = items[plan.order[k]];
      const char* bytes = data + (it.offset - p.begin);
      if (options.verify) PYCKPT_RETURN_IF_ERROR(VerifyChunks(it, rd.name(), bytes, 0, it.nbytes, chunk));
      if (it.has_dst) CopyOut(it, 0, it.nbytes, bytes);
      if (options.progress) options.progress->fetch_add(it.nbytes, std::memory_order_relaxed);
    }
    return Status::OK();
  });
  if (!st.ok() || !whole) return st;
  // The slices of one item keep their order in plan.pieces: combine them in turn.
  std::vector<uint32_t> acc(items.size(), 0);
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const Piece& p = plan.pieces[i];
    if (p.run) continue;
    acc[p.item] = p.item_begin == 0 ? piece_crcs[i]
                                    : crc32c::Combine(acc[p.item], piece_crcs[i], p.end - p.begin);
    if (p.item_begin + (p.end - p.begin) != items[p.item].nbytes) continue;  // not its last
    const ShardReadItem& it = items[p.item];
    const uint32_t actual = crc32c::Mask(acc[p.item]);
    if (actual != it.crcs[0])
      return Mismatch(it, readers[p.file]->name(), 0, it.nbytes, it.crcs[0], actual);
  }
  return Status::OK();
}

}  // namespace pyckpt
