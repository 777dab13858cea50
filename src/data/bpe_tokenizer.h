// BpeTokenizer: the Tokenizer for every byte-level BPE vocabulary (tiktoken rank files, Hugging Face
// tokenizer.json, GPT-2 vocab.json + merges.txt). The loaders (tiktoken_tokenizer.h, hf_tokenizer.h) only build a
// BytePairEncoder and fill BpeTokenizer::Options; the encoding pipeline lives here:
//
//   text ─ NFC (optional) ─ Meta's Llama 3 chunks (optional) ─ added/special tokens ─ prefix space (optional)
//        ─ regex splits, each pattern applied to the pieces of the previous one ─ BPE per piece
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/bpe_encoder.h"
#include "data/bpe_regex.h"
#include "data/tokenizer.h"

namespace primus {

// A token matched in the raw text before pre-tokenization (tiktoken specials, tokenizer.json added_tokens).
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;       // matched only by encode_with_specials; false: matched by encode too (HF non-special)
  bool lstrip = false;       // the match absorbs whitespace on its left
  bool rstrip = false;       // the match absorbs whitespace on its right
  bool single_word = false;  // matched only when not inside a word
};

// Meta's Llama 3 input cutting (llama/tokenizer.py): 400,000-character chunks, each cut again wherever a run of
// whitespace or of non-whitespace characters (Python's isspace) grows past 25,000 characters. Characters are code
// points; an invalid UTF-8 byte counts as one non-whitespace character. Empty text gives no chunk.
std::vector<std::string_view> llama3_chunks(std::string_view text);

class BpeTokenizer final : public Tokenizer {
 public:
  struct Pattern {
    std::string regex;
    std::string where;  // origin for error messages
  };
  struct Options {
    std::string name;               // the tokenizer_type
    std::vector<Pattern> patterns;  // applied in order; empty: the whole segment is one piece
    bool add_prefix_space = false;  // a space before each segment that does not start with one
    bool nfc = false;               // NFC-normalize the text first
    bool llama3_chunks = false;     // Meta's 400,000-char chunks and 25,000-char run splits
    std::vector<AddedToken> added;
    int32_t eod_id = -1;
    std::optional<int32_t> bos_id;
  };

  // Throws UsageError when a pattern does not compile or eod/bos/added ids are negative.
  BpeTokenizer(BytePairEncoder encoder, Options options);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_with_specials(std::string_view text) const override;
  // Token bytes back to back; added and special tokens decode to their text.
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod_id() const override { return options_.eod_id; }
  std::optional<int32_t> bos_id() const override { return options_.bos_id; }
  std::string name() const override { return options_.name; }

  // The id of an added/special token's text, or of a byte string that is a token.
  std::optional<int32_t> token_id(std::string_view text) const;
  const BytePairEncoder& encoder() const { return encoder_; }

 private:
  void encode_text(std::string_view text, bool with_specials, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view segment, std::vector<int32_t>& out) const;

  BytePairEncoder encoder_;
  Options options_;
  std::vector<std::unique_ptr<PretokenRegex>> regexes_;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> added_by_content_;  // -> index in added
  std::vector<size_t> added_lengths_;  // distinct lengths, longest first
  bool added_first_byte_[256] = {};
  std::unordered_map<int32_t, size_t> added_by_id_;
  int64_t vocab_size_ = 0;
};

}  // namespace primus
