// CRC32C: the published vectors (RFC 3720's iSCSI examples, the "123456789" check value) on both paths, the
// hardware path against the table path on random lengths and alignments, and crc32c_combine against the CRC of
// the joined bytes.
#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace primus {
namespace {

struct Vector {
  const char* what;
  std::vector<unsigned char> bytes;
  uint32_t crc;
};

std::vector<Vector> published_vectors() {
  std::vector<Vector> v;
  v.push_back({"32 zero bytes", std::vector<unsigned char>(32, 0x00), 0x8A9136AAu});
  v.push_back({"32 bytes of 0xFF", std::vector<unsigned char>(32, 0xFF), 0x62A8AB43u});
  std::vector<unsigned char> up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
    down[static_cast<size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  v.push_back({"32 ascending bytes", up, 0x46DD794Eu});
  v.push_back({"32 descending bytes", down, 0x113FDB5Cu});
  // RFC 3720 B.4: an iSCSI SCSI Read (10) command PDU.
  v.push_back({"iSCSI read command",
               {0x01, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
                0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
               0xD9963A56u});
  const std::string check = "123456789";
  v.push_back({"\"123456789\"", std::vector<unsigned char>(check.begin(), check.end()), 0xE3069283u});
  v.push_back({"no bytes", {}, 0x00000000u});
  return v;
}

TEST(Crc32c, PublishedVectorsOnBothPaths) {
  for (const Vector& v : published_vectors()) {
    EXPECT_EQ(crc32c(v.bytes.data(), v.bytes.size()), v.crc) << v.what;
    EXPECT_EQ(crc32c_software(v.bytes.data(), v.bytes.size()), v.crc) << v.what;
  }
}

TEST(Crc32c, SaysWhichPathItTakes) {
#if defined(__x86_64__)
  EXPECT_EQ(crc32c_hardware_available(), static_cast<bool>(__builtin_cpu_supports("sse4.2")));
#else
  EXPECT_FALSE(crc32c_hardware_available());
#endif
}

// Lengths around every branch of the interleaved loop (3 × 1 KiB and 3 × 32 KiB blocks, the 8-byte and byte tails)
// and random ones, at every alignment of the start, chained from a random CRC.
TEST(Crc32c, HardwarePathEqualsTablePathAtAnyLengthAndAlignment) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> buffer((size_t{3} << 17) + 64);
  for (auto& b : buffer) b = static_cast<unsigned char>(rng());
  std::vector<size_t> lengths = {0, 1, 7, 8, 9, 3071, 3072, 3073, 3 * 1024 + 8, 98303, 98304, 98305, 98304 + 3072 + 5,
                                 (size_t{3} << 17)};
  for (int i = 0; i < 200; ++i) lengths.push_back(rng() % (size_t{3} << 17));
  for (size_t n : lengths) {
    for (size_t align = 0; align < 8; ++align) {
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(crc32c(buffer.data() + align, n, seed), crc32c_software(buffer.data() + align, n, seed))
          << "length " << n << ", alignment " << align;
    }
  }
}

TEST(Crc32c, CombineEqualsTheCrcOfTheJoinedBytes) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> bytes(200000);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (int i = 0; i < 100; ++i) {
    const size_t split = rng() % (bytes.size() + 1);
    const uint32_t a = crc32c(bytes.data(), split);
    const uint32_t b = crc32c(bytes.data() + split, bytes.size() - split);
    ASSERT_EQ(crc32c_combine(a, b, bytes.size() - split), crc32c(bytes.data(), bytes.size())) << "split " << split;
  }
  // Many pieces joined left to right, as the parallel reads and writes do.
  uint32_t joined = 0;
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min(bytes.size() - at, static_cast<size_t>(1 + rng() % 9000));
    joined = crc32c_combine(joined, crc32c(bytes.data() + at, n), n);
    at += n;
  }
  EXPECT_EQ(joined, crc32c(bytes.data(), bytes.size()));
}

// Joins of large lengths: 64 MiB of zeros built by doubling 1 MiB equals the CRC computed directly, and joins
// past 2^32 bytes are associative (the shift factors of lengths above 32 bits are right).
TEST(Crc32c, CombineOverLargeLengths) {
  const std::vector<unsigned char> zeros(size_t{64} << 20, 0);
  uint32_t doubled = crc32c(zeros.data(), size_t{1} << 20);
  uint64_t length = uint64_t{1} << 20;
  for (; length < zeros.size(); length *= 2) doubled = crc32c_combine(doubled, doubled, length);
  EXPECT_EQ(doubled, crc32c(zeros.data(), zeros.size()));

  const uint32_t a = crc32c("123456789", 9);
  const uint32_t b = 0x9ABCDEF0u;  // stands for the CRC of some 5 GiB
  const uint32_t c = 0x12345678u;  // and of some 3 GiB + 5 bytes
  const uint64_t len_b = uint64_t{5} << 30;
  const uint64_t len_c = (uint64_t{3} << 30) + 5;
  EXPECT_EQ(crc32c_combine(crc32c_combine(a, b, len_b), c, len_c),
            crc32c_combine(a, crc32c_combine(b, c, len_c), len_b + len_c));
  EXPECT_NE(crc32c_combine(a, b, len_b), crc32c_combine(a, b, len_b + 1));
}

}  // namespace
}  // namespace primus
