// A token corpus built from plain text files, and Megatron-style train/valid/test splits of it.
//
// Every file is one document: its tokens followed by the tokenizer's eod id. All documents live in one
// contiguous token stream, the same picture a Megatron indexed dataset (.bin/.idx) gives, so sample
// sources work on a span of tokens and do not care where the stream came from.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace primus {

// A half-open range [begin, end) of positions in a token stream.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const TokenRange&) const = default;
};

struct TokenCorpus {
  std::vector<int32_t> tokens;           // every document followed by eod, in document order
  std::vector<std::string> documents;    // the file each document came from
  std::vector<int64_t> document_starts;  // documents.size() + 1 offsets into tokens; the last is tokens.size()

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  // The tokens of `range`; the span borrows from this corpus.
  std::span<const int32_t> slice(const TokenRange& range) const;
};

// Reads every path in order. A path is a file or a directory; a directory contributes its regular files
// (recursively, sorted by path, hidden files and hidden directories skipped, symlinked directories not
// followed). Files are read as raw bytes; empty files are skipped (they would be a lone eod).
// Throws UsageError when a path does not exist or is neither file nor directory, or when no bytes were
// found at all; RuntimeError when a file cannot be read.
TokenCorpus load_text_corpus(const std::vector<std::string>& paths, const Tokenizer& tokenizer);

enum SplitPart : int { kSplitTrain = 0, kSplitValid = 1, kSplitTest = 2 };

// The contiguous part `which` of a stream of `total_tokens` tokens under a Megatron split string
// ("969,30,1"; "/" also separates; one or two weights mean the rest are 0). Parts are train, valid, test
// in stream order; boundary k is round(total_tokens × (w_0 + … + w_k) / Σw).
// Throws UsageError for a malformed split (non-numbers, negative weights, more than 3 parts, zero sum).
TokenRange split_range(int64_t total_tokens, const std::string& split, int which);

}  // namespace primus
