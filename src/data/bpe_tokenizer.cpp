// The byte-level BPE encoding pipeline: normalization, chunking, added tokens, regex pre-tokenization, BPE.
#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "data/bpe_text.h"

namespace primus {
namespace {

constexpr size_t kLlama3ChunkChars = 400000;
constexpr size_t kLlama3MaxRunChars = 25000;

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Word characters for single_word added tokens: ASCII letters, digits, '_' and any non-ASCII byte (letters of
// other scripts), a byte-level approximation of Hugging Face's alphanumeric test.
bool is_word_byte(char c) {
  const auto b = static_cast<unsigned char>(c);
  return b >= 0x80 || std::isalnum(b) || c == '_';
}

}  // namespace

std::vector<std::string_view> llama3_chunks(std::string_view text) {
  std::vector<std::string_view> out;
  size_t chunk_start = 0;
  while (chunk_start < text.size()) {
    // One chunk: up to kLlama3ChunkChars characters, cut at runs longer than kLlama3MaxRunChars.
    size_t pos = chunk_start;
    size_t chars = 0;
    size_t slice_start = chunk_start;
    size_t run = 0;
    bool run_is_space = false;
    while (pos < text.size() && chars < kLlama3ChunkChars) {
      const size_t n = utf8_char_length(text, pos);
      const bool space = python_isspace(utf8_code_point(text, pos, n));
      if (chars == 0) run_is_space = space;
      if (space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > kLlama3MaxRunChars) {
        out.push_back(text.substr(slice_start, pos - slice_start));
        slice_start = pos;
        run = 1;
      }
      pos += n;
      ++chars;
    }
    out.push_back(text.substr(slice_start, pos - slice_start));
    chunk_start = pos;
  }
  return out;
}

BpeTokenizer::BpeTokenizer(BytePairEncoder encoder, Options options)
    : encoder_(std::move(encoder)), options_(std::move(options)) {
  for (const Pattern& p : options_.patterns) regexes_.push_back(std::make_unique<PretokenRegex>(p.regex, p.where));
  vocab_size_ = encoder_.id_limit();
  for (size_t i = 0; i < options_.added.size(); ++i) {
    const AddedToken& t = options_.added[i];
    if (t.id < 0 || t.content.empty()) {
      throw UsageError(fmt::format("[tokenizer {}] added token '{}' has id {} (ids must be >= 0, content non-empty)",
                                   options_.name, t.content, t.id));
    }
    added_by_content_.emplace(t.content, i);
    added_by_id_.emplace(t.id, i);
    added_first_byte_[static_cast<unsigned char>(t.content[0])] = true;
    if (std::find(added_lengths_.begin(), added_lengths_.end(), t.content.size()) == added_lengths_.end()) {
      added_lengths_.push_back(t.content.size());
    }
    vocab_size_ = std::max<int64_t>(vocab_size_, t.id + 1);
  }
  std::sort(added_lengths_.begin(), added_lengths_.end(), std::greater<>());
  if (options_.eod_id < 0 || options_.eod_id >= vocab_size_) {
    throw UsageError(fmt::format("[tokenizer {}] end-of-document id {} is outside the vocabulary [0, {})",
                                 options_.name, options_.eod_id, vocab_size_));
  }
  if (options_.bos_id && (*options_.bos_id < 0 || *options_.bos_id >= vocab_size_)) {
    throw UsageError(fmt::format("[tokenizer {}] beginning-of-document id {} is outside the vocabulary [0, {})",
                                 options_.name, *options_.bos_id, vocab_size_));
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_text(text, false, out);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_with_specials(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_text(text, true, out);
  return out;
}

void BpeTokenizer::encode_text(std::string_view raw, bool with_specials, std::vector<int32_t>& out) const {
  std::string normalized;
  std::string_view text = raw;
  if (options_.nfc) {
    normalized = nfc_normalize(raw);
    text = normalized;
  }
  const auto encode_chunk = [&](std::string_view chunk) {
    size_t segment_start = 0;
    if (!added_lengths_.empty()) {
      for (size_t p = 0; p < chunk.size(); ++p) {
        if (!added_first_byte_[static_cast<unsigned char>(chunk[p])]) continue;
        for (size_t len : added_lengths_) {  // longest first: leftmost-longest matching
          if (p + len > chunk.size()) continue;
          const auto it = added_by_content_.find(chunk.substr(p, len));
          if (it == added_by_content_.end()) continue;
          const AddedToken& t = options_.added[it->second];
          if (t.special && !with_specials) continue;
          size_t start = p;
          size_t end = p + len;
          if (t.single_word &&
              ((start > 0 && is_word_byte(chunk[start - 1])) || (end < chunk.size() && is_word_byte(chunk[end])))) {
            continue;
          }
          if (t.lstrip) {
            while (start > segment_start && is_ascii_space(chunk[start - 1])) --start;
          }
          if (t.rstrip) {
            while (end < chunk.size() && is_ascii_space(chunk[end])) ++end;
          }
          encode_segment(chunk.substr(segment_start, start - segment_start), out);
          out.push_back(t.id);
          segment_start = end;
          p = end - 1;
          break;
        }
      }
    }
    encode_segment(chunk.substr(segment_start), out);
  };
  if (options_.llama3_chunks) {
    for (std::string_view chunk : llama3_chunks(text)) encode_chunk(chunk);
  } else {
    encode_chunk(text);
  }
}

void BpeTokenizer::encode_segment(std::string_view segment, std::vector<int32_t>& out) const {
  if (segment.empty()) return;
  std::string prefixed;
  if (options_.add_prefix_space && segment.front() != ' ') {
    prefixed.reserve(segment.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(segment);
    segment = prefixed;
  }
  thread_local std::vector<std::string_view> pieces;
  thread_local std::vector<std::string_view> next_pieces;
  pieces.clear();
  pieces.push_back(segment);
  for (const auto& regex : regexes_) {
    next_pieces.clear();
    for (std::string_view piece : pieces) regex->split(piece, next_pieces);
    pieces.swap(next_pieces);
  }
  for (std::string_view piece : pieces) encoder_.encode_piece(piece, out);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      text += options_.added[it->second].content;
    } else if (encoder_.assigned(id)) {
      text += encoder_.token(id);
    } else {
      throw UsageError(fmt::format("[tokenizer {}] id {} at position {} is not a token (vocabulary [0, {}))",
                                   options_.name, id, i, vocab_size_));
    }
  }
  return text;
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view text) const {
  if (const auto it = added_by_content_.find(text); it != added_by_content_.end()) {
    return options_.added[it->second].id;
  }
  return encoder_.find(text);
}

}  // namespace primus
