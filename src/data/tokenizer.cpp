// ByteLevelTokenizer, the tokenizer factory and vocabulary padding.
#include "data/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tiktoken_tokenizer.h"

namespace primus {

std::vector<int32_t> ByteLevelTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteLevelTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id == kEodId) continue;
    if (id < 0 || id > 255) {
      throw UsageError(fmt::format("[tokenizer {}] id {} at position {} is outside the vocabulary [0, {})", name(), id,
                                   i, kVocabSize));
    }
    text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return text;
}

std::vector<std::string> known_tokenizer_types() {
  return {"ByteLevelTokenizer", "HuggingFaceTokenizer",   "GPT2BPETokenizer", "TikTokenizer",
          "Llama3Tokenizer",    "SentencePieceTokenizer", "Llama2Tokenizer",  "GPTSentencePieceTokenizer"};
}

bool tokenizer_needs_model(const std::string& type) { return type != "ByteLevelTokenizer"; }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_path) {
  const std::vector<std::string> known = known_tokenizer_types();
  if (std::find(known.begin(), known.end(), type) == known.end()) {
    throw UsageError(fmt::format("tokenizer_type: unknown tokenizer '{}' (known: {})", type, fmt::join(known, ", ")));
  }
  if (type == "ByteLevelTokenizer") {
    if (!model_path.empty()) {
      throw UsageError(fmt::format("tokenizer_model: ByteLevelTokenizer takes no model file (got '{}')", model_path));
    }
    return std::make_unique<ByteLevelTokenizer>();
  }
  if (model_path.empty()) {
    throw UsageError(fmt::format("tokenizer_model: tokenizer_type {} needs a model file or directory", type));
  }
  if (type == "HuggingFaceTokenizer") return load_hf_tokenizer(model_path);
  if (type == "GPT2BPETokenizer") return load_gpt2_bpe_tokenizer(model_path);
  if (type == "TikTokenizer" || type == "Llama3Tokenizer") return load_tiktoken_tokenizer(model_path, type);
  return std::make_unique<SentencePieceTokenizer>(model_path, type);
}

int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by) {
  if (vocab < 1) throw UsageError(fmt::format("vocab_size must be >= 1, got {}", vocab));
  if (divisible_by < 1)
    throw UsageError(fmt::format("make_vocab_size_divisible_by must be >= 1, got {}", divisible_by));
  return (vocab + divisible_by - 1) / divisible_by * divisible_by;
}

}  // namespace primus
