// The tokenizer loaders and the encoder they build: Hugging Face tokenizer.json (with tokenizer_config.json
// beside it), GPT-2's vocab.json + merges.txt, and tiktoken rank files; a tokenizer that loads then encodes
// the input's text (with and without special-token matching) and decodes the ids back.
//
// Input: a mode byte, then
//   mode 0: tokenizer.json \n@@\n text [\n@@\n tokenizer_config.json]
//   mode 1: vocab.json \n@@\n merges.txt \n@@\n text
//   mode 2: tiktoken ranks \n@@\n text
#include <memory>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/tiktoken_tokenizer.h"
#include "fuzz_input.h"

namespace {

void exercise(const primus::Tokenizer& tokenizer, std::string_view text) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  (void)tokenizer.decode(ids);
  ids = tokenizer.encode_with_specials(text);
  (void)tokenizer.decode(ids);
  // Ids from the raw bytes, most of them outside the vocabulary: decode must refuse those cleanly.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 4 <= text.size() && raw.size() < 16; i += 4) {
    raw.push_back(static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint8_t>(text[i])) |
                                       static_cast<uint32_t>(static_cast<uint8_t>(text[i + 1])) << 8 |
                                       static_cast<uint32_t>(static_cast<uint8_t>(text[i + 2])) << 16 |
                                       static_cast<uint32_t>(static_cast<uint8_t>(text[i + 3])) << 24));
  }
  primus::fuzz::expect_clean_errors([&] { (void)tokenizer.decode(raw); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string dir = primus::fuzz::fresh_scratch_dir("tokenizer");
  std::vector<std::string_view> parts = primus::fuzz::split_parts(input, 3);
  auto part = [&](size_t i) { return i < parts.size() ? parts[i] : std::string_view(); };
  primus::fuzz::expect_clean_errors([&] {
    std::unique_ptr<primus::BpeTokenizer> tokenizer;
    std::string_view text;
    if (mode == 0) {
      primus::fuzz::write_scratch("tokenizer/tokenizer.json", part(0));
      if (parts.size() > 2) primus::fuzz::write_scratch("tokenizer/tokenizer_config.json", part(2));
      tokenizer = primus::load_hf_tokenizer(dir);
      text = part(1);
    } else if (mode == 1) {
      primus::fuzz::write_scratch("tokenizer/vocab.json", part(0));
      primus::fuzz::write_scratch("tokenizer/merges.txt", part(1));
      tokenizer = primus::load_gpt2_bpe_tokenizer(dir);
      text = part(2);
    } else {
      // A rank file is recognized by its count of ranks (50,256 at least), which no small input reaches: the
      // line reader is what gets fuzzed here.
      const std::string path = primus::fuzz::write_scratch("tokenizer/tokenizer.model", part(0));
      (void)primus::read_tiktoken_ranks(path);
      tokenizer = primus::load_tiktoken_tokenizer(path, "TikTokenizer");
      text = part(1);
    }
    exercise(*tokenizer, text);
  });
  return 0;
}
