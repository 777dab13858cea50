// PretokenRegex: a pre-tokenizer pattern (tiktoken's pat_str, a tokenizer.json Split regex) compiled by PCRE2 with
// UTF, UCP (Unicode properties for \p{L}, \s, ...) and JIT, used to cut text into the pieces BPE encodes.
//
// Matching state (match data, JIT stack) is per thread, so one compiled pattern serves any number of encoding
// threads without locks. Invalid UTF-8 is allowed in the subject (PCRE2_MATCH_INVALID_UTF): no pattern matches
// an invalid byte, so such bytes end up in gap pieces and still round-trip.
#pragma once

#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace primus {

class PretokenRegex {
 public:
  // `where` names the pattern's origin in errors ("tokenizer.json: pre_tokenizer.pretokenizers[0].pattern").
  // Throws UsageError with PCRE2's message and the offset in the pattern when it does not compile.
  PretokenRegex(const std::string& pattern, const std::string& where);
  ~PretokenRegex();
  PretokenRegex(const PretokenRegex&) = delete;
  PretokenRegex& operator=(const PretokenRegex&) = delete;

  // Appends to `pieces` the matches of the pattern in `text`, left to right as a scanner finds them, and every
  // stretch between two matches as a piece of its own (Hugging Face's Split behavior "Isolated"), so the pieces
  // concatenate back to `text`. Empty matches produce no piece.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string where_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace primus
