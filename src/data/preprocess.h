// `data preprocess`: text (JSONL, JSONL.zst, plain text files or directories) -> a Megatron indexed dataset
// `{prefix}_{json_key}_document.bin/.idx`, as Megatron-LM's tools/preprocess_data.py writes it.
//
// A JSONL line is one document (the string under json_key); a text file is one document. Memory stays
// bounded: the reader hands batches of lines to `workers` tokenizing threads, at most 2 × workers batches are
// in flight, and the writer takes finished batches in input order, so the output is the same for any worker
// count. Tokenizer::encode must be safe to call from several threads at once (it is const).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace primus {

// Where a run stands: documents written, input bytes consumed (on disk, so compressed for .zst) of the total.
struct PreprocessProgress {
  int64_t documents = 0;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  bool final = false;
};

// More tokenizing threads than any machine has cores only costs memory (2 batches of ~1 MB each in flight per
// worker) and, in the thousands, fails to start: --workers above this is refused as a usage error.
constexpr int kMaxPreprocessWorkers = 1024;

struct PreprocessOptions {
  std::vector<std::string> inputs;
  std::string json_key = "text";
  std::string output_prefix;
  int workers = 1;
  bool append_eod = false;
  // Count malformed lines (bad JSON, missing or non-string json_key) instead of stopping at the first.
  bool skip_bad_lines = false;
  int64_t batch_bytes = int64_t{1} << 20;  // text per worker batch
  // Called on the calling thread after each batch is written and once at the end (final = true); the CLI
  // draws a progress bar from it (observe/progress.h). Empty: no progress reports.
  std::function<void(const PreprocessProgress&)> on_progress;
  // Polled before each batch: a signal number (nonzero) stops the run with Error(128 + it), removing the partial
  // output. Empty: never stops.
  std::function<int()> stop_signal;
};

struct PreprocessResult {
  std::string prefix;  // {output_prefix}_{json_key}_document
  int64_t documents = 0;
  int64_t empty_documents = 0;
  int64_t tokens = 0;
  int64_t input_bytes = 0;
  int64_t bad_lines = 0;
  std::vector<std::string> bad_line_examples;  // "file:line: why", the first few
  double seconds = 0.0;
};

// Throws UsageError for bad options, a missing input or (without skip_bad_lines) a malformed line, naming
// file:line; RuntimeError for I/O failures; Error(128 + N) when stopped by signal N. Output files appear only
// when the whole run succeeds; a failed run removes its temporaries.
PreprocessResult preprocess_to_indexed(const PreprocessOptions& options, const Tokenizer& tokenizer);

}  // namespace primus
