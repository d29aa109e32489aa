// Reading tensors back from shard data, verifying every chunk's CRC32C
// (docs/FORMAT.md, "Shard files" and "Checksums").
//
// Contract: for every item, the bytes at [offset, offset+nbytes) of its source
// are read, each chunk's CRC is checked against the item's masked CRCs
// (ceil(nbytes / chunk_size) of them), and the bytes are copied into dst (when
// given). A contiguous dst is read into directly (no intermediate copy) unless
// that read would be 4K-aliased (dst 1-63 bytes past the file offset modulo
// 4 KiB, where the kernel's copy is several times slower, shard_reader.cc);
// such a dst, and a strided one, go through a scratch buffer. Sources are
// either files (pread) or memory (an mmap or downloaded ranges; read in place
// without copying).
// With options.whole_item_crc, each item has a single masked CRC over all its
// bytes (TensorFlow's bundles) instead of one per chunk; chunk_size then only
// sets the step of reads. Large items are still read in parallel pieces: each
// piece's CRC is computed as it is read and the pieces' CRCs are combined
// (crc32c::Combine) once all are read, so a mismatch is reported after the
// destination was written.
// Errors name the key, the source and the byte range: Corruption for a CRC
// mismatch or a source too short, NotFound for a missing file, IOError else.
// On error, destinations may hold partial data.
// Thread-safety: one call uses up to options.threads threads of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "pyckpt/defaults.h"
#include "pyckpt/status.h"
#include "pyckpt/tensor_view.h"

namespace pyckpt {

struct ShardReadItem {
  std::string key;
  uint32_t source = 0;
  uint64_t offset = 0;  // in the source's coordinates (file offset)
  uint64_t nbytes = 0;
  const uint32_t* crcs = nullptr;  // masked, NumChunks(nbytes) of them (1: whole_item_crc)
  bool has_dst = false;
  TensorView dst;  // must hold exactly nbytes logical bytes when has_dst
};

// A source: a file path, or a memory range [data, data+size) holding the
// file's bytes [base, base+size).
struct ShardSource {
  std::string name;  // path or URL, for messages and for opening files
  bool in_memory = false;
  const char* data = nullptr;
  uint64_t base = 0;
  uint64_t size = 0;
};

struct ShardReadOptions {
  int threads = kAutoThreads;
  uint64_t chunk_size = kDefaultChunkSize;
  uint64_t piece_size = kDefaultPieceSize;
  uint64_t max_gap = kDefaultMaxGap;  // small tensors closer than this share a read
  bool verify = true;
  bool whole_item_crc = false;  // one CRC per item, not per chunk (see above)
  std::atomic<uint64_t>* progress = nullptr;  // bytes read so far, when set
};

Status ReadShards(const std::vector<ShardSource>& sources, const std::vector<ShardReadItem>& items,
                  const ShardReadOptions& options);

}  // namespace pyckpt
