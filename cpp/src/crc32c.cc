// CRC-32C implementations. See pyckpt/crc32c.h for the contract.
//
// The CRC register is linear over GF(2): processing a byte string B starting
// from register r gives shift_{|B|}(r) XOR process(B, from 0), where shift_n
// means "feed n zero bytes". The hardware path uses that to run three
// independent `crc32` streams over adjacent blocks (hiding the instruction's
// 3-cycle latency) and merge them with precomputed shift tables.
#include "pyckpt/crc32c.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
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

// x^nbits mod P.
uint32_t XPowBits(uint64_t nbits) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 30;  // x^1
  while (nbits) {
    if (nbits & 1u) result = MulModP(result, square);
    square = MulModP(square, square);
    nbits >>= 1;
  }
  return result;
}

// x^(8 * nbytes) mod P.
uint32_t XPow8N(uint64_t nbytes) { return XPowBits(8 * nbytes); }

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
    do {  // two words per stream per iteration (block is a multiple of 16)
      r0 = _mm_crc32_u64(r0, LoadLE64(p));
      r1 = _mm_crc32_u64(r1, LoadLE64(p + block));
      r2 = _mm_crc32_u64(r2, LoadLE64(p + 2 * block));
      r0 = _mm_crc32_u64(r0, LoadLE64(p + 8));
      r1 = _mm_crc32_u64(r1, LoadLE64(p + block + 8));
      r2 = _mm_crc32_u64(r2, LoadLE64(p + 2 * block + 8));
      p += 16;
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

// ---- AVX-512 VPCLMULQDQ folding version -------------------------------------
//
// A 128-bit lane loaded little-endian from 16 message bytes holds, in bit i,
// the message bit of degree 127 - i (relative to the lane's end); its low
// qword L is the high-degree half: lane(x) = x^64 * L(x) + H(x), where a qword
// q stands for q(x) = sum q_i x^(63-i). Moving a lane D bits further along the
// message multiplies it by x^D; carry-less products of reflected qwords come
// out multiplied by an extra x, so
//   lane * x^D  ==  clmul(L, x^(D+63) mod P) ^ clmul(H, x^(D-1) mod P)
// with each 32-bit constant c stored in a qword as c_reflected << 32.
// At the end, lane(x) * x^32 mod P (the CRC register) is two crc32
// instructions: crc32(crc32(0, L), H).

struct FoldConstant {
  uint64_t lo, hi;  // multipliers of the low and high qword of a lane
  explicit FoldConstant(uint64_t distance_bits)
      : lo(static_cast<uint64_t>(XPowBits(distance_bits + 63)) << 32),
        hi(static_cast<uint64_t>(XPowBits(distance_bits - 1)) << 32) {}
};

const FoldConstant& Fold2048() {  // each lane of 4 zmm accumulators, 256 bytes ahead
  static const FoldConstant k(2048);
  return k;
}
const FoldConstant& Fold512() {  // one zmm, 64 bytes ahead
  static const FoldConstant k(512);
  return k;
}
const FoldConstant& Fold128() {  // one xmm lane, 16 bytes ahead
  static const FoldConstant k(128);
  return k;
}

#define PYCKPT_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,sse4.2")))

PYCKPT_AVX512_TARGET inline __m512i FoldZ(__m512i acc, __m512i k, __m512i data) {
  __m512i a = _mm512_clmulepi64_epi128(acc, k, 0x00);
  __m512i b = _mm512_clmulepi64_epi128(acc, k, 0x11);
  return _mm512_ternarylogic_epi64(a, b, data, 0x96);  // a ^ b ^ data
}

PYCKPT_AVX512_TARGET inline __m128i FoldX(__m128i acc, __m128i k, __m128i data) {
  __m128i a = _mm_clmulepi64_si128(acc, k, 0x00);
  __m128i b = _mm_clmulepi64_si128(acc, k, 0x11);
  return _mm_ternarylogic_epi64(a, b, data, 0x96);
}

constexpr size_t kPrefetch = 2048;  // bytes ahead: DRAM-bound streams gain ~10%

PYCKPT_AVX512_TARGET uint32_t RawAvx512(uint32_t reg, const uint8_t* p, size_t n) {
  if (n < 256) return RawHardware(reg, p, n);
  const FoldConstant& c4 = Fold2048();
  const FoldConstant& c1 = Fold512();
  const FoldConstant& cx = Fold128();
  const __m512i k4 = _mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<int64_t>(c4.hi), static_cast<int64_t>(c4.lo)));
  const __m512i k1 = _mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<int64_t>(c1.hi), static_cast<int64_t>(c1.lo)));
  const __m128i kx = _mm_set_epi64x(static_cast<int64_t>(cx.hi), static_cast<int64_t>(cx.lo));

  __m512i x0 = _mm512_loadu_si512(p);
  __m512i x1 = _mm512_loadu_si512(p + 64);
  __m512i x2 = _mm512_loadu_si512(p + 128);
  __m512i x3 = _mm512_loadu_si512(p + 192);
  x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(reg))));
  p += 256;
  n -= 256;
  while (n >= 256) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch + 64, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch + 128, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch + 192, _MM_HINT_T0);
    x0 = FoldZ(x0, k4, _mm512_loadu_si512(p));
    x1 = FoldZ(x1, k4, _mm512_loadu_si512(p + 64));
    x2 = FoldZ(x2, k4, _mm512_loadu_si512(p + 128));
    x3 = FoldZ(x3, k4, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  x1 = FoldZ(x0, k1, x1);
  x2 = FoldZ(x1, k1, x2);
  x3 = FoldZ(x2, k1, x3);
  while (n >= 64) {
    x3 = FoldZ(x3, k1, _mm512_loadu_si512(p));
    p += 64;
    n -= 64;
  }
  __m128i x = _mm512_extracti32x4_epi32(x3, 0);
  x = FoldX(x, kx, _mm512_extracti32x4_epi32(x3, 1));
  x = FoldX(x, kx, _mm512_extracti32x4_epi32(x3, 2));
  x = FoldX(x, kx, _mm512_extracti32x4_epi32(x3, 3));
  while (n >= 16) {
    x = FoldX(x, kx, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    p += 16;
    n -= 16;
  }
  uint64_t r = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(x)));
  r = _mm_crc32_u64(r, static_cast<uint64_t>(_mm_extract_epi64(x, 1)));
  return RawHardware(static_cast<uint32_t>(r), p, n);
}

bool CpuHasAvx512Clmul() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq") &&
         __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
}

bool CpuHasSse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif  // PYCKPT_X86

using RawFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

RawFn Choose() {
#ifdef PYCKPT_X86
  if (std::getenv("PYCKPT_CRC32C_NO_AVX512") == nullptr && CpuHasAvx512Clmul()) {
    LongShift();
    ShortShift();
    Fold2048();
    Fold512();
    Fold128();
    return RawAvx512;
  }
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

// Extend() through one implementation (the raw ones work on the inverted CRC).
uint32_t ExtendWith(RawFn fn, uint32_t crc, const void* data, size_t n) {
  return ~fn(~crc, static_cast<const uint8_t*>(data), n);
}

#ifdef PYCKPT_X86
// ExtendWith into *out when the CPU supports fn; false (and *out untouched) when not.
bool ExtendIfSupported(bool supported, RawFn fn, uint32_t crc, const void* data, size_t n,
                       uint32_t* out) {
  if (!supported) return false;
  *out = ExtendWith(fn, crc, data, n);
  return true;
}
#endif

}  // namespace

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  return ExtendWith(Dispatch(), crc, data, n);
}

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ExtendWith(RawPortable, crc, data, n);
}

#ifdef PYCKPT_X86
bool ExtendHardware(uint32_t crc, const void* data, size_t n, uint32_t* out) {
  return ExtendIfSupported(CpuHasSse42(), RawHardware, crc, data, n, out);
}

bool ExtendAvx512(uint32_t crc, const void* data, size_t n, uint32_t* out) {
  return ExtendIfSupported(CpuHasAvx512Clmul(), RawAvx512, crc, data, n, out);
}
#else
bool ExtendHardware(uint32_t, const void*, size_t, uint32_t*) { return false; }
bool ExtendAvx512(uint32_t, const void*, size_t, uint32_t*) { return false; }
#endif

const char* Implementation() {
  RawFn fn = Dispatch();
  if (fn == RawPortable) return "portable";
#ifdef PYCKPT_X86
  if (fn == RawAvx512) return "avx512-vpclmulqdq";
#endif
  return "sse4.2";
}

uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // CRC(A||B) = shift_{len_b}(CRC(A)) ^ CRC(B); the pre/post inversions cancel.
  return MulModP(XPow8N(len_b), crc_a) ^ crc_b;
}

}  // namespace crc32c
}  // namespace pyckpt
