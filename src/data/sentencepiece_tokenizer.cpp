// SentencePiece model loading, encoding and decoding.
#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "core/error.h"

namespace primus {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path, std::string type)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(path), type_(std::move(type)) {
  if (std::filesystem::is_directory(path_)) path_ = (std::filesystem::path(path_) / "tokenizer.model").string();
  if (!std::filesystem::exists(path_)) throw UsageError(fmt::format("[tokenizer {}] cannot open {}", type_, path_));
  const sentencepiece::util::Status status = processor_->Load(path_);
  if (!status.ok()) {
    throw UsageError(
        fmt::format("[tokenizer {}] {} is not a SentencePiece model: {}", type_, path_, status.ToString()));
  }
  vocab_size_ = processor_->GetPieceSize();
  if (processor_->eos_id() < 0) {
    throw UsageError(
        fmt::format("[tokenizer {}] {}: the model has no end-of-sentence piece (trainer_spec.eos_id)", type_, path_));
  }
  eod_id_ = processor_->eos_id();
  if (processor_->bos_id() >= 0) bos_id_ = processor_->bos_id();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status status = processor_->Encode(text, &ids);
  if (!status.ok()) {
    throw RuntimeError(fmt::format("[tokenizer {}] {}: encoding failed: {}", type_, path_, status.ToString()));
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<int> pieces(ids.begin(), ids.end());
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i] < 0 || pieces[i] >= vocab_size_) {
      throw UsageError(fmt::format("[tokenizer {}] id {} at position {} is outside the vocabulary [0, {})", type_,
                                   pieces[i], i, vocab_size_));
    }
  }
  std::string text;
  const sentencepiece::util::Status status = processor_->Decode(pieces, &text);
  if (!status.ok()) {
    throw RuntimeError(fmt::format("[tokenizer {}] {}: decoding failed: {}", type_, path_, status.ToString()));
  }
  return text;
}

}  // namespace primus
