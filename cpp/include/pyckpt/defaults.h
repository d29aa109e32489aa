// The core's default tuning, defined once. The option structs (shard_reader.h,
// shard_writer.h), CopyTensors (copy.h), StagedWrite (staged_writer.cc) and the
// Python binding's keyword defaults (cpp/bindings/module.cc) all use these.
#pragma once

#include <cstdint>

namespace pyckpt {

// A thread count that means "DefaultThreads()" (parallel.h).
constexpr int kAutoThreads = 0;
// Bytes per checksummed chunk (the manifest's chunk_size).
constexpr uint64_t kDefaultChunkSize = 1u << 20;
// Unit of parallel work of the shard writer and reader (rounded to chunks).
constexpr uint64_t kDefaultPieceSize = 8u << 20;
// The reader merges small tensors of one file closer than this into one read.
constexpr uint64_t kDefaultMaxGap = 64u << 10;
// Unit of parallel work of in-memory copies (CopyTensors, StagedWrite::Stage).
constexpr uint64_t kDefaultCopyPieceSize = 4u << 20;

}  // namespace pyckpt
