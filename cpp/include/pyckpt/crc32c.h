// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI
// (RFC 3720), LevelDB and GCS.
//
// Contract: Extend(crc, data, n) continues a CRC previously returned by
// Value/Extend (start from 0). Combine() merges the CRCs of two adjacent byte
// ranges without touching the bytes. Mask/Unmask make a CRC safe to store in
// data that is itself checksummed (docs/FORMAT.md section "Checksums").
// The fastest implementation the CPU supports is chosen once, at first use:
// AVX-512 VPCLMULQDQ folding (four 512-bit accumulators), else SSE4.2 `crc32`
// with three interleaved streams, else a portable table version. Setting the
// environment variable PYCKPT_CRC32C_NO_AVX512 skips the AVX-512 path.
// Thread-safety: all functions are pure and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyckpt {
namespace crc32c {

uint32_t Extend(uint32_t crc, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// CRC of A||B given crc_a = CRC(A), crc_b = CRC(B) and len_b = |B|.
uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Name of the implementation Extend() dispatches to
// ("avx512-vpclmulqdq", "sse4.2" or "portable").
const char* Implementation();

// Entry points of the individual implementations, for tests and benchmarks.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
// Returns false (and leaves *out alone) when the CPU lacks SSE4.2.
bool ExtendHardware(uint32_t crc, const void* data, size_t n, uint32_t* out);
// Returns false when the CPU lacks AVX-512 (F, BW, VL) with VPCLMULQDQ.
bool ExtendAvx512(uint32_t crc, const void* data, size_t n, uint32_t* out);

static constexpr uint32_t kMaskDelta = 0xa282ead8u;

// Rotate and offset a CRC so that the CRC of a string containing embedded
// CRCs is not degenerate (LevelDB's scheme).
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }
inline uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace crc32c
}  // namespace pyckpt
