// The four 8-bit floating-point formats fp8 training uses, as data, and exact conversions between them and f32.
//   e4m3      OCP FP8 E4M3 ("fn"): bias 7, max 448, no infinities, S.1111.111 is NaN (one per sign); NVIDIA Hopper,
//             AMD MI355X.
//   e5m2      OCP FP8 E5M2: bias 15, max 57344, IEEE-like (exponent 31: infinity with mantissa 0, else NaN).
//   e4m3fnuz  AMD MI300X (and Graphcore): bias 8, max 240, no infinities, no negative zero; 0x80 is the only NaN.
//   e5m2fnuz  AMD MI300X: bias 16, max 57344, no infinities, no negative zero; 0x80 is the only NaN.
// All four have subnormals (exponent field 0: mantissa × 2^(1 − bias − mantissa_bits)).
//
// Narrowing (fp8_encode) rounds to nearest, ties to even, with the exponent range treated as unbounded; a result
// past max_finite overflows. With saturate (what every recipe uses, as NVIDIA's cvt.satfinite and Transformer
// Engine's casts do) an overflow, and ±infinity, become ±max_finite: a stale delayed scale then clips a few values
// instead of poisoning a GEMM with NaN. Without saturate an overflow becomes infinity where the format has one
// (e5m2), else NaN: the IEEE behaviour, for checking data and for converting stored values. NaN in gives NaN out in
// both modes (sign kept where the format has a signed NaN). Widening (fp8_decode) is exact.
//
// Header-only and host/device (core/bf16.h's PRIMUS_HOST_DEVICE) so the CUDA kernels produce the same bits as the
// CPU reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/bf16.h"

namespace primus {

enum class Fp8Format : uint8_t { kE4M3, kE5M2, kE4M3Fnuz, kE5M2Fnuz };

struct Fp8FormatInfo {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  float max_finite;
  bool has_infinity;       // e5m2: exponent all ones with mantissa 0
  bool has_negative_zero;  // false for the fnuz formats, whose 0x80 is the NaN
  // Where NaN lives: the fnuz formats use 0x80 only; e4m3 the all-ones exponent and mantissa; e5m2 (IEEE) the
  // all-ones exponent with any non-zero mantissa.
  bool nan_is_0x80;
  bool nan_needs_full_mantissa;  // e4m3: only S.1111.111 is NaN, S.1111.000-110 are finite
};

PRIMUS_HOST_DEVICE constexpr Fp8FormatInfo fp8_info(Fp8Format format) {
  switch (format) {
    case Fp8Format::kE4M3: return {4, 3, 7, 448.0f, false, true, false, true};
    case Fp8Format::kE5M2: return {5, 2, 15, 57344.0f, true, true, false, false};
    case Fp8Format::kE4M3Fnuz: return {4, 3, 8, 240.0f, false, false, true, false};
    case Fp8Format::kE5M2Fnuz: return {5, 2, 16, 57344.0f, false, false, true, false};
  }
  return {4, 3, 7, 448.0f, false, true, false, true};
}

// The code an encode gives for NaN of the given sign (0 or 0x80).
PRIMUS_HOST_DEVICE constexpr uint8_t fp8_nan_code(Fp8Format format, uint8_t sign) {
  const Fp8FormatInfo f = fp8_info(format);
  return f.nan_is_0x80 ? uint8_t{0x80} : static_cast<uint8_t>(sign | 0x7F);
}

PRIMUS_HOST_DEVICE inline bool fp8_is_nan(uint8_t code, Fp8Format format) {
  const Fp8FormatInfo f = fp8_info(format);
  if (f.nan_is_0x80) return code == 0x80;
  const uint8_t magnitude = code & 0x7F;
  if (f.nan_needs_full_mantissa) return magnitude == 0x7F;
  const uint8_t exponent_ones = static_cast<uint8_t>(((1u << f.exponent_bits) - 1u) << f.mantissa_bits);
  return (magnitude & exponent_ones) == exponent_ones && (magnitude & ~exponent_ones) != 0;
}

PRIMUS_HOST_DEVICE inline float fp8_decode(uint8_t code, Fp8Format format) {
  const Fp8FormatInfo f = fp8_info(format);
  if (fp8_is_nan(code, format)) return f32_from_bits(0x7FC00000u | (f.nan_is_0x80 ? 0u : (code & 0x80u) << 24));
  const bool negative = (code & 0x80) != 0;
  const int exponent = (code & 0x7F) >> f.mantissa_bits;
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  float magnitude;
  if (f.has_infinity && exponent == (1 << f.exponent_bits) - 1) {
    magnitude = f32_from_bits(0x7F800000u);
  } else if (exponent == 0) {
    magnitude = ldexpf(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
  } else {
    magnitude = ldexpf(static_cast<float>((1 << f.mantissa_bits) + mantissa), exponent - f.bias - f.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

PRIMUS_HOST_DEVICE inline uint8_t fp8_encode(float x, Fp8Format format, bool saturate = true) {
  const Fp8FormatInfo f = fp8_info(format);
  const uint32_t bits = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return fp8_nan_code(format, sign);
  // The sign of a result that is zero: the fnuz formats have only +0.
  const uint8_t zero_sign = f.has_negative_zero ? sign : uint8_t{0};
  const uint8_t max_code = static_cast<uint8_t>(
      f.nan_is_0x80 || f.has_infinity ? ((((1 << f.exponent_bits) - (f.has_infinity ? 2 : 1)) << f.mantissa_bits) |
                                         ((1 << f.mantissa_bits) - 1))
                                      : 0x7E);
  auto overflow = [&]() -> uint8_t {
    if (saturate) return static_cast<uint8_t>(sign | max_code);
    if (f.has_infinity) return static_cast<uint8_t>(sign | (((1 << f.exponent_bits) - 1) << f.mantissa_bits));
    return fp8_nan_code(format, sign);
  };
  if (abs_bits == 0x7F800000u) return overflow();
  const float a = f32_from_bits(abs_bits);
  const int min_exponent = 1 - f.bias;  // of the smallest normal; subnormals share its quantum
  // floor(log2 a) from the f32 exponent field; f32 subnormals lie far below every fp8 quantum and round to 0.
  const int a_exponent = static_cast<int>(abs_bits >> 23) - 127;
  const int exponent = a_exponent < min_exponent ? min_exponent : a_exponent;
  // a / quantum is exact (a power-of-two scaling) and below 2^(mantissa_bits + 1), so rintf (round to nearest,
  // ties to even, the default mode) rounds it exactly once.
  const float steps = rintf(ldexpf(a, f.mantissa_bits - exponent));
  if (steps == 0.0f) return zero_sign;
  const float rounded = ldexpf(steps, exponent - f.mantissa_bits);
  if (rounded > f.max_finite) return overflow();
  // Re-read the exponent: rounding may have carried into the next binade (or from subnormal into normal).
  const int r_exponent = static_cast<int>(f32_bits(rounded) >> 23) - 127;
  uint32_t field, mantissa;
  if (r_exponent < min_exponent) {
    field = 0;
    mantissa = static_cast<uint32_t>(steps);
  } else {
    field = static_cast<uint32_t>(r_exponent + f.bias);
    mantissa = static_cast<uint32_t>(ldexpf(rounded, f.mantissa_bits - r_exponent)) - (1u << f.mantissa_bits);
  }
  return static_cast<uint8_t>(sign | (field << f.mantissa_bits) | mantissa);
}

// Per-tensor (or per-tile) scaling, Transformer Engine's rule: scale = (max_finite / amax) / 2^margin, computed in
// f32 as two divisions; scale_inv = 1 / scale. An amax that is zero or not finite (NaN, infinity) gives no scale:
// the tensor keeps `fallback` (the previous scale in the delayed recipe, 1 in current scaling) and the result says
// so, for the caller to report; it is never clamped into a finite amax. A scale that overflows f32 (amax far below
// max_finite) becomes FLT_MAX. power_of_two rounds the scale down to a power of two (keeps its exponent), which
// makes scale_inv exact: Transformer Engine's default for its block-scaling recipe.
enum class Fp8AmaxState : uint8_t { kOk, kZero, kNonFinite };

struct Fp8Scale {
  float scale;
  Fp8AmaxState state;
};

PRIMUS_HOST_DEVICE inline Fp8Scale fp8_scale_from_amax(float amax, float max_finite, int margin, float fallback,
                                                       bool power_of_two = false) {
  if ((f32_bits(amax) & 0x7F800000u) == 0x7F800000u) return {fallback, Fp8AmaxState::kNonFinite};  // NaN, ±inf
  if (amax == 0.0f) return {fallback, Fp8AmaxState::kZero};
  float scale = max_finite / amax;
  scale = scale / ldexpf(1.0f, margin);
  if (f32_bits(scale) == 0x7F800000u) scale = f32_from_bits(0x7F7FFFFFu);
  if (power_of_two) scale = f32_from_bits(f32_bits(scale) & 0xFF800000u);
  return {scale, Fp8AmaxState::kOk};
}

// Names as configs and docs write them ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz").
const char* fp8_format_name(Fp8Format format);
// Throws UsageError for an unknown name.
Fp8Format fp8_format_from_name(std::string_view name);

}  // namespace primus
