// CRC-32C implementations. See pyckpt/crc32c.h for the contract.
//
// The CRC register is linear over GF(2): processing a byte string B starting
// from register r gives shift_{|B|}(r) XOR process(B, from 0), where shift_n
// means "feed n zero bytes". The hardware path uses that to run three
// independent `crc32` streams over adjacent blocks (hiding the instruction's
// 3-cycle latency) and merge them with precomputed shift tables.
#include "pyckpt/crc32c.h"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define PYCKPT_X86 1
#endif

namespace pyckpt {
namespace crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

inline uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // x86-64 and every supported target are little-endian
  return v;
}

// ---- portable slicing-by-8 -------------------------------------------------

struct SliceTables {
  uint32_t t[8][256];
  SliceTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  }
};

const SliceTables& Slices() {
  static const SliceTables tables;
  return tables;
}

// Advances a raw (non-inverted) register over n bytes.
uint32_t RawPortable(uint32_t reg, const uint8_t* p, size_t n) {
  const auto& t = Slices().t;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7u)) {
    reg = (reg >> 8) ^ t[0][(reg ^ *p++) & 0xffu];
    --n;
  }
  while (n >= 8) {
    uint64_t w = LoadLE64(p) ^ reg;
    reg = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^
          t[4][(w >> 24) & 0xff] ^ t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^
          t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) reg = (reg >> 8) ^ t[0][(reg ^ *p++) & 0xffu];
  return reg;
}

// ---- GF(2) arithmetic for Combine --------------------------------------------
// Polynomials are stored reflected: bit 31 holds x^0, bit 0 holds x^31.

uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kPoly : b >> 1;  // b *= x
  }
  return product;
}

// x^(8 * nbytes) mod P.
uint32_t XPow8N(uint64_t nbytes) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 23;  // x^8 (one byte)
  while (nbytes) {
    if (nbytes & 1u) result = MulModP(result, square);
    square = MulModP(square, square);
    nbytes >>= 1;
  }
  return result;
}

// ---- SSE4.2 three-stream version --------------------------------------------
#ifdef PYCKPT_X86

// shift_n as four byte-indexed tables: shift(r) = xor of t[k][byte k of r].
struct ShiftTable {
  uint32_t t[4][256];
  explicit ShiftTable(uint64_t nbytes) {
    uint32_t xn = XPow8N(nbytes);
    for (int k = 0; k < 4; ++k)
      for (uint32_t v = 0; v < 256; ++v) t[k][v] = MulModP(xn, v << (8 * k));
  }
  uint32_t Apply(uint32_t r) const {
    return t[0][r & 0xff] ^ t[1][(r >> 8) & 0xff] ^ t[2][(r >> 16) & 0xff] ^ t[3][r >> 24];
  }
};

constexpr size_t kLong = 8192;  // bytes per stream in a long round
constexpr size_t kShort = 256;  // bytes per stream in a short round

const ShiftTable& LongShift() {
  static const ShiftTable table(kLong);
  return table;
}
const ShiftTable& ShortShift() {
  static const ShiftTable table(kShort);
  return table;
}

// Three streams over three adjacent blocks of `block` bytes each, while at
// least 3 * block bytes remain.
__attribute__((target("sse4.2"))) inline void Rounds(uint64_t& r0, const uint8_t*& p, size_t& n,
                                                      size_t block, const ShiftTable& shift) {
  while (n >= 3 * block) {
    uint64_t r1 = 0, r2 = 0;
    const uint8_t* end = p + block;
    do {
      r0 = _mm_crc32_u64(r0, LoadLE64(p));
      r1 = _mm_crc32_u64(r1, LoadLE64(p + block));
      r2 = _mm_crc32_u64(r2, LoadLE64(p + 2 * block));
      p += 8;
    } while (p < end);
    r0 = shift.Apply(static_cast<uint32_t>(r0)) ^ static_cast<uint32_t>(r1);
    r0 = shift.Apply(static_cast<uint32_t>(r0)) ^ static_cast<uint32_t>(r2);
    p += 2 * block;
    n -= 3 * block;
  }
}

__attribute__((target("sse4.2"))) uint32_t RawHardware(uint32_t reg, const uint8_t* p,
                                                        size_t n) {
  uint64_t r0 = reg;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7u)) {
    r0 = _mm_crc32_u8(static_cast<uint32_t>(r0), *p++);
    --n;
  }
  Rounds(r0, p, n, kLong, LongShift());
  Rounds(r0, p, n, kShort, ShortShift());
  while (n >= 8) {
    r0 = _mm_crc32_u64(r0, LoadLE64(p));
    p += 8;
    n -= 8;
  }
  uint32_t r = static_cast<uint32_t>(r0);
  while (n--) r = _mm_crc32_u8(r, *p++);
  return r;
}

bool CpuHasSse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif  // PYCKPT_X86

using RawFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

RawFn Choose() {
#ifdef PYCKPT_X86
  if (CpuHasSse42()) {
    LongShift();  // build tables before the first hot call
    ShortShift();
    return RawHardware;
  }
#endif
  return RawPortable;
}

RawFn Dispatch() {
  static const RawFn fn = Choose();
  return fn;
}

}  // namespace

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  return ~Dispatch()(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), n);
}

bool ExtendHardware(uint32_t crc, const void* data, size_t n, uint32_t* out) {
#ifdef PYCKPT_X86
  if (!CpuHasSse42()) return false;
  *out = ~RawHardware(~crc, static_cast<const uint8_t*>(data), n);
  return true;
#else
  (void)crc, (void)data, (void)n, (void)out;
  return false;
#endif
}

const char* Implementation() { return Dispatch() == RawPortable ? "portable" : "sse4.2"; }

uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // CRC(A||B) = shift_{len_b}(CRC(A)) ^ CRC(B); the pre/post inversions cancel.
  return MulModP(XPow8N(len_b), crc_a) ^ crc_b;
}

}  // namespace crc32c
}  // namespace pyckpt
