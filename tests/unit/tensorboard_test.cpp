// tfevents files: the Event bytes of FORMATS.md's worked example, and a file written by TensorBoardWriter
// read back by a reader written here from the format description (framing, masked CRC32C, protobuf).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core/file_io.h"
#include "observe/tensorboard.h"
#include "support/test_support.h"

namespace primus {
namespace {

TEST(TensorBoard, ScalarEventMatchesTheWorkedExample) {
  const std::string bytes = tfevent_scalar(1700000000.5, 100, "loss", 2.5f);
  const unsigned char expected[] = {0x09, 0x00, 0x00, 0x20, 0x40, 0xFC, 0x54, 0xD9, 0x41, 0x10, 0x64, 0x2A, 0x0D,
                                    0x0A, 0x0B, 0x0A, 0x04, 0x6C, 0x6F, 0x73, 0x73, 0x15, 0x00, 0x00, 0x20, 0x40};
  ASSERT_EQ(bytes.size(), sizeof(expected));
  EXPECT_EQ(std::memcmp(bytes.data(), expected, sizeof(expected)), 0);
}

uint64_t read_varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s.at(pos++));
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

struct Scalar {
  int64_t step = -1;
  std::string tag;
  float value = 0;
};

// Field walker over one Event: returns step, file_version, and the first summary value.
Scalar parse_event(const std::string& event, std::string& file_version) {
  Scalar out;
  size_t pos = 0;
  while (pos < event.size()) {
    const uint64_t key = read_varint(event, pos);
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (wire == 1) {
      pos += 8;
    } else if (wire == 0) {
      const uint64_t v = read_varint(event, pos);
      if (field == 2) out.step = static_cast<int64_t>(v);
    } else if (wire == 2) {
      const uint64_t n = read_varint(event, pos);
      const std::string body = event.substr(pos, n);
      pos += n;
      if (field == 3) file_version = body;
      if (field == 5) {  // Summary { 1: Value { 1: tag, 2: simple_value } }
        size_t p = 0;
        read_varint(body, p);
        const uint64_t value_len = read_varint(body, p);
        const std::string value = body.substr(p, value_len);
        size_t q = 0;
        read_varint(value, q);
        const uint64_t tag_len = read_varint(value, q);
        out.tag = value.substr(q, tag_len);
        q += tag_len;
        EXPECT_EQ(static_cast<uint8_t>(value.at(q)), 0x15);
        std::memcpy(&out.value, value.data() + q + 1, 4);
      }
    } else {
      ADD_FAILURE() << "unexpected wire type " << wire;
      break;
    }
  }
  return out;
}

TEST(TensorBoard, WrittenFileReadsBackWithValidFramingAndCrcs) {
  const std::string dir = testing::temp_dir("tb");
  std::string path;
  {
    TensorBoardWriter writer(dir);
    path = writer.path();
    for (int step = 1; step <= 5; ++step) {
      writer.add_scalar("lm loss", 6.0 - step, step);
      writer.add_scalar("learning-rate", 1e-3 * step, step);
    }
    writer.flush();
  }
  EXPECT_NE(std::filesystem::path(path).filename().string().find("tfevents"), std::string::npos);
  const std::string bytes = read_file(path);
  size_t pos = 0;
  std::vector<Scalar> scalars;
  std::string file_version;
  while (pos < bytes.size()) {
    uint64_t length;
    uint32_t length_crc, data_crc;
    std::memcpy(&length, bytes.data() + pos, 8);
    std::memcpy(&length_crc, bytes.data() + pos + 8, 4);
    ASSERT_EQ(length_crc, masked_crc32c(bytes.data() + pos, 8)) << "at " << pos;
    const std::string payload = bytes.substr(pos + 12, length);
    std::memcpy(&data_crc, bytes.data() + pos + 12 + length, 4);
    ASSERT_EQ(data_crc, masked_crc32c(payload.data(), payload.size())) << "at " << pos;
    pos += 12 + length + 4;
    Scalar s = parse_event(payload, file_version);
    if (!s.tag.empty()) scalars.push_back(s);
  }
  EXPECT_EQ(file_version, "brain.Event:2");
  ASSERT_EQ(scalars.size(), 10u);
  EXPECT_EQ(scalars[0].tag, "lm loss");
  EXPECT_EQ(scalars[0].step, 1);
  EXPECT_FLOAT_EQ(scalars[0].value, 5.0f);
  EXPECT_EQ(scalars[9].tag, "learning-rate");
  EXPECT_EQ(scalars[9].step, 5);
  EXPECT_FLOAT_EQ(scalars[9].value, 5e-3f);
}

}  // namespace
}  // namespace primus
