// Tokenizers: the interface every tokenizer implements, the factory that picks one by the config's
// tokenizer_type (Megatron names) and model file, and Megatron's vocabulary padding rule.
//
// ByteLevelTokenizer is the dependency-free tokenizer the CPU trainer starts with: one id per byte value
// (0..255) plus <|endoftext|> = 256 as the end-of-document id, so any byte string round-trips exactly.
// Trained tokenizers load from the files users have (docs/tokenizers.md): byte-level BPE (bpe_tokenizer.h) from
// tokenizer.json, vocab.json + merges.txt or tiktoken rank files, and SentencePiece models
// (sentencepiece_tokenizer.h). Every implementation is safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
  // Text to ids where special-token text (<|endoftext|>, <|eot_id|>, added tokens) becomes the token's id, as
  // tiktoken's encode(allowed_special="all") and Hugging Face's encode do. Tokenizers without special-token
  // matching encode as encode() does.
  virtual std::vector<int32_t> encode_with_specials(std::string_view text) const { return encode(text); }
  // Ids to text. Throws UsageError for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Ids the tokenizer can produce, before padding (see padded_vocab_size).
  virtual int64_t vocab_size() const = 0;
  // End-of-document id appended after each document.
  virtual int32_t eod_id() const = 0;
  // Beginning-of-document id (<s>, <|begin_of_text|>) when the tokenizer has one; encode never adds it.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
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
// Whether make_tokenizer needs a model file or directory for this type (every type but ByteLevelTokenizer).
bool tokenizer_needs_model(const std::string& type);
// The tokenizer `type` loaded from `model_path`:
//   ByteLevelTokenizer                        no file (model_path must be empty)
//   HuggingFaceTokenizer                      tokenizer.json, or a directory holding it (+ tokenizer_config.json)
//   GPT2BPETokenizer                          a directory with vocab.json + merges.txt, or the vocab.json file
//   TikTokenizer                              a tiktoken rank file (Llama 3, cl100k_base, o200k_base, r50k/p50k)
//   Llama3Tokenizer                           Llama 3's tokenizer.model rank file, or a directory holding it
//   SentencePieceTokenizer, Llama2Tokenizer,  a SentencePiece tokenizer.model, or a directory holding it
//   GPTSentencePieceTokenizer
// Throws UsageError for an unknown type (listing the known ones), a missing model_path where one is needed, and
// for missing or malformed files (naming the file and the line or field).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_path = "");

// Megatron's padded vocabulary: `vocab` rounded up to a multiple of `divisible_by` (the caller passes
// make_vocab_size_divisible_by × tensor-parallel size), so the embedding splits evenly and GEMMs stay aligned.
// Throws UsageError for vocab < 1 or divisible_by < 1.
int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by);

}  // namespace primus
