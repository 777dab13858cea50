// UTF-8 stepping, GPT-2's byte-level alphabet, NFC through utf8proc, Python's isspace.
#include "data/bpe_text.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <memory>

namespace primus {

size_t utf8_char_length(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) return 1;
  size_t n;
  uint32_t min_cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, min_cp = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, min_cp = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, min_cp = 0x10000;
  } else {
    return 1;
  }
  if (pos + n > text.size()) return 1;
  uint32_t cp = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return 1;
    cp = (cp << 6) | (byte(pos + i) & 0x3F);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 1;
  return n;
}

uint32_t utf8_code_point(std::string_view text, size_t pos, size_t length) {
  const unsigned char b0 = static_cast<unsigned char>(text[pos]);
  if (length == 1) return b0 < 0x80 ? b0 : 0xFFFFFFFFu;
  uint32_t cp = b0 & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  return cp;
}

namespace {

// byte -> code point of its spelling; printable Latin-1 bytes spell themselves, the other 68 take U+0100.. in order.
const std::array<uint32_t, 256>& byte_to_code_point() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

// The spellings live in U+0021..U+0143, so a flat table indexed by code point inverts them.
constexpr uint32_t kSpellingLimit = 0x144;
const std::array<int16_t, kSpellingLimit>& code_point_to_byte() {
  static const std::array<int16_t, kSpellingLimit> table = [] {
    std::array<int16_t, kSpellingLimit> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_code_point()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return table;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {  // the byte-level alphabet stops below U+0800
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_code_point()[static_cast<unsigned char>(c)]);
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view spelled) {
  std::string out;
  out.reserve(spelled.size());
  for (size_t pos = 0; pos < spelled.size();) {
    const size_t n = utf8_char_length(spelled, pos);
    const uint32_t cp = utf8_code_point(spelled, pos, n);
    if (cp >= kSpellingLimit || code_point_to_byte()[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(code_point_to_byte()[cp]));
    pos += n;
  }
  return out;
}

std::string nfc_normalize(std::string_view text) {
  // U+0300 is the first code point that can take part in a composition; its UTF-8 lead byte is 0xCC, and all
  // smaller code points have smaller lead bytes.
  bool may_change = false;
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0xCC) {
      may_change = true;
      break;
    }
  }
  if (!may_change) return std::string(text);
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
}

bool python_isspace(uint32_t cp) {
  if (cp <= 0x20) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace primus
