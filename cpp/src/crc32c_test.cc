#include "pyckpt/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace pyckpt {
namespace crc32c {
namespace {

// RFC 3720, appendix B.4 "CRC Examples".
TEST(Crc32c, Rfc3720Vectors) {
  uint8_t buf[48];
  std::memset(buf, 0, 32);
  EXPECT_EQ(0x8a9136aau, Value(buf, 32));
  std::memset(buf, 0xff, 32);
  EXPECT_EQ(0x62a8ab43u, Value(buf, 32));
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(0x46dd794eu, Value(buf, 32));
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(0x113fdb5cu, Value(buf, 32));
  const uint8_t iscsi_read[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
      0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(0xd9963a56u, Value(iscsi_read, sizeof(iscsi_read)));
  EXPECT_EQ(0xe3069283u, Value("123456789", 9));
  EXPECT_EQ(0u, Value("", 0));
}

TEST(Crc32c, ExtendEqualsWhole) {
  const std::string s = "hello, checkpoint world";
  for (size_t cut = 0; cut <= s.size(); ++cut)
    EXPECT_EQ(Value(s.data(), s.size()), Extend(Value(s.data(), cut), s.data() + cut, s.size() - cut));
}

TEST(Crc32c, HardwareMatchesPortableOnRandomBuffers) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(200000 + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const size_t lengths[] = {0,    1,     7,     8,     9,     15,    16,    17,     63,
                            64,   65,    255,   256,   257,   319,   320,   511,    512,
                            767,  768,   769,   4095,  24575, 24576, 24577, 100000, 200000};
  for (size_t len : lengths) {
    for (size_t align = 0; align < 8; ++align) {
      const uint8_t* p = buf.data() + align;
      uint32_t portable = ExtendPortable(0x12345678u, p, len);
      uint32_t hw = 0;
      if (ExtendHardware(0x12345678u, p, len, &hw)) EXPECT_EQ(portable, hw) << len << "/" << align;
      uint32_t avx = 0;
      if (ExtendAvx512(0x12345678u, p, len, &avx)) EXPECT_EQ(portable, avx) << len << "/" << align;
      EXPECT_EQ(portable, Extend(0x12345678u, p, len)) << len << "/" << align;
    }
  }
}

TEST(Crc32c, CombineMatchesConcatenation) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(70000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const size_t cuts[] = {0, 1, 3, 1000, 32768, 69999, 70000};
  for (size_t cut : cuts) {
    uint32_t a = Value(buf.data(), cut);
    uint32_t b = Value(buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(Value(buf.data(), buf.size()), Combine(a, b, buf.size() - cut)) << cut;
  }
}

TEST(Crc32c, MaskRoundTripsAndDiffers) {
  for (uint32_t crc : {0u, 1u, 0xffffffffu, 0xe3069283u}) {
    EXPECT_NE(crc, Mask(crc));
    EXPECT_NE(crc, Mask(Mask(crc)));
    EXPECT_EQ(crc, Unmask(Mask(crc)));
    EXPECT_EQ(crc, Unmask(Unmask(Mask(Mask(crc)))));
  }
}

TEST(Crc32c, ImplementationIsNamed) {
  std::string impl = Implementation();
  EXPECT_TRUE(impl == "avx512-vpclmulqdq" || impl == "sse4.2" || impl == "portable");
}

}  // namespace
}  // namespace crc32c
}  // namespace pyckpt
