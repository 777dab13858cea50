// PCRE2-backed pre-tokenizer regex with per-thread match state.
#include "data/bpe_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "data/bpe_text.h"

namespace primus {
namespace {

// Match data, a match context and a JIT stack owned by one thread and shared by every pattern it runs: match
// data made with pcre2_match_data_create is not tied to a pattern, and the JIT stack grows on demand from 32 KiB
// to 8 MiB (long whitespace runs under `\s+(?!\S)` need more than the default machine-stack area).
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;

  ThreadMatchState() {
    data = pcre2_match_data_create(32, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    PRIMUS_CHECK(data && context && stack, "[tokenizer] out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return fmt::format("PCRE2 error {}", code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

PretokenRegex::PretokenRegex(const std::string& pattern, const std::string& where) : pattern_(pattern), where_(where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (code_ == nullptr) {
    throw UsageError(fmt::format("[tokenizer] {}: the regex does not compile at offset {}: {} (pattern: {})", where,
                                 offset, pcre2_message(error), pattern));
  }
  // Without JIT support (an unusual platform) the interpreter gives the same matches, only slower.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

PretokenRegex::~PretokenRegex() { pcre2_code_free(code_); }

void PretokenRegex::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  ThreadMatchState& state = thread_match_state();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
  size_t pos = 0;
  size_t covered = 0;  // text[0, covered) is already in `pieces`
  while (pos < text.size()) {
    const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, 0, state.data, state.context)
                        : pcre2_match(code_, subject, text.size(), pos, 0, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw RuntimeError(fmt::format("[tokenizer] {}: matching failed at byte {} of a {}-byte text: {}", where_, pos,
                                     text.size(), pcre2_message(rc)));
    }
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end == start) {  // an empty match: step over one character and search again
      if (start >= text.size()) break;
      pos = start + utf8_char_length(text, start);
      continue;
    }
    if (start > covered) pieces.push_back(text.substr(covered, start - covered));
    pieces.push_back(text.substr(start, end - start));
    pos = covered = end;
  }
  if (covered < text.size()) pieces.push_back(text.substr(covered));
}

}  // namespace primus
