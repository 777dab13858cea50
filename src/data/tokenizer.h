// Tokenizers: the interface every tokenizer implements, the factory that picks one by the config's
// tokenizer_type (Megatron names), and Megatron's vocabulary padding rule.
//
// ByteLevelTokenizer is the dependency-free tokenizer the CPU trainer starts with: one id per byte value
// (0..255) plus <|endoftext|> = 256 as the end-of-document id, so any byte string round-trips exactly.
// Trained tokenizers (GPT-2 BPE, SentencePiece, Hugging Face) implement the same interface later.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace primus {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text to ids. Special-token text inside `text` (e.g. "<|endoftext|>") is ordinary text, never a
  // special id: documents are separated by the caller appending eod_id().
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids to text. Throws UsageError for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Ids the tokenizer can produce, before padding (see padded_vocab_size).
  virtual int64_t vocab_size() const = 0;
  // End-of-document id appended after each document.
  virtual int32_t eod_id() const = 0;
  // The tokenizer_type it was made from, e.g. "ByteLevelTokenizer".
  virtual std::string name() const = 0;
};

class ByteLevelTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEodId = 256;  // <|endoftext|>
  static constexpr int64_t kVocabSize = 257;

  // One id per byte: id == static_cast<unsigned char>(byte).
  std::vector<int32_t> encode(std::string_view text) const override;
  // Bytes back; the eod id decodes to "" so that decode(encode(s)) == s for any byte string s and a
  // document boundary inside decoded text leaves no invented characters.
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int32_t eod_id() const override { return kEodId; }
  std::string name() const override { return "ByteLevelTokenizer"; }
};

// The tokenizer_type values make_tokenizer accepts.
std::vector<std::string> known_tokenizer_types();
// Throws UsageError naming the unknown type and listing the known ones.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type);

// Megatron's padded vocabulary: `vocab` rounded up to a multiple of `divisible_by` (the caller passes
// make_vocab_size_divisible_by × tensor-parallel size), so the embedding splits evenly and GEMMs stay aligned.
// Throws UsageError for vocab < 1 or divisible_by < 1.
int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by);

}  // namespace primus
