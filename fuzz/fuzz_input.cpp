// Scratch files and input splitting for the fuzz targets (fuzz_input.h).
#include "fuzz_input.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace primus::fuzz {

namespace fs = std::filesystem;

const std::string& scratch_dir() {
  // Leaked on purpose: the exit handler that removes the folder is registered before a static string's destructor
  // would be, so it would run after that destructor and read a dead string.
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::error_code ec;
    fs::path root = tmp != nullptr && *tmp != '\0' ? tmp : fs::is_directory("/dev/shm", ec) ? "/dev/shm" : "/tmp";
    fs::path path = root / ("primus-fuzz." + std::to_string(getpid()));
    fs::create_directories(path);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch_dir(), ec);
    });
    return new std::string(path.string());
  }();
  return *dir;
}

bool verbose() {
  static const bool on = std::getenv("PRIMUS_FUZZ_VERBOSE") != nullptr;
  return on;
}

std::string write_scratch(const std::string& name, std::string_view bytes) {
  std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) std::abort();  // the harness itself failed: not a finding about the reader
  return path;
}

std::string fresh_scratch_dir(const std::string& name) {
  fs::path path = fs::path(scratch_dir()) / name;
  fs::remove_all(path);
  fs::create_directories(path);
  return path.string();
}

std::vector<std::string_view> split_parts(std::string_view data, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    size_t at = data.find(kSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + kSeparator.size());
  }
  parts.push_back(data);
  return parts;
}

}  // namespace primus::fuzz
