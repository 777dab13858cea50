// CRC32C: slice-by-8 tables built at compile time, the SSE4.2 instruction over three interleaved streams, and
// the GF(2) arithmetic that joins CRCs of pieces (crc32c_combine).
//
// Polynomials here are 32-bit values in the reflected order the CRC uses: bit 31 is the coefficient of x^0, bit 0
// that of x^31. The CRC register is linear in its input: running it over B from a state s gives
// s·x^(8·|B|) ^ (the state after B from 0), all mod P; every join below is that identity.
#include "core/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace primus {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// a·b mod P.
constexpr uint32_t multiply_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int bit = 31; bit >= 0; --bit) {  // bit 31 - k of a is the coefficient of x^k; b holds b·x^k at step k
    if ((a >> bit) & 1u) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// kXPow2[k] = x^(2^k) mod P, by squaring from x^1.
constexpr int kPowers = 67;  // x^(8n) for any n below 2^64 uses powers up to 2^66
constexpr std::array<uint32_t, kPowers> make_x_pow2() {
  std::array<uint32_t, kPowers> t{};
  t[0] = 1u << 30;  // x^1
  for (int k = 1; k < kPowers; ++k) t[k] = multiply_mod_p(t[k - 1], t[k - 1]);
  return t;
}
constexpr std::array<uint32_t, kPowers> kXPow2 = make_x_pow2();

// x^(8·bytes) mod P: the factor that moves a CRC register past `bytes` zero bytes.
constexpr uint32_t x_pow_8n(uint64_t bytes) {
  uint32_t p = 1u << 31;  // x^0
  for (int k = 0; bytes != 0; ++k, bytes >>= 1) {
    if (bytes & 1u) p = multiply_mod_p(p, kXPow2[k + 3]);
  }
  return p;
}

using Crc32cTables = std::array<std::array<uint32_t, 256>, 8>;

// tables[0] is the byte-at-a-time table; tables[k][b] advances the CRC of byte b followed by k zero bytes,
// which lets the main loop fold eight input bytes per step.
constexpr Crc32cTables make_crc32c_tables() {
  Crc32cTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
  return t;
}

constexpr Crc32cTables kCrc32cTables = make_crc32c_tables();

#if defined(__x86_64__)

// Stream lengths of the interleaved loop and their shift factors, computed at compile time.
constexpr size_t kLongBlock = size_t{32} << 10;
constexpr size_t kShortBlock = 1024;
constexpr uint32_t kLongShift = x_pow_8n(kLongBlock);
constexpr uint32_t kShortShift = x_pow_8n(kShortBlock);

__attribute__((target("sse4.2"))) inline uint64_t load_u64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// Three streams of `block` bytes each, consecutive in memory, in one loop: the instruction's three-cycle latency
// is hidden behind the other two streams. `state` is the raw register before the 3·block bytes and after them.
__attribute__((target("sse4.2"))) uint64_t three_blocks(uint64_t state, const unsigned char* p, size_t block,
                                                         uint32_t shift) {
  uint64_t a = state, b = 0, c = 0;
  const unsigned char* pb = p + block;
  const unsigned char* pc = p + 2 * block;
  for (size_t i = 0; i < block; i += 8) {
    a = _mm_crc32_u64(a, load_u64(p + i));
    b = _mm_crc32_u64(b, load_u64(pb + i));
    c = _mm_crc32_u64(c, load_u64(pc + i));
  }
  uint32_t joined = multiply_mod_p(static_cast<uint32_t>(a), shift) ^ static_cast<uint32_t>(b);
  joined = multiply_mod_p(joined, shift) ^ static_cast<uint32_t>(c);
  return joined;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t state = static_cast<uint32_t>(~crc);
  while (n >= 3 * kLongBlock) {
    state = three_blocks(state, p, kLongBlock, kLongShift);
    p += 3 * kLongBlock;
    n -= 3 * kLongBlock;
  }
  while (n >= 3 * kShortBlock) {
    state = three_blocks(state, p, kShortBlock, kShortShift);
    p += 3 * kShortBlock;
    n -= 3 * kShortBlock;
  }
  for (; n >= 8; p += 8, n -= 8) state = _mm_crc32_u64(state, load_u64(p));
  uint32_t s = static_cast<uint32_t>(state);
  for (; n > 0; ++p, --n) s = _mm_crc32_u8(s, *p);
  return ~s;
}

bool detect_sse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

#endif

}  // namespace

uint32_t crc32c_software(const void* data, size_t n, uint32_t crc) {
  static_assert(std::endian::native == std::endian::little, "slice-by-8 CRC32C assumes a little-endian host");
  const auto& t = kCrc32cTables;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool crc32c_hardware_available() {
#if defined(__x86_64__)
  static const bool available = detect_sse42();
  return available;
#else
  return false;
#endif
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (crc32c_hardware_available()) return crc32c_sse42(data, n, crc);
#endif
  return crc32c_software(data, n, crc);
}

// With the init and final xor both ~0 they cancel out of the join: crc(AB) = crc(A)·x^(8|B|) ^ crc(B).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return multiply_mod_p(crc_a, x_pow_8n(len_b)) ^ crc_b;
}

}  // namespace primus
