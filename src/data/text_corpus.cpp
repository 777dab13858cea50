// Loading text files into one token stream, and parsing Megatron split strings.
#include "data/text_corpus.h"

#include "core/file_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>

#include "core/error.h"

namespace primus {

namespace fs = std::filesystem;

namespace {

bool is_hidden(const fs::path& path) {
  std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

// The regular files under `dir`, sorted by path so that the token stream does not depend on the order
// in which the file system lists entries.
std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  if (ec) throw RuntimeError(fmt::format("data_path: cannot list directory '{}': {}", dir.string(), ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) throw RuntimeError(fmt::format("data_path: cannot list directory '{}': {}", dir.string(), ec.message()));
    const fs::directory_entry& entry = *it;
    if (is_hidden(entry.path())) {
      if (entry.is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (entry.is_regular_file(ec)) files.push_back(entry.path());
  }
  if (ec) throw RuntimeError(fmt::format("data_path: cannot list directory '{}': {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// "969,30,1" -> {969, 30, 1}; fewer than three weights are padded with zeros.
std::vector<double> parse_split(const std::string& split) {
  char separator = split.find('/') != std::string::npos ? '/' : ',';
  std::vector<double> weights;
  std::string_view rest = split;
  while (true) {
    size_t cut = rest.find(separator);
    std::string_view part = trim(rest.substr(0, cut));
    double w = 0;
    auto [end, err] = std::from_chars(part.data(), part.data() + part.size(), w);
    if (part.empty() || err != std::errc() || end != part.data() + part.size() || !std::isfinite(w) || w < 0) {
      throw UsageError(fmt::format(
          "split: '{}' is malformed: '{}' is not a non-negative number (expected e.g. \"969,30,1\")", split, part));
    }
    weights.push_back(w);
    if (cut == std::string_view::npos) break;
    rest.remove_prefix(cut + 1);
  }
  if (weights.size() > 3) {
    throw UsageError(fmt::format("split: '{}' has {} parts; at most 3 (train, valid, test)", split, weights.size()));
  }
  weights.resize(3, 0.0);
  if (weights[0] + weights[1] + weights[2] <= 0)
    throw UsageError(fmt::format("split: '{}' has weights summing to 0", split));
  return weights;
}

}  // namespace

std::span<const int32_t> TokenCorpus::slice(const TokenRange& range) const {
  PRIMUS_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= num_tokens(),
               "token range [{}, {}) outside a corpus of {} tokens", range.begin, range.end, num_tokens());
  return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
}

TokenCorpus load_text_corpus(const std::vector<std::string>& paths, const Tokenizer& tokenizer) {
  if (paths.empty()) throw UsageError("data_path: no paths given");
  std::vector<fs::path> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    fs::file_status status = fs::status(p, ec);
    if (!fs::exists(status)) throw UsageError(fmt::format("data_path: '{}' does not exist", p));
    if (fs::is_directory(status)) {
      std::vector<fs::path> found = files_under(p);
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(status)) {
      files.emplace_back(p);
    } else {
      throw UsageError(fmt::format("data_path: '{}' is neither a regular file nor a directory", p));
    }
  }

  TokenCorpus corpus;
  corpus.document_starts.push_back(0);
  for (const fs::path& file : files) {
    std::string bytes = read_file(file.string());
    if (bytes.empty()) continue;
    std::vector<int32_t> ids = tokenizer.encode(bytes);
    corpus.tokens.insert(corpus.tokens.end(), ids.begin(), ids.end());
    corpus.tokens.push_back(tokenizer.eod_id());
    corpus.documents.push_back(file.string());
    corpus.document_starts.push_back(corpus.num_tokens());
  }
  if (corpus.documents.empty()) {
    throw UsageError(
        fmt::format("data_path: no text found in '{}' ({} files, all empty)", fmt::join(paths, "', '"), files.size()));
  }
  return corpus;
}

TokenRange split_range(int64_t total_tokens, const std::string& split, int which) {
  PRIMUS_CHECK(which >= kSplitTrain && which <= kSplitTest, "split part {} is not 0 (train), 1 (valid) or 2 (test)",
               which);
  PRIMUS_CHECK(total_tokens >= 0, "split of a negative token count {}", total_tokens);
  std::vector<double> weights = parse_split(split);
  double sum = weights[0] + weights[1] + weights[2];
  auto bound = [&](int k) -> int64_t {  // end of part k
    if (k < 0) return 0;
    if (k == kSplitTest) return total_tokens;
    double cumulative = 0;
    for (int i = 0; i <= k; ++i) cumulative += weights[i];
    return std::min(total_tokens,
                    static_cast<int64_t>(std::llround(cumulative / sum * static_cast<double>(total_tokens))));
  };
  return TokenRange{bound(which - 1), bound(which)};
}

}  // namespace primus
