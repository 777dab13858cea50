// core/fp8.h against an independent model of each format written here in double: the value of every one of the 256
// codes from the format's definition (sign, exponent field, mantissa field, bias), and the encoding of a value as the
// nearest of those values found by search over all codes, ties to the code with an even mantissa, with overflow
// and saturation decided from the largest finite value. Nothing here calls the bit manipulations under test to
// build the expectations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "core/rng.h"

namespace primus {
namespace {

struct Spec {
  Fp8Format format;
  const char* name;
  int exponent_bits, mantissa_bits, bias;
  double max_finite;
  bool fnuz;          // no infinities, no negative zero, 0x80 the only NaN
  bool ieee_special;  // e5m2: the all-ones exponent holds infinity and NaNs
};

const Spec kSpecs[] = {
    {Fp8Format::kE4M3, "e4m3", 4, 3, 7, 448.0, false, false},
    {Fp8Format::kE5M2, "e5m2", 5, 2, 15, 57344.0, false, true},
    {Fp8Format::kE4M3Fnuz, "e4m3fnuz", 4, 3, 8, 240.0, true, false},
    {Fp8Format::kE5M2Fnuz, "e5m2fnuz", 5, 2, 16, 57344.0, true, false},
};

// The value a code stands for, from the format's definition; NaN for NaN codes.
double spec_value(const Spec& s, int code) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (s.fnuz && code == 0x80) return nan;
  const int sign = code >> 7;
  const int e = (code >> s.mantissa_bits) & ((1 << s.exponent_bits) - 1);
  const int m = code & ((1 << s.mantissa_bits) - 1);
  const int e_max = (1 << s.exponent_bits) - 1;
  const int m_max = (1 << s.mantissa_bits) - 1;
  double magnitude;
  if (s.ieee_special && e == e_max) {
    if (m != 0) return nan;
    magnitude = std::numeric_limits<double>::infinity();
  } else if (!s.fnuz && !s.ieee_special && e == e_max && m == m_max) {
    return nan;  // OCP e4m3: S.1111.111
  } else if (e == 0) {
    magnitude = std::pow(2.0, 1 - s.bias) * (m / std::pow(2.0, s.mantissa_bits));
  } else {
    magnitude = std::pow(2.0, e - s.bias) * (1.0 + m / std::pow(2.0, s.mantissa_bits));
  }
  return sign ? -magnitude : magnitude;
}

// spec_value of every code of a format, computed once.
const std::vector<double>& spec_table(const Spec& s) {
  static std::vector<double> tables[4];
  std::vector<double>& table = tables[static_cast<int>(s.format)];
  if (table.empty()) {
    for (int c = 0; c < 256; ++c) table.push_back(spec_value(s, c));
  }
  return table;
}

// The code the spec gives for x (rounded to nearest, ties to an even mantissa; overflow past max_finite), by search.
int spec_encode(const Spec& s, double x, bool saturate) {
  const std::vector<double>& value = spec_table(s);
  const bool negative = std::signbit(x);
  if (std::isnan(x)) return s.fnuz ? 0x80 : (negative ? 0xFF : 0x7F);
  const double a = std::fabs(x);
  const int sign_bit = negative ? 0x80 : 0;
  int max_code = -1;
  for (int c = 0; c < 0x80; ++c) {
    if (std::isfinite(value[c]) && (max_code < 0 || value[c] > value[max_code])) max_code = c;
  }
  auto overflow = [&] {
    if (saturate) return sign_bit | max_code;
    if (s.ieee_special) return sign_bit | 0x7C;  // infinity
    return s.fnuz ? 0x80 : (sign_bit | 0x7F);
  };
  if (std::isinf(a)) return overflow();
  // Past max_finite: overflow beyond the half-way point to the next (unrepresentable) step, and at it when the
  // tie goes to the next step, which is even exactly when max_finite's mantissa is odd.
  const double step = value[max_code] - value[max_code - 1];
  const double half_way = s.max_finite + step / 2;
  if (a > half_way || (a == half_way && (max_code & 1))) return overflow();
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x80; ++c) {
    const double v = value[c];
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - a);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  if (best == 0 && s.fnuz) return 0;  // no negative zero
  return sign_bit | best;
}

bool same_or_both_nan(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(Fp8Format, InfoMatchesTheSpecs) {
  for (const Spec& s : kSpecs) {
    const Fp8FormatInfo info = fp8_info(s.format);
    EXPECT_EQ(info.exponent_bits, s.exponent_bits) << s.name;
    EXPECT_EQ(info.mantissa_bits, s.mantissa_bits) << s.name;
    EXPECT_EQ(info.bias, s.bias) << s.name;
    EXPECT_EQ(info.max_finite, s.max_finite) << s.name;
    EXPECT_EQ(info.has_negative_zero, !s.fnuz) << s.name;
    EXPECT_EQ(info.has_infinity, s.ieee_special) << s.name;
    EXPECT_EQ(fp8_format_from_name(s.name), s.format);
    EXPECT_STREQ(fp8_format_name(s.format), s.name);
  }
  EXPECT_THROW(fp8_format_from_name("e3m4"), UsageError);
}

// Landmarks stated by the specs, independent of the search model above.
TEST(Fp8Format, KnownValues) {
  EXPECT_EQ(fp8_decode(0x7E, Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::kE4M3), 0x1p-9f);
  EXPECT_EQ(fp8_decode(0x08, Fp8Format::kE4M3), 0x1p-6f);
  EXPECT_EQ(fp8_decode(0x38, Fp8Format::kE4M3), 1.0f);
  EXPECT_TRUE(std::isnan(fp8_decode(0x7F, Fp8Format::kE4M3)));
  EXPECT_EQ(fp8_decode(0x7B, Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(fp8_decode(0x7C, Fp8Format::kE5M2), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_decode(0xFC, Fp8Format::kE5M2), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::kE5M2), 0x1p-16f);
  EXPECT_EQ(fp8_decode(0x3C, Fp8Format::kE5M2), 1.0f);
  EXPECT_EQ(fp8_decode(0x7F, Fp8Format::kE4M3Fnuz), 240.0f);
  EXPECT_EQ(fp8_decode(0x40, Fp8Format::kE4M3Fnuz), 1.0f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::kE4M3Fnuz), 0x1p-10f);
  EXPECT_EQ(fp8_decode(0x7F, Fp8Format::kE5M2Fnuz), 57344.0f);
  EXPECT_EQ(fp8_decode(0x40, Fp8Format::kE5M2Fnuz), 1.0f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::kE5M2Fnuz), 0x1p-17f);
  EXPECT_TRUE(std::isnan(fp8_decode(0x80, Fp8Format::kE4M3Fnuz)));
  EXPECT_TRUE(std::isnan(fp8_decode(0x80, Fp8Format::kE5M2Fnuz)));
  EXPECT_TRUE(std::signbit(fp8_decode(0x80, Fp8Format::kE4M3)));  // -0 in the OCP formats
}

TEST(Fp8Format, EveryCodeDecodesToItsValueAndEncodesBack) {
  for (const Spec& s : kSpecs) {
    int nans = 0;
    for (int code = 0; code < 256; ++code) {
      const double want = spec_value(s, code);
      const float got = fp8_decode(static_cast<uint8_t>(code), s.format);
      ASSERT_TRUE(same_or_both_nan(got, want)) << s.name << " code " << code << ": " << got << " vs " << want;
      EXPECT_EQ(std::isnan(want), fp8_is_nan(static_cast<uint8_t>(code), s.format)) << s.name << " code " << code;
      if (std::isnan(want)) {
        ++nans;
        continue;
      }
      if (!std::isinf(want)) {
        EXPECT_EQ(fp8_encode(got, s.format, true), code) << s.name << " code " << code;
        EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << s.name << " code " << code;
      }
      EXPECT_EQ(fp8_encode(got, s.format, false), code) << s.name << " code " << code;
    }
    EXPECT_EQ(nans, s.fnuz ? 1 : (s.ieee_special ? 6 : 2)) << s.name;
  }
}

// Each value checked against the search model, saturating and not.
void expect_encodes_like_spec(const Spec& s, float x) {
  for (bool saturate : {true, false}) {
    const int want = spec_encode(s, x, saturate);
    const int got = fp8_encode(x, s.format, saturate);
    if (std::isnan(spec_value(s, want))) {
      ASSERT_TRUE(fp8_is_nan(static_cast<uint8_t>(got), s.format))
          << s.name << " " << x << (saturate ? " saturating" : "") << ": code " << got;
    } else {
      ASSERT_EQ(got, want) << s.name << " " << std::hexfloat << x << (saturate ? " saturating" : "");
    }
  }
}

// Half-way points between neighbouring values (ties, both ways: even below and even above), one f32 step either
// side of each, the values themselves, their negatives, and the region past max_finite.
TEST(Fp8Format, RoundsToNearestEvenOnEveryBoundary) {
  for (const Spec& s : kSpecs) {
    std::vector<double> values;
    for (int c = 0; c < 0x80; ++c) {
      if (std::isfinite(spec_value(s, c))) values.push_back(spec_value(s, c));
    }
    std::sort(values.begin(), values.end());
    const double step = values.back() - values[values.size() - 2];
    values.push_back(values.back() + step);  // the first unrepresentable step: its half-way point decides overflow
    values.push_back(values.back() + step);
    int ties = 0;
    for (size_t i = 0; i + 1 < values.size(); ++i) {
      const float lo = static_cast<float>(values[i]);
      const float mid = static_cast<float>((values[i] + values[i + 1]) / 2);
      ASSERT_EQ(static_cast<double>(mid), (values[i] + values[i + 1]) / 2) << "half-way point not exact in f32";
      for (const float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
        expect_encodes_like_spec(s, x);
        expect_encodes_like_spec(s, -x);
      }
      ++ties;
    }
    EXPECT_GT(ties, 120) << s.name;
    // Both tie directions occur: half-way up to the next code and half-way down to this one.
    EXPECT_EQ(fp8_encode(static_cast<float>((values[1] + values[2]) / 2), s.format), 2) << s.name;  // 1.5 q -> 2 q
    EXPECT_EQ(fp8_encode(static_cast<float>((values[2] + values[3]) / 2), s.format), 2) << s.name;  // 2.5 q -> 2 q
  }
}

TEST(Fp8Format, SubnormalsAndUnderflow) {
  for (const Spec& s : kSpecs) {
    const double tiny = spec_value(s, 1);
    EXPECT_EQ(fp8_encode(static_cast<float>(tiny / 2), s.format), 0) << s.name;  // tie to zero (even)
    EXPECT_EQ(fp8_encode(std::nextafter(static_cast<float>(tiny / 2), 1.0f), s.format), 1) << s.name;
    EXPECT_EQ(fp8_encode(static_cast<float>(tiny * 0.75), s.format), 1) << s.name;
    EXPECT_EQ(fp8_encode(1e-30f, s.format), 0) << s.name;
    EXPECT_EQ(fp8_encode(std::numeric_limits<float>::denorm_min(), s.format), 0) << s.name;
    // A negative value rounding to zero: -0 where the format has it, +0 in the fnuz formats (0x80 is NaN there).
    EXPECT_EQ(fp8_encode(static_cast<float>(-tiny / 4), s.format), s.fnuz ? 0x00 : 0x80) << s.name;
    EXPECT_EQ(fp8_encode(-0.0f, s.format), s.fnuz ? 0x00 : 0x80) << s.name;
  }
}

TEST(Fp8Format, SaturationOverflowAndNaN) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const Spec& s : kSpecs) {
    const float max = static_cast<float>(s.max_finite);
    for (const float x : {max * 1.2f, 1e30f, inf}) {
      EXPECT_EQ(fp8_decode(fp8_encode(x, s.format, true), s.format), max) << s.name << " " << x;
      EXPECT_EQ(fp8_decode(fp8_encode(-x, s.format, true), s.format), -max) << s.name << " " << x;
      const float unsaturated = fp8_decode(fp8_encode(x, s.format, false), s.format);
      if (s.ieee_special) {
        EXPECT_EQ(unsaturated, inf) << s.name << " " << x;
      } else {
        EXPECT_TRUE(std::isnan(unsaturated)) << s.name << " " << x;
      }
    }
    for (bool saturate : {true, false}) {
      EXPECT_TRUE(fp8_is_nan(fp8_encode(nan, s.format, saturate), s.format)) << s.name;
      EXPECT_TRUE(fp8_is_nan(fp8_encode(-nan, s.format, saturate), s.format)) << s.name;
    }
  }
}

TEST(Fp8Format, RandomValuesAcrossTheRange) {
  Rng rng(20261205);
  for (const Spec& s : kSpecs) {
    for (int i = 0; i < 20000; ++i) {
      // Log-uniform magnitudes from far below the smallest subnormal to far past max_finite.
      const double magnitude = std::exp2(-24.0 + 44.0 * rng.uniform());
      expect_encodes_like_spec(s, static_cast<float>(rng.uniform() < 0.5 ? -magnitude : magnitude));
    }
  }
}

TEST(Fp8Scale, TransformerEngineRules) {
  const float max = 448.0f;
  Fp8Scale s = fp8_scale_from_amax(3.5f, max, 0, 1.0f);
  EXPECT_EQ(s.state, Fp8AmaxState::kOk);
  EXPECT_EQ(s.scale, 448.0f / 3.5f);
  s = fp8_scale_from_amax(3.0f, max, 2, 1.0f);
  EXPECT_EQ(s.scale, (448.0f / 3.0f) / 4.0f);
  s = fp8_scale_from_amax(0.0f, max, 0, 7.0f);
  EXPECT_EQ(s.state, Fp8AmaxState::kZero);
  EXPECT_EQ(s.scale, 7.0f);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    s = fp8_scale_from_amax(bad, max, 0, 5.0f);
    EXPECT_EQ(s.state, Fp8AmaxState::kNonFinite);
    EXPECT_EQ(s.scale, 5.0f);
  }
  s = fp8_scale_from_amax(1e-44f, max, 0, 1.0f);  // 448 / 1e-44 overflows f32
  EXPECT_EQ(s.scale, std::numeric_limits<float>::max());
  s = fp8_scale_from_amax(3.0f, max, 0, 1.0f, true);
  EXPECT_EQ(s.scale, 128.0f);  // 149.33 down to a power of two
}

}  // namespace
}  // namespace primus
