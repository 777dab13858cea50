// tiktoken rank files: Llama 3's tokenizer.model and OpenAI's cl100k_base / o200k_base / r50k_base / p50k_base
// ranks, one `base64(token bytes) rank` line per token (FORMATS.md section 5). A rank file carries no regex and no
// special tokens, so the encoding is recognized by its number of ranks and given the pattern and specials its
// publisher uses:
//   128,000 ranks  Llama 3      cl100k-style regex, 256 specials from 128000 (Llama 3.1 names), Meta's chunking
//   100,256        cl100k_base  specials endoftext 100257, fim 100258-100260, endofprompt 100276
//   199,998        o200k_base   case-aware regex, specials endoftext 199999, endofprompt 200018
//    50,256        r50k_base    GPT-2 regex, endoftext 50256
//    50,280        p50k_base    GPT-2 regex, endoftext 50256
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"

namespace primus {

// Token bytes by rank; nullopt where no line has that rank. Throws UsageError naming the file and line for a
// missing file, a malformed line, invalid base64, a negative or repeated rank, or an empty file.
std::vector<std::optional<std::string>> read_tiktoken_ranks(const std::string& path);

// type "TikTokenizer" accepts any of the encodings above; "Llama3Tokenizer" only Llama 3's. A directory holding
// tokenizer.model may be given instead of the file. Throws UsageError for an unrecognized rank count.
std::unique_ptr<BpeTokenizer> load_tiktoken_tokenizer(const std::string& path, const std::string& type);

}  // namespace primus
