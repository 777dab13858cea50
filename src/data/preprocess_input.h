// Input side of `data preprocess`: which files a list of paths means, and reading one of them as a stream of
// lines (JSONL) or as a whole (text), decompressing .zst on the fly with libzstd's streaming API so memory
// stays bounded by one line or one text file, never by the input's size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace primus {

struct InputFile {
  std::string path;
  bool jsonl = false;       // *.jsonl / *.json (optionally .zst): one JSON document a line; otherwise a text document
  bool zstd = false;        // *.zst: Zstandard-compressed
  uint64_t size_bytes = 0;  // on disk (compressed size for .zst)
};

// Every path in order; a directory contributes its regular files recursively, sorted by path, skipping hidden
// files and directories. Throws UsageError for a missing path or when no file is found.
std::vector<InputFile> list_preprocess_inputs(const std::vector<std::string>& paths);

class InputStream {
 public:
  // Throws RuntimeError when the file cannot be opened.
  explicit InputStream(const InputFile& file);
  ~InputStream();
  InputStream(const InputStream&) = delete;
  InputStream& operator=(const InputStream&) = delete;

  // The next line without its '\n' (a last line without one counts too); false at the end. Throws
  // RuntimeError naming the file and byte offset on a read error or corrupt/truncated zstd data.
  bool next_line(std::string& line);
  // Everything not read yet.
  std::string read_all();

  // Bytes of the file on disk consumed so far (for progress and MB/s).
  uint64_t consumed_bytes() const { return consumed_; }
  // Number of the line next_line last returned (1-based).
  int64_t line_number() const { return line_number_; }

 private:
  bool fill();  // appends decoded bytes to pending_; false at the end of the input
  size_t read_raw(char* out, size_t n);

  InputFile file_;
  int fd_ = -1;
  struct Zstd;
  std::unique_ptr<Zstd> zstd_;
  std::string pending_;  // decoded bytes not returned yet, from pending_pos_
  size_t pending_pos_ = 0;
  uint64_t consumed_ = 0;
  int64_t line_number_ = 0;
  bool eof_ = false;
};

}  // namespace primus
