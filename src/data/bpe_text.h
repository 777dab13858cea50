// Text helpers the byte-level BPE tokenizers share: UTF-8 stepping that tolerates invalid bytes, GPT-2's
// byte <-> unicode table used by Hugging Face vocabularies, NFC normalization (utf8proc), Python's str.isspace
// (Meta's Llama 3 chunking rule is defined with it) and a fast hash for short byte strings.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace primus {

// Length in bytes of the UTF-8 character starting at text[pos]; 1 for a byte that does not start a valid,
// complete, shortest-form sequence, so that stepping always makes progress over arbitrary bytes.
size_t utf8_char_length(std::string_view text, size_t pos);
// The code point of the character at text[pos] (see utf8_char_length); an invalid byte yields 0xFFFFFFFF.
uint32_t utf8_code_point(std::string_view text, size_t pos, size_t length);

// GPT-2's reversible byte <-> unicode mapping (FORMATS.md section 5): vocab strings in tokenizer.json and
// vocab.json spell each byte as one code point. byte_level_encode maps raw bytes to that spelling;
// byte_level_decode maps it back and returns nullopt when a character is outside the 256-character alphabet.
std::string byte_level_encode(std::string_view bytes);
std::optional<std::string> byte_level_decode(std::string_view spelled);

// NFC (canonical composition) of valid UTF-8 text. Text with no code point at or above U+0300 is already NFC and
// comes back unchanged without calling the library; text that is not valid UTF-8 also comes back unchanged
// (Hugging Face only ever normalizes valid strings).
std::string nfc_normalize(std::string_view text);

// Python's str.isspace() for one code point (category Zs or bidi class WS/B/S: Unicode White_Space plus the ASCII
// separators 0x1C-0x1F), as Meta's Llama 3 tokenizer uses it to cut long runs.
bool python_isspace(uint32_t code_point);

// A fast, well-mixed 64-bit hash of a short byte string (token lookups).
inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

}  // namespace primus
