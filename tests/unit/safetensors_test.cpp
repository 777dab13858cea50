// checkpoint/safetensors and core/bf16: round trips over every dtype we write, the reference writer's ordering
// and padding, a byte-exact file, every corruption the reader must refuse, and exact 16-bit float rounding.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "support/test_support.h"

// gtest-only substring check (the tests do not link gmock).
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

namespace primus {
namespace {

std::vector<unsigned char> random_bytes(size_t n, Rng& rng) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng.next_u64());
  return v;
}

// memcmp, but fine with the null data() of an empty vector.
bool same_bytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A file assembled by hand: length prefix, header text exactly as given, data bytes.
std::string hand_file(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

// -------------------------------------------------------------------------------------------------------
// bf16 / f16

TEST(Bf16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(f32_bits(f), h << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f)))) << h;
    } else {
      ASSERT_EQ(f32_to_bf16(f), h) << h;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F808000u)), 0x3F80u);  // tie, lower is even
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F818000u)), 0x3F82u);  // tie, upper is even
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F808001u)), 0x3F81u);  // just above the tie
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F807FFFu)), 0x3F80u);  // just below the tie
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0xBF818000u)), 0xBF82u);  // sign does not matter
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7F7FFFFFu)), 0x7F80u);  // f32 max rounds to +inf
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7F7F7FFFu)), 0x7F7Fu);  // bf16 max stays finite
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00008000u)), 0x0000u);  // subnormal tie to even zero
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x00018000u)), 0x0002u);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000u);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80u);

  // Against a nearest-value search in double precision over random finite floats.
  Rng rng(31);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng.next_u64());
    float f = f32_from_bits(u);
    if (!std::isfinite(f)) continue;
    uint16_t lo = static_cast<uint16_t>(u >> 16);
    uint16_t hi = static_cast<uint16_t>(lo + 1);  // next away from zero; rounding treats inf as 2^128
    double vhi = (hi & 0x7FFFu) == 0x7F80u ? std::copysign(0x1p128, f) : bf16_to_f32(hi);
    double dlo = std::fabs(f - static_cast<double>(bf16_to_f32(lo)));
    double dhi = std::fabs(f - vhi);
    uint16_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(f32_to_bf16(f), want) << std::hex << u;
  }
}

TEST(Bf16, NanStaysNan) {
  for (uint32_t u : {0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0xFF800001u, 0x7F80FFFFu}) {
    uint16_t h = f32_to_bf16(f32_from_bits(u));
    EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << u;
    EXPECT_EQ(h & 0x8000u, (u >> 16) & 0x8000u) << "sign kept";
  }
}

TEST(F16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    bool nan_bits = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0;
    EXPECT_EQ(std::isnan(f), nan_bits) << h;
    if (nan_bits) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << h;
    }
  }
}

TEST(F16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00u);
  EXPECT_EQ(f32_to_f16(0.1f), 0x2E66u);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000u);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFFu);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFFu);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00u);  // tie between max and 2^16 goes to the even one: inf
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001u);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000u);    // tie to even zero
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002u);  // tie to even 2
  EXPECT_EQ(f32_to_f16(0x1.000002p-25f), 0x0001u);
  EXPECT_EQ(f32_to_f16(0x1.ff8p-15f), 0x03FFu);  // the largest subnormal, exact
  EXPECT_EQ(f32_to_f16(0x1.ffep-15f), 0x0400u);  // just above it rounds up into the smallest normal
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00u);

  // Against a search over the (monotone in bit pattern) positive f16 values.
  std::vector<float> positives;
  for (uint32_t h = 0; h <= 0x7C00u; ++h) positives.push_back(f16_to_f32(static_cast<uint16_t>(h)));
  Rng rng(32);
  for (int i = 0; i < 200000; ++i) {
    // Exponents from deep subnormal to beyond the f16 range.
    float mag = static_cast<float>(std::ldexp(1.0 + rng.uniform(), static_cast<int>(rng.below(48)) - 30));
    // Force exact half-way cases (for normal f16 results) and exactly representable values now and then.
    if (i % 5 == 0) mag = f32_from_bits((f32_bits(mag) & 0xFFFFE000u) | 0x1000u);
    if (i % 7 == 0) mag = f32_from_bits(f32_bits(mag) & 0xFFFFE000u);
    auto it = std::upper_bound(positives.begin(), positives.end(), mag);
    uint16_t lo = static_cast<uint16_t>(it - positives.begin() - 1);
    uint16_t want = lo;
    if (lo < 0x7C00u && positives[lo] != mag) {
      double dlo = static_cast<double>(mag) - positives[lo];
      double dhi = static_cast<double>(positives[lo + 1]) - mag;
      if (lo == 0x7BFFu) dhi = 65536.0 - mag;  // rounding treats inf as 2^16
      want = dlo < dhi ? lo : dhi < dlo ? static_cast<uint16_t>(lo + 1) : ((lo & 1) ? lo + 1 : lo);
    }
    float f = rng.below(2) ? -mag : mag;
    ASSERT_EQ(f32_to_f16(f), static_cast<uint16_t>(want | (f < 0 ? 0x8000u : 0u))) << mag;
  }
}

// -------------------------------------------------------------------------------------------------------
// Writer and reader

struct Sample {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<unsigned char> bytes;
};

std::vector<Sample> sample_tensors(Rng& rng) {
  std::vector<Sample> s = {
      {"model.layers.0.mlp.up_proj.weight", DType::kF32, {3, 5}, {}},
      {"model.embed_tokens.weight", DType::kBF16, {4, 7}, {}},
      {"lm_head.weight", DType::kF16, {2, 3, 2}, {}},
      {"positions", DType::kI32, {9}, {}},
      {"step", DType::kI64, {2, 2}, {}},
      {"mask", DType::kU8, {13}, {}},
      {"scale", DType::kF32, {}, {}},            // rank 0: one element
      {"empty_f32", DType::kF32, {0, 4}, {}},    // zero elements
      {"empty_bf16", DType::kBF16, {3, 0}, {}},  // zero elements
  };
  for (Sample& t : s) {
    t.bytes = random_bytes(static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype), rng);
    if (t.dtype == DType::kF32) {  // finite values so comparisons are exact and meaningful
      for (size_t i = 0; i < t.bytes.size(); i += 4) {
        float v = static_cast<float>(rng.normal());
        std::memcpy(&t.bytes[i], &v, 4);
      }
    }
  }
  return s;
}

TEST(Safetensors, RoundTripsEveryDtypeAndShape) {
  Rng rng(41);
  std::vector<Sample> samples = sample_tensors(rng);
  std::string dir = testing::temp_dir("st");
  std::string path = dir + "/model.safetensors";
  SafetensorsWriter w;
  for (const Sample& t : samples) w.add(t.name, t.dtype, t.shape, t.bytes.data());
  w.add_metadata("step", "1200");
  w.write(path);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1)
      << "only the committed file, no temporary";

  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.entries().size(), samples.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "1200");
  for (const Sample& t : samples) {
    const SafetensorsEntry* e = f.find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, safetensors_dtype_name(t.dtype));
    EXPECT_EQ(e->shape, t.shape);
    ASSERT_EQ(e->nbytes, t.bytes.size());
    EXPECT_TRUE(same_bytes(e->data, t.bytes.data(), t.bytes.size())) << t.name;
    EXPECT_EQ(e->data_offset % dtype_size(t.dtype), 0u) << t.name << ": padding and ordering keep data aligned";
    Tensor native = f.read(t.name);
    EXPECT_EQ(native.dtype(), t.dtype);
    EXPECT_EQ(native.shape(), t.shape);
    EXPECT_TRUE(same_bytes(native.data(), t.bytes.data(), t.bytes.size())) << t.name;
  }
  EXPECT_EQ(f.find("absent"), nullptr);

  Tensor w32 = f.read_f32("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(0, std::memcmp(w32.data(), samples[0].bytes.data(), samples[0].bytes.size()));
  Tensor scale = f.read_f32("scale");
  EXPECT_EQ(scale.ndim(), 0);
  EXPECT_EQ(scale.numel(), 1);
  for (int which : {1, 2}) {
    const Sample& t = samples[which];
    Tensor x = f.read_f32(t.name);
    ASSERT_EQ(x.shape(), t.shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      uint16_t h;
      std::memcpy(&h, &t.bytes[2 * i], 2);
      float want = t.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(x.f32()[i]));
      } else {
        EXPECT_EQ(f32_bits(x.f32()[i]), f32_bits(want)) << t.name << "[" << i << "]";
      }
    }
  }
  EXPECT_EQ(f.read_f32("empty_bf16").numel(), 0);
}

TEST(Safetensors, WritesReferenceOrderAndPadding) {
  Rng rng(42);
  std::vector<Sample> samples = sample_tensors(rng);
  SafetensorsWriter w;
  for (const Sample& t : samples) w.add(t.name, t.dtype, t.shape, t.bytes.data());
  std::string path = testing::temp_dir("st") + "/ordered.safetensors";
  w.write(path);
  std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.substr(8, n), w.header());
  EXPECT_EQ(bytes.substr(8, 16), "{\"__metadata__\":");
  std::string head = bytes.substr(8, n);
  size_t close = head.find_last_of('}');
  EXPECT_EQ(head.find_first_not_of(' ', close + 1), std::string::npos) << "padding is spaces";
  EXPECT_LT(n - close - 1, 8u) << "no more padding than needed";

  // Wider dtypes first in the reference enum order (I64 > F32 > I32 > BF16 > F16 > U8), names ascending within.
  std::vector<std::string> expected = {"step",      "empty_f32",  "model.layers.0.mlp.up_proj.weight", "scale",
                                       "positions", "empty_bf16", "model.embed_tokens.weight",         "lm_head.weight",
                                       "mask"};
  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<std::string> names;
  for (const auto& e : f.entries()) names.push_back(e.name);
  EXPECT_EQ(names, expected);
  size_t last = 0;
  for (const std::string& name : expected) {
    size_t at = w.header().find("\"" + name + "\":{");
    ASSERT_NE(at, std::string::npos) << name;
    EXPECT_GT(at, last) << name << " is out of order in the header";
    last = at;
  }
}

TEST(Safetensors, ByteExactTinyFile) {
  const float values[6] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  SafetensorsWriter w;
  w.add("attn.0", DType::kF32, {1, 2, 3}, values);
  std::string path = testing::temp_dir("st") + "/tiny.safetensors";
  w.write(path);
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}"
      " ";  // 95 bytes of JSON + 1 space = 96
  const unsigned char data[24] = {0, 0, 0,    0,    0, 0, 0x80, 0x3F, 0, 0, 0,    0x40,
                                  0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40, 0, 0, 0xA0, 0x40};
  std::string expected =
      std::string("\x60\0\0\0\0\0\0\0", 8) + header + std::string(reinterpret_cast<const char*>(data), 24);
  EXPECT_EQ(slurp(path), expected);

  // A file written by someone else: no metadata, no padding, so the data is not aligned.
  std::string other = hand_file("{\"t\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}",
                                std::string("\x80\x3F\x00\xC0\xC0\x7F", 6));
  std::string other_path = testing::temp_dir("st") + "/other.safetensors";
  spit(other_path, other);
  SafetensorsFile f = SafetensorsFile::open(other_path);
  EXPECT_TRUE(f.metadata().empty());
  Tensor t = f.read_f32("t");
  EXPECT_EQ(t.f32()[0], 1.0f);
  EXPECT_EQ(t.f32()[1], -2.0f);
  EXPECT_TRUE(std::isnan(t.f32()[2]));
}

TEST(Safetensors, WriterRejectsBadNames) {
  float x = 1.0f;
  SafetensorsWriter w;
  w.add("a", DType::kF32, {}, &x);
  EXPECT_THROW(w.add("a", DType::kF32, {}, &x), RuntimeError);
  EXPECT_THROW(w.add("__metadata__", DType::kF32, {}, &x), RuntimeError);
  EXPECT_THROW(w.add(std::string("bad\xFF"), DType::kF32, {}, &x), RuntimeError);
}

TEST(Safetensors, WriterKeepsTensorAlive) {
  Rng rng(43);
  std::string path = testing::temp_dir("st") + "/alive.safetensors";
  Tensor copy;
  SafetensorsWriter w;
  {
    Tensor t = testing::random_tensor({4, 6}, rng);
    copy = Tensor::empty({4, 6}, DType::kF32);
    copy.copy_from(t);
    w.add("w", t);
  }
  w.write(path);
  Tensor back = SafetensorsFile::open(path).read_f32("w");
  EXPECT_EQ(testing::max_abs_diff(back, copy), 0.0);
}

// Each corrupt file must be refused with a RuntimeError naming the file and the offending number.
void expect_corrupt(const std::string& bytes, const std::string& part, const std::string& label) {
  std::string path = testing::temp_dir("stbad") + "/" + label + ".safetensors";
  spit(path, bytes);
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << label << ": opened a corrupt file";
  } catch (const RuntimeError& e) {
    EXPECT_CONTAINS(e.what(), path);
    EXPECT_CONTAINS(e.what(), part);
  }
}

const char* kTwoTensors =
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
    "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]}}";

TEST(Safetensors, RejectsCorruptFiles) {
  const std::string data12(12, '\x11');
  const std::string good = hand_file(kTwoTensors, data12);
  std::string ok_path = testing::temp_dir("stok") + "/ok.safetensors";
  spit(ok_path, good);
  ASSERT_EQ(SafetensorsFile::open(ok_path).entries().size(), 2u) << "the uncorrupted file must open";

  expect_corrupt(good.substr(0, good.size() - 3), "data ends at offset", "truncated");
  expect_corrupt(good.substr(0, good.size() - 3), std::to_string(good.size() - 3), "truncated_size");
  expect_corrupt(std::string("\x05\0\0", 3), "3 bytes", "tiny");
  expect_corrupt(u64_le(9999999999ull) + good.substr(8), "header length 9999999999 at offset 0 exceeds file size",
                 "header_too_long");
  expect_corrupt(good + "\x01\x02\x03\x04", "4 trailing bytes", "trailing");
  expect_corrupt(hand_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", std::string(8, 'x')),
                 "does not parse", "bad_json");
  expect_corrupt(hand_file("{\"a\xFF\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", std::string(4, 'x')),
                 "not valid UTF-8 (byte 0xFF at offset 11)", "not_utf8");
  expect_corrupt(hand_file("[1,2]", ""), "expected an object", "not_object");
  expect_corrupt(hand_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                           data12),
                 "bytes [4, 8) before tensor 'b'", "gap");
  expect_corrupt(hand_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", std::string(8, 'x')),
                 "bytes [0, 4)", "gap_at_start");
  expect_corrupt(hand_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                           data12),
                 "tensor 'b' data_offsets [4, 12] overlap tensor 'a' which ends at 8", "overlap");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", data12),
                 "tensor 'x' data_offsets [0, 12] but 2x3 F32 needs 24 bytes", "wrong_bytes");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,8]}}", std::string(8, 'x')),
                 "but scalar F32 needs 4 bytes", "wrong_bytes_scalar");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}",
                           std::string(4, 'x')),
                 "[4294967296, 4294967296, 16] is too large", "overflow");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, 'x')),
                 "unknown dtype \"F99\"", "unknown_dtype");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", std::string(4, 'x')),
                 "shape [-1]", "negative_dim");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", std::string(4, 'x')), "data_offsets",
                 "no_offsets");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", std::string(4, 'x')),
                 "[4, 0] end before", "reversed");
  expect_corrupt(hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                           "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                           std::string(8, 'x')),
                 "tensor 'x' twice", "duplicate");
  expect_corrupt(hand_file("{\"__metadata__\":{\"step\":12}}", ""), "__metadata__.step", "metadata_number");
  // Found by fuzz/safetensors_fuzzer: nlohmann throws out_of_range, not parse_error, for such a number.
  expect_corrupt(
      hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[1e3016],\"data_offsets\":[0,4]}}", std::string(4, 'x')),
      "header JSON (offsets 8..", "huge_number");
  expect_corrupt(
      hand_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[1e3016],\"data_offsets\":[0,4]}}", std::string(4, 'x')),
      "holds a number outside the range of a double", "huge_number_reason");
}

TEST(Safetensors, RejectsHeaderOverLimit) {
  // A sparse file larger than the header limit, whose header length claims just over 100,000,000 bytes.
  std::string path = testing::temp_dir("stbig") + "/huge.safetensors";
  spit(path, u64_le(100000001ull) + "{}");
  std::filesystem::resize_file(path, 100000100ull);
  try {
    SafetensorsFile::open(path);
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_CONTAINS(e.what(), path);
    EXPECT_CONTAINS(e.what(), "header length 100000001 at offset 0 exceeds the limit of 100000000 bytes");
  }
}

TEST(Safetensors, ReadErrorsNameDtypeAndTensor) {
  std::string path = testing::temp_dir("st") + "/types.safetensors";
  spit(path, hand_file("{\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[4,12]}}",
                       std::string(12, '\x01')));
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.find("d")->dtype, "F64");
  try {
    f.read_f32("i");
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_CONTAINS(e.what(), "tensor 'i' has dtype I32");
    EXPECT_CONTAINS(e.what(), path);
  }
  EXPECT_THROW(f.read_f32("d"), RuntimeError);
  EXPECT_THROW(f.read("d"), RuntimeError);
  EXPECT_NO_THROW(f.read("i"));
  try {
    f.read_f32("missing");
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_CONTAINS(e.what(), "no tensor named 'missing'");
  }
  EXPECT_THROW(SafetensorsFile::open(path + ".absent"), RuntimeError);
}

TEST(Safetensors, DtypeNames) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8}) {
    EXPECT_EQ(dtype_from_safetensors(safetensors_dtype_name(d)), d);
  }
  EXPECT_FALSE(dtype_from_safetensors("F64").has_value());
  EXPECT_FALSE(dtype_from_safetensors("f32").has_value());
}

}  // namespace
}  // namespace primus
