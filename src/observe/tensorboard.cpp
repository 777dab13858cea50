#include "observe/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian on the x86-64/ARM hosts we build for
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  out.push_back(static_cast<char>(field << 3 | 2));  // wire type 2: length-delimited
  put_varint(out, bytes.size());
  out += bytes;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string tfevent_scalar(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string summary_value;
  put_bytes_field(summary_value, 1, tag);
  summary_value.push_back(static_cast<char>(2 << 3 | 5));  // simple_value: fixed32
  put_fixed(summary_value, value);
  std::string summary;
  put_bytes_field(summary, 1, summary_value);
  std::string event;
  event.push_back(static_cast<char>(1 << 3 | 1));  // wall_time: fixed64
  put_fixed(event, wall_time);
  event.push_back(static_cast<char>(2 << 3 | 0));  // step: varint
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes_field(event, 5, summary);
  return event;
}

std::string tfrecord(const std::string& payload) {
  std::string record;
  const uint64_t length = payload.size();
  put_fixed(record, length);
  put_fixed(record, masked_crc32c(record.data(), sizeof(length)));
  record += payload;
  put_fixed(record, masked_crc32c(payload.data(), payload.size()));
  return record;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double now = unix_now();
  path_ = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}.0", dir, static_cast<int64_t>(now), host, getpid());
  out_.open(path_, std::ios::binary);
  if (!out_) throw RuntimeError(fmt::format("cannot create TensorBoard file {}", path_));
  std::string first;
  first.push_back(static_cast<char>(1 << 3 | 1));
  put_fixed(first, now);
  put_bytes_field(first, 3, "brain.Event:2");
  out_ << tfrecord(first);
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  out_ << tfrecord(tfevent_scalar(unix_now(), step, tag, static_cast<float>(value)));
}

void TensorBoardWriter::flush() {
  out_.flush();
  if (!out_) throw RuntimeError(fmt::format("write to {} failed", path_));
}

}  // namespace primus
