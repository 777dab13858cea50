// Listing preprocess inputs and streaming them (plain or Zstandard-compressed).
#include "data/preprocess_input.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace primus {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;

bool is_hidden(const fs::path& path) {
  std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

InputFile classify(const fs::path& path) {
  InputFile file;
  file.path = path.string();
  std::string name = path.filename().string();
  if (name.ends_with(".zst")) {
    file.zstd = true;
    name.resize(name.size() - 4);
  }
  file.jsonl = name.ends_with(".jsonl") || name.ends_with(".json");
  std::error_code ec;
  file.size_bytes = fs::file_size(path, ec);
  return file;
}

}  // namespace

std::vector<InputFile> list_preprocess_inputs(const std::vector<std::string>& paths) {
  std::vector<InputFile> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    fs::file_status status = fs::status(path, ec);
    if (fs::is_regular_file(status)) {
      files.push_back(classify(path));
    } else if (fs::is_directory(status)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        if (is_hidden(it->path())) {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file()) found.push_back(it->path());
      }
      if (ec) throw RuntimeError(fmt::format("{}: cannot list directory: {}", path, ec.message()));
      std::sort(found.begin(), found.end());
      for (const fs::path& p : found) files.push_back(classify(p));
    } else {
      throw UsageError(fmt::format("--input: '{}' does not exist or is neither a file nor a directory", path));
    }
  }
  if (files.empty()) throw UsageError("--input: no files found in the given paths");
  return files;
}

struct InputStream::Zstd {
  Zstd() : context(ZSTD_createDCtx()), input(ZSTD_DStreamInSize()) {}
  ~Zstd() { ZSTD_freeDCtx(context); }
  ZSTD_DCtx* context;
  std::vector<char> input;
  ZSTD_inBuffer in{nullptr, 0, 0};
  size_t last_result = 0;  // 0 when the last frame was complete
};

InputStream::InputStream(const InputFile& file) : file_(file) {
  fd_ = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw RuntimeError(fmt::format("{}: cannot open: {}", file.path, std::strerror(errno)));
  if (file.zstd) {
    zstd_ = std::make_unique<Zstd>();
    if (zstd_->context == nullptr) throw RuntimeError(fmt::format("{}: cannot create a zstd context", file.path));
  }
}

InputStream::~InputStream() {
  if (fd_ >= 0) ::close(fd_);
}

size_t InputStream::read_raw(char* out, size_t n) {
  for (;;) {
    ssize_t got = ::read(fd_, out, n);
    if (got >= 0) {
      consumed_ += static_cast<uint64_t>(got);
      return static_cast<size_t>(got);
    }
    if (errno != EINTR) {
      throw RuntimeError(
          fmt::format("{}: read error at byte offset {}: {}", file_.path, consumed_, std::strerror(errno)));
    }
  }
}

bool InputStream::fill() {
  if (eof_) return false;
  if (pending_pos_ > 0) {
    pending_.erase(0, pending_pos_);
    pending_pos_ = 0;
  }
  size_t start = pending_.size();
  if (!zstd_) {
    pending_.resize(start + kChunkBytes);
    size_t got = read_raw(pending_.data() + start, kChunkBytes);
    pending_.resize(start + got);
    if (got == 0) eof_ = true;
    return got > 0;
  }
  Zstd& z = *zstd_;
  for (;;) {
    if (z.in.pos == z.in.size) {
      size_t got = read_raw(z.input.data(), z.input.size());
      if (got == 0) {
        eof_ = true;
        if (z.last_result != 0) {
          throw RuntimeError(fmt::format(
              "{}: zstd stream is truncated at byte offset {} (the last frame is incomplete)", file_.path, consumed_));
        }
        return false;
      }
      z.in = ZSTD_inBuffer{z.input.data(), got, 0};
    }
    pending_.resize(start + kChunkBytes);
    ZSTD_outBuffer out{pending_.data() + start, kChunkBytes, 0};
    size_t result = ZSTD_decompressStream(z.context, &out, &z.in);
    pending_.resize(start + out.pos);
    if (ZSTD_isError(result)) {
      throw RuntimeError(fmt::format("{}: corrupt zstd data near byte offset {}: {}", file_.path,
                                     consumed_ - (z.in.size - z.in.pos), ZSTD_getErrorName(result)));
    }
    z.last_result = result;
    if (out.pos > 0) return true;
  }
}

bool InputStream::next_line(std::string& line) {
  size_t scanned = pending_pos_;
  for (;;) {
    size_t newline = pending_.find('\n', scanned);
    if (newline != std::string::npos) {
      line.assign(pending_, pending_pos_, newline - pending_pos_);
      pending_pos_ = newline + 1;
      ++line_number_;
      return true;
    }
    size_t seen = pending_.size() - pending_pos_;
    if (!fill()) {
      if (pending_pos_ >= pending_.size()) return false;
      line.assign(pending_, pending_pos_, std::string::npos);
      pending_pos_ = pending_.size();
      ++line_number_;
      return true;
    }
    scanned = pending_pos_ + seen;  // fill() moved the unread bytes to the front
  }
}

std::string InputStream::read_all() {
  while (fill()) {
  }
  std::string rest = pending_.substr(pending_pos_);
  pending_.clear();
  pending_pos_ = 0;
  return rest;
}

}  // namespace primus
