// Splitting the byte ranges of many tensors in a few files into "pieces", the
// unit of parallel work for both the writer and the reader:
//  - a slice: a chunk-aligned part of one large tensor (direct I/O to/from it);
//  - a run: several small tensors (each under one chunk) close together in one
//    file, moved with a single read or write through a scratch buffer.
// Pieces of different files are interleaved so concurrent workers tend to
// touch different files (a filesystem may serialize writers of one inode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pyckpt {

struct Span {
  uint32_t file = 0;
  uint64_t offset = 0;  // first byte in the file
  uint64_t nbytes = 0;
};

struct Piece {
  uint32_t file = 0;
  uint64_t begin = 0, end = 0;  // byte range in the file
  bool run = false;
  // slice: the item and the logical byte offset of the slice within it
  size_t item = 0;
  uint64_t item_begin = 0;
  // run: items order[run_first .. run_last)
  size_t run_first = 0, run_last = 0;
};

struct PiecePlan {
  std::vector<size_t> order;  // item indices sorted by (file, offset)
  std::vector<Piece> pieces;
  uint64_t max_run_bytes = 0;  // largest run, to size scratch buffers
};

// piece_size must be a positive multiple of chunk_size; items of nbytes == 0
// get no piece. Runs never span more than piece_size bytes nor gaps over max_gap.
// whole_items: the files take turns by item (all slices of an item in a row)
// rather than by piece; staging through a ring relies on it (staged_writer.h).
PiecePlan PlanPieces(const std::vector<Span>& items, uint64_t chunk_size, uint64_t piece_size,
                     uint64_t max_gap, bool whole_items = false);

// Masked CRC32C of each chunk of data[0, n), which starts at logical byte
// `logical_begin` (a multiple of chunk_size) of its tensor; results go to
// out[logical_begin / chunk_size ...].
void ChunkChecksums(const char* data, uint64_t logical_begin, uint64_t n, uint64_t chunk_size,
                    uint32_t* out);

inline uint64_t NumChunks(uint64_t nbytes, uint64_t chunk_size) {
  return (nbytes + chunk_size - 1) / chunk_size;
}

// piece_size rounded down to a multiple of chunk_size, and at least one chunk
// (chunk_size > 0): the piece size the writer and reader plan with.
inline uint64_t RoundToChunks(uint64_t piece_size, uint64_t chunk_size) {
  return (piece_size > chunk_size ? piece_size : chunk_size) / chunk_size * chunk_size;
}

// The unit of one read or write call inside a slice: a whole number of chunks
// of about 1 MiB (one chunk when chunks are larger), so each chunk is
// checksummed right before or after the kernel copies it, while it is in cache.
inline uint64_t StepSize(uint64_t chunk_size) {
  constexpr uint64_t kTarget = 1u << 20;
  return chunk_size >= kTarget ? chunk_size : kTarget / chunk_size * chunk_size;
}

// Logical bytes [begin, end) of item `item`: the unit of parallel in-memory
// copies (CopyTensors, StagedWrite::Stage).
struct ItemRange {
  size_t item = 0;
  uint64_t begin = 0, end = 0;
};

// Appends bytes [0, nbytes) of `item`, cut into ranges of piece_size bytes
// (the last one shorter; none when nbytes == 0), to *out and returns how many
// it appended. piece_size must be positive.
size_t SplitItem(size_t item, uint64_t nbytes, uint64_t piece_size, std::vector<ItemRange>* out);

}  // namespace pyckpt
