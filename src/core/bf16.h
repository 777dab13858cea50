// Bit-exact conversions between f32 and the two 16-bit float formats, on raw uint16_t bit patterns.
//   bf16: 1 sign, 8 exponent, 7 mantissa bits — the top half of an f32.
//   f16 : IEEE binary16, 1 sign, 5 exponent, 10 mantissa bits.
// Narrowing rounds to nearest, ties to even (what PyTorch and the GPU cvt instructions do); NaN stays NaN
// (quiet, sign kept) and never rounds into infinity. Header-only and host/device so kernels share the exact
// same rounding as the CPU reference and checkpoint I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PRIMUS_HOST_DEVICE __host__ __device__
#else
#define PRIMUS_HOST_DEVICE
#endif

namespace primus {

PRIMUS_HOST_DEVICE inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

PRIMUS_HOST_DEVICE inline float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

PRIMUS_HOST_DEVICE inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

PRIMUS_HOST_DEVICE inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7FFF plus the lowest kept bit rounds half-way cases towards the even result; a carry into the
  // exponent is the correct rounding (up to infinity for values past the largest bf16).
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

PRIMUS_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mantissa << 13));  // inf / NaN
  if (exponent != 0) return f32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return f32_from_bits(sign);
  // Subnormal: mantissa × 2^-24, exact in f32.
  float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

PRIMUS_HOST_DEVICE inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to infinity
  if (a >= 0x38800000u) {
    // Normal f16 (>= 2^-14): rebias the exponent (127 -> 15) and round away 13 mantissa bits.
    uint32_t h = (a - 0x38000000u) >> 13;
    uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t exponent = a >> 23;
  if (exponent < 102) return sign;  // below half the smallest subnormal (2^-25): rounds to zero
  // Subnormal f16: the value is m × 2^-24 with m = full_mantissa >> shift; a carry into 0x400 is the smallest
  // normal, which is again the right encoding.
  uint32_t full = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - exponent;  // 14..24
  uint32_t m = full >> shift;
  uint32_t rest = full & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (m & 1u))) ++m;
  return static_cast<uint16_t>(sign | m);
}

inline void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
inline void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
inline void f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
inline void f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

}  // namespace primus
