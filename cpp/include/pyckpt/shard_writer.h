// Writing tensors into shard files (docs/FORMAT.md, "Shard files").
//
// Contract: every item's logical bytes are written at [offset, offset+nbytes)
// of files[item.file]; the caller's layout (see layout.h) guarantees that
// ranges do not overlap. Contiguous tensors are written straight from their
// memory; strided ones are gathered through a per-worker scratch buffer.
// While writing, the masked CRC32C of every chunk_size-byte chunk of every
// tensor (chunks counted from the tensor's first byte) is computed.
// Files are created new (O_EXCL), sized exactly, and fsync'd when sync is set.
// On error the first failure is returned and partially written files remain
// for the caller to delete (it knows their names).
// Thread-safety: one call uses up to options.threads threads of its own; the
// source buffers must stay alive and unmodified for the duration of the call.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "pyckpt/defaults.h"
#include "pyckpt/status.h"
#include "pyckpt/tensor_view.h"

namespace pyckpt {

struct ShardWriteItem {
  std::string key;  // for error messages only
  TensorView src;
  uint32_t file = 0;
  uint64_t offset = 0;
};

struct ShardWriteOptions {
  int threads = kAutoThreads;                // <= 0: DefaultThreads()
  uint64_t chunk_size = kDefaultChunkSize;  // checksum granularity
  uint64_t piece_size = kDefaultPieceSize;  // parallel work unit; rounded to chunks
  bool sync = true;                // fsync every file before returning
  bool early_writeback = true;     // start writeback of each piece right away
  // Write the slices of each tensor in a row (files take turns by tensor, not by
  // piece): a StagedWrite that reuses staging memory needs it (staged_writer.h).
  bool whole_items = false;
  // When set, bytes written so far are added here as pieces complete (read by
  // another thread to report progress).
  std::atomic<uint64_t>* progress = nullptr;
};

struct ChecksumResult {
  // Item i's masked chunk CRCs are crcs[crc_begin[i] .. crc_begin[i+1]).
  std::vector<uint32_t> crcs;
  std::vector<uint64_t> crc_begin;
};

Status WriteShardFiles(const std::vector<std::string>& files,
                       const std::vector<uint64_t>& file_sizes,
                       const std::vector<ShardWriteItem>& items, const ShardWriteOptions& options,
                       ChecksumResult* result);

// The same checksums without writing anything (for stores written from Python).
Status ComputeChecksums(const std::vector<ShardWriteItem>& items, const ShardWriteOptions& options,
                        ChecksumResult* result);

}  // namespace pyckpt
