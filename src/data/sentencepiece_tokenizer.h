// SentencePieceTokenizer: SentencePiece models (Llama 2, Mistral/Mixtral tokenizer.model protobufs) through
// Debian's libsentencepiece. Encoding is SentencePiece's own (normalizer, dummy prefix, BPE or unigram, byte
// fallback); decode skips control pieces (<s>, </s>) the way SentencePiece does.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace primus {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // path: tokenizer.model, or a directory holding it. type: the tokenizer_type ("SentencePieceTokenizer",
  // "Llama2Tokenizer", ...). Throws UsageError naming the file when it is missing or not a SentencePiece model,
  // or when the model has no end-of-sentence piece.
  SentencePieceTokenizer(const std::string& path, std::string type);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod_id() const override { return eod_id_; }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::string name() const override { return type_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string path_;
  std::string type_;
  int64_t vocab_size_ = 0;
  int32_t eod_id_ = -1;
  std::optional<int32_t> bos_id_;
};

}  // namespace primus
