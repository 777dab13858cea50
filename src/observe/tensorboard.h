// TensorBoard event files (tfevents): TFRecord framing with masked CRC32C around Event protobufs, written by
// hand from the format (docs FORMATS.md §3) — scalars only, which is what training curves need.
//   record = u64 LE length | u32 LE masked CRC32C(length) | payload | u32 LE masked CRC32C(payload)
//   Event  = {1: wall_time double, 2: step int64, 3: file_version string, 5: summary}
//   Summary.value = {1: tag string, 2: simple_value float}
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace primus {

// The serialized Event protobuf of one scalar (exposed for tests).
std::string tfevent_scalar(double wall_time, int64_t step, const std::string& tag, float value);
// A TFRecord frame around `payload`.
std::string tfrecord(const std::string& payload);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events.out.tfevents.<unix seconds>.<host>.<pid>.0 file in it, starting with the
  // file_version event. Throws RuntimeError when the file cannot be written.
  explicit TensorBoardWriter(const std::string& dir);
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace primus
