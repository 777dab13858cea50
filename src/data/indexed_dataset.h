// Megatron-LM's MMIDIDX indexed dataset: a `.bin` of token ids back to back and an `.idx` describing the
// sequences and documents in it (byte layout in shared/docs/FORMATS.md §1 and docs/data.md).
//
// IndexedDataset memory-maps both files and validates everything it will later rely on when it opens them
// (magic, version, dtype, sizes against file lengths, pointers against lengths, the document index), so
// reads never go out of bounds; any violation is a RuntimeError (exit 3) naming the file and byte offset.
// Reads are const and thread-safe. IndexedDatasetWriter streams the .bin while it keeps the .idx arrays
// (12 bytes a sequence) in memory, and writes both files atomically on finish().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/npy_file.h"

namespace primus {

// Token dtype codes of the .idx header (numpy dtypes in Megatron's DType enum).
enum class TokenDType : uint8_t {
  kU8 = 1,
  kI8 = 2,
  kI16 = 3,
  kI32 = 4,
  kI64 = 5,
  kF64 = 6,
  kF32 = 7,
  kU16 = 8,
};

// Bytes per token; 0 for a code that is not a TokenDType.
int64_t token_dtype_size(uint8_t code);
// "uint16", "int32", ...; "unknown" for a bad code.
std::string token_dtype_name(uint8_t code);
// Megatron's writer choice: uint16 when vocab_size < 65500, else int32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

std::string idx_path(const std::string& prefix);  // prefix + ".idx"
std::string bin_path(const std::string& prefix);  // prefix + ".bin"
// True when both prefix.idx and prefix.bin are regular files.
bool indexed_dataset_exists(const std::string& prefix);
// "data/x.idx" or "data/x.bin" -> "data/x"; any other path unchanged.
std::string strip_indexed_suffix(const std::string& path);

inline constexpr uint64_t kIdxHeaderBytes = 34;

class IndexedDataset {
 public:
  // Opens prefix.idx and prefix.bin. Throws UsageError when either file is missing, RuntimeError for any
  // corruption. `multimodal` accepts (and requires) the trailing int8 mode array.
  explicit IndexedDataset(const std::string& prefix, bool multimodal = false);

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t itemsize() const { return itemsize_; }
  int64_t num_sequences() const { return num_sequences_; }
  // Documents = document-index entries - 1.
  int64_t num_documents() const { return num_doc_entries_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t sequence) const;
  int64_t sequence_pointer(int64_t sequence) const;  // byte offset into .bin
  // Document-index entry k (0 <= k <= num_documents()); document k is sequences [entry k, entry k + 1).
  int64_t document_entry(int64_t k) const;

  // Copies tokens [offset, offset + out.size()) of `sequence` into `out`. PRIMUS_CHECK on a range outside the
  // sequence; RuntimeError naming the .bin file and offset for an int64/int32 token outside int32.
  void read(int64_t sequence, int64_t offset, std::span<int32_t> out) const;
  std::vector<int32_t> sequence(int64_t sequence) const;

 private:
  std::string prefix_;
  std::shared_ptr<const MappedFile> idx_;
  std::shared_ptr<const MappedFile> bin_;
  TokenDType dtype_ = TokenDType::kU16;
  int64_t itemsize_ = 2;
  int64_t num_sequences_ = 0;
  int64_t num_doc_entries_ = 0;
  int64_t num_tokens_ = 0;
  const unsigned char* lengths_ = nullptr;    // int32[S], unaligned
  const unsigned char* pointers_ = nullptr;   // int64[S]
  const unsigned char* documents_ = nullptr;  // int64[D]
};

class IndexedDatasetWriter {
 public:
  // Starts writing prefix.bin (as a temporary until finish()). Throws RuntimeError when it cannot.
  IndexedDatasetWriter(const std::string& prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence. Throws UsageError for a token the dtype cannot hold (naming it and the sequence).
  void add_sequence(std::span<const int32_t> tokens);
  // Closes the current document (the sequences added since the last end_document, possibly none).
  void end_document();
  // A document of one sequence, or of none when `tokens` is empty (as Megatron's preprocess does).
  void add_document(std::span<const int32_t> tokens);
  // Writes prefix.idx and moves both files into place. Sequences added after the last end_document form
  // one more document. Writing either file first is safe: a reader rejects a mismatched pair.
  void finish();

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(documents_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  void flush_bin();

  std::string prefix_;
  TokenDType dtype_;
  int64_t itemsize_;
  struct Files;
  std::unique_ptr<Files> files_;
  std::string buffer_;                 // pending .bin bytes
  std::vector<int32_t> lengths_;       // [S]
  std::vector<int64_t> documents_{0};  // [D]
  int64_t num_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace primus
