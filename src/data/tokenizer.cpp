// ByteLevelTokenizer, the tokenizer factory and vocabulary padding.
#include "data/tokenizer.h"

#include <fmt/format.h>

#include "core/error.h"

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

std::vector<std::string> known_tokenizer_types() { return {"ByteLevelTokenizer"}; }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type) {
  if (type == "ByteLevelTokenizer") return std::make_unique<ByteLevelTokenizer>();
  throw UsageError(fmt::format("tokenizer_type: unknown tokenizer '{}' (known: {})", type,
                               fmt::join(known_tokenizer_types(), ", ")));
}

int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by) {
  if (vocab < 1) throw UsageError(fmt::format("vocab_size must be >= 1, got {}", vocab));
  if (divisible_by < 1)
    throw UsageError(fmt::format("make_vocab_size_divisible_by must be >= 1, got {}", divisible_by));
  return (vocab + divisible_by - 1) / divisible_by * divisible_by;
}

}  // namespace primus
