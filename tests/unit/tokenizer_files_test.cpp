// Loading tokenizers from files made here: the factory's checks, tiktoken rank files (encoding detection,
// Meta's Llama 3 chunking, line-numbered errors), tokenizer.json (fields, NFC, prefix space, added tokens,
// tokenizer_config.json, field-named errors), vocab.json + merges.txt, and SentencePiece model errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "data/bpe_text.h"
#include "data/tokenizer.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Expects `fn` to throw UsageError whose message contains every fragment.
template <typename F>
void expect_usage_error(F&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected UsageError";
  } catch (const UsageError& e) {
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// A rank file of `count` tokens: the 256 bytes, space runs of 2, 4, 8, 16 (ranks 256-259), " x" (260), "00"
// (261), "000" (262), then distinct 4-byte fillers starting with 0xFF (which never meet the test texts).
std::string rank_file(size_t count) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (int n : {2, 4, 8, 16}) tokens.push_back(std::string(n, ' '));
  for (const char* t : {" x", "00", "000"}) tokens.push_back(t);
  for (uint32_t i = 0; tokens.size() < count; ++i) {
    tokens.push_back(std::string("\xff") + static_cast<char>(i >> 16) + static_cast<char>(i >> 8) +
                     static_cast<char>(i));
  }
  std::string text;
  for (size_t rank = 0; rank < tokens.size(); ++rank) text += base64(tokens[rank]) + " " + std::to_string(rank) + "\n";
  return text;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(MakeTokenizer, ChecksTypeAndModelPath) {
  const std::vector<std::string> known = known_tokenizer_types();
  for (const char* type : {"HuggingFaceTokenizer", "GPT2BPETokenizer", "TikTokenizer", "Llama3Tokenizer",
                           "SentencePieceTokenizer", "Llama2Tokenizer"}) {
    EXPECT_NE(std::find(known.begin(), known.end(), type), known.end()) << type;
    EXPECT_TRUE(tokenizer_needs_model(type));
    expect_usage_error([&] { make_tokenizer(type); }, {type, "needs a model"});
    expect_usage_error([&] { make_tokenizer(type, "/nonexistent/primus/tok"); }, {"/nonexistent/primus/tok"});
  }
  EXPECT_FALSE(tokenizer_needs_model("ByteLevelTokenizer"));
  expect_usage_error([] { make_tokenizer("ByteLevelTokenizer", "x.model"); }, {"x.model"});
  expect_usage_error([] { make_tokenizer("Llama4Tokenizer", "x"); }, {"Llama4Tokenizer", "HuggingFaceTokenizer"});
}

TEST(TiktokenFile, Llama3ChunkingCutsLongWhitespaceRuns) {
  const fs::path dir = testing::temp_dir("tok-llama3");
  write_file(dir / "tokenizer.model", rank_file(128000));
  auto tok = make_tokenizer("Llama3Tokenizer", dir.string());
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->eod_id(), 128001);
  EXPECT_EQ(tok->bos_id(), 128000);
  // 30,000 digits: Meta cuts after 25,000, so the regex's \p{N}{1,3} groups restart there: 8333 x "000" + "0",
  // then 1666 x "000" + "00", where one text would give 10,000 x "000".
  const std::string text(30000, '0');
  const std::vector<int32_t> ids = tok->encode(text);
  EXPECT_EQ(ids, concat(tok->encode(std::string(25000, '0')), tok->encode(std::string(5000, '0'))));
  ASSERT_EQ(ids.size(), 10001u);
  EXPECT_EQ(ids[8333], '0');
  EXPECT_EQ(ids.back(), 261);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 262), 9999);
  EXPECT_EQ(tok->decode(ids), text);
  // Special-token text is text for encode and the token for encode_with_specials.
  const std::vector<int32_t> plain = tok->encode("a<|eot_id|>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 128009), 0);
  EXPECT_EQ(tok->encode_with_specials("a<|eot_id|>").back(), 128009);
  EXPECT_EQ(tok->decode(std::vector<int32_t>{128009, 128255}), "<|eot_id|><|reserved_special_token_247|>");
}

TEST(TiktokenFile, RecognizesEncodingsByRankCount) {
  const fs::path dir = testing::temp_dir("tok-ranks");
  write_file(dir / "cl100k.tiktoken", rank_file(100256));
  auto cl = make_tokenizer("TikTokenizer", (dir / "cl100k.tiktoken").string());
  EXPECT_EQ(cl->vocab_size(), 100277);
  EXPECT_EQ(cl->eod_id(), 100257);
  EXPECT_EQ(cl->encode_with_specials("<|fim_middle|>"), std::vector<int32_t>{100259});
  expect_usage_error([&] { make_tokenizer("Llama3Tokenizer", (dir / "cl100k.tiktoken").string()); },
                     {"cl100k_base", "128000", "TikTokenizer"});
  write_file(dir / "odd.tiktoken", rank_file(300));
  expect_usage_error([&] { make_tokenizer("TikTokenizer", (dir / "odd.tiktoken").string()); },
                     {"odd.tiktoken", "300 ranks"});
}

TEST(TiktokenFile, MalformedLinesNameFileAndLine) {
  const fs::path dir = testing::temp_dir("tok-badranks");
  const std::string good = base64("a") + " 0\n" + base64("b") + " 1\n";
  const std::pair<std::string, std::string> cases[] = {
      {good + "not*base64 2\n", ":3:"},      {good + base64("c") + "\n", ":3:"},
      {good + base64("c") + " -4\n", ":3:"}, {good + base64("c") + " 1\n", "appears twice"},
      {good + base64("c") + " 7x\n", ":3:"}, {"", "no ranks"}};
  for (const auto& [text, fragment] : cases) {
    write_file(dir / "bad.tiktoken", text);
    expect_usage_error([&] { make_tokenizer("TikTokenizer", (dir / "bad.tiktoken").string()); },
                       {"bad.tiktoken", fragment});
  }
}

// A small byte-level tokenizer.json: the 256 bytes, then tokens built by `merges` (space-separated byte strings,
// spelled with the byte-level alphabet), ids in merge order after the bytes.
json small_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[byte_level_encode(a + b)] = next++;
    merge_list.push_back(json::array({byte_level_encode(a), byte_level_encode(b)}));
  }
  return json{{"version", "1.0"},
              {"added_tokens", json::array({json{{"id", 1000}, {"content", "<|endoftext|>"}, {"special", true}},
                                            json{{"id", 1001}, {"content", "[tool]"}, {"special", false}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 json::array({json{{"type", "Split"},
                                   {"pattern", {{"Regex", R"( ?\p{L}+| ?\p{N}+|\s+(?!\S)|\s+|[^\s\p{L}\p{N}]+)"}}},
                                   {"behavior", "Isolated"},
                                   {"invert", false}},
                              json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}, {"ignore_merges", false}}}};
}

const std::vector<std::pair<std::string, std::string>> kMerges = {{"h", "e"},          {"l", "l"}, {"he", "ll"},
                                                                  {"hell", "o"},       {" ", "w"}, {"\xc3", "\xa9"},
                                                                  {"caf", "\xc3\xa9"}, {"c", "a"}, {"ca", "f"}};

TEST(HuggingFaceFile, EncodesWithMergesAndAddedTokens) {
  const fs::path dir = testing::temp_dir("tok-hf");
  write_file(dir / "tokenizer.json", small_tokenizer_json(kMerges).dump());
  auto tok = make_tokenizer("HuggingFaceTokenizer", dir.string());
  EXPECT_EQ(tok->vocab_size(), 1002);
  EXPECT_EQ(tok->eod_id(), 1000);  // no tokenizer_config.json: the <|endoftext|> added token
  EXPECT_EQ(tok->encode("hello"), std::vector<int32_t>{259});
  EXPECT_EQ(tok->encode("café"), std::vector<int32_t>{262});
  EXPECT_EQ(tok->encode("hello [tool]<|endoftext|>"),
            (std::vector<int32_t>{259, ' ', 1001, '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'}));
  EXPECT_EQ(tok->encode_with_specials("hello<|endoftext|>"), (std::vector<int32_t>{259, 1000}));
  // Without NFC a decomposed é stays two code points and cannot use the merged token.
  EXPECT_NE(tok->encode("cafe\u0301"), tok->encode("café"));
  EXPECT_EQ(tok->decode(tok->encode("cafe\u0301 ☃")), "cafe\u0301 ☃");
}

TEST(HuggingFaceFile, NfcPrefixSpaceStringMergesAndConfig) {
  const fs::path dir = testing::temp_dir("tok-hf2");
  json j = small_tokenizer_json(kMerges);
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFC"}}})}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  json string_merges = json::array();
  for (const json& m : j["model"]["merges"])
    string_merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  j["model"]["merges"] = string_merges;
  write_file(dir / "tokenizer.json", j.dump());
  write_file(dir / "tokenizer_config.json", R"({"eos_token": {"content": "[tool]"}, "bos_token": "<|endoftext|>"})");
  auto tok = make_tokenizer("HuggingFaceTokenizer", (dir / "tokenizer.json").string());
  EXPECT_EQ(tok->eod_id(), 1001);
  EXPECT_EQ(tok->bos_id(), 1000);
  EXPECT_EQ(tok->encode("cafe\u0301"), tok->encode("café"));  // NFC first
  EXPECT_EQ(tok->encode("world"), tok->encode(" world"));     // the prefix space
  EXPECT_EQ(tok->encode("world").front(), 260);               // " w"
}

TEST(HuggingFaceFile, ErrorsNameTheField) {
  const fs::path dir = testing::temp_dir("tok-hf-bad");
  const fs::path file = dir / "tokenizer.json";
  const auto expect_error = [&](const json& j, std::initializer_list<std::string> fragments) {
    write_file(file, j.dump());
    std::vector<std::string> all(fragments);
    all.push_back("tokenizer.json");
    try {
      make_tokenizer("HuggingFaceTokenizer", file.string());
      ADD_FAILURE() << "expected UsageError for " << *fragments.begin();
    } catch (const UsageError& e) {
      for (const std::string& f : all) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  };
  json j = small_tokenizer_json(kMerges);
  j["model"]["merges"][1] = json::array({"l", "zzz"});
  expect_error(j, {"model.merges[1]", "zzz"});
  j = small_tokenizer_json(kMerges);
  j["model"]["type"] = "Unigram";
  expect_error(j, {"model.type", "Unigram"});
  j = small_tokenizer_json(kMerges);
  j["model"]["byte_fallback"] = true;
  expect_error(j, {"model.byte_fallback", "SentencePieceTokenizer"});
  j = small_tokenizer_json(kMerges);
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}};
  expect_error(j, {"pre_tokenizer.pretokenizers[0].type", "Whitespace"});
  j = small_tokenizer_json(kMerges);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(j, {"pre_tokenizer.pretokenizers[0].pattern.Regex", "offset"});
  j = small_tokenizer_json(kMerges);
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(j, {"normalizer.type", "NFKC"});
  j = small_tokenizer_json(kMerges);
  j["model"]["vocab"]["\u2581the"] = 999;
  expect_error(j, {"model.vocab", "byte-level"});
  j = small_tokenizer_json(kMerges);
  j["added_tokens"] = json::array();
  expect_error(j, {"end-of-document", "tokenizer_config.json"});
  j = small_tokenizer_json(kMerges);
  j["added_tokens"][0]["id"] = "x";
  expect_error(j, {"added_tokens[0].id"});
  write_file(file, "{\"model\": {\"type\": \"BPE\",,}}");
  expect_usage_error([&] { make_tokenizer("HuggingFaceTokenizer", file.string()); }, {"tokenizer.json", "byte"});
  // As fuzz/safetensors_fuzzer found for safetensors headers: nlohmann throws out_of_range, not parse_error, for a
  // number past a double's range.
  write_file(file, "{\"version\": 1e999}");
  expect_usage_error([&] { make_tokenizer("HuggingFaceTokenizer", file.string()); },
                     {"tokenizer.json", "a number outside the range of a double"});
}

TEST(Gpt2BpeFiles, LoadsAndNamesBadMergeLines) {
  const fs::path dir = testing::temp_dir("tok-gpt2");
  const json j = small_tokenizer_json(kMerges);
  json vocab = j["model"]["vocab"];
  vocab["<|endoftext|>"] = 1000;
  write_file(dir / "vocab.json", vocab.dump());
  std::string merges = "#version: 0.2\n";
  for (const json& m : j["model"]["merges"]) merges += m[0].get<std::string>() + " " + m[1].get<std::string>() + "\n";
  write_file(dir / "merges.txt", merges);
  auto tok = make_tokenizer("GPT2BPETokenizer", dir.string());
  EXPECT_EQ(tok->eod_id(), 1000);
  EXPECT_EQ(tok->encode("hello world"), (std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd'}));
  write_file(dir / "merges.txt", "#version: 0.2\nh e\nl l l\n");
  expect_usage_error([&] { make_tokenizer("GPT2BPETokenizer", dir.string()); }, {"merges.txt:3"});
  write_file(dir / "merges.txt", "h e\nq \xc4\x8a\xc4\x8a\n");
  expect_usage_error([&] { make_tokenizer("GPT2BPETokenizer", dir.string()); }, {"merges.txt:2", "not in vocab.json"});
}

TEST(SentencePieceFile, MissingOrCorruptModelIsUsageError) {
  const fs::path dir = testing::temp_dir("tok-sp");
  expect_usage_error([&] { make_tokenizer("Llama2Tokenizer", (dir / "tokenizer.model").string()); },
                     {"tokenizer.model", "cannot open"});
  Rng rng(0x5EED);
  std::string garbage(4096, '\0');
  for (char& c : garbage) c = static_cast<char>(rng.below(256));
  write_file(dir / "tokenizer.model", garbage);
  expect_usage_error([&] { make_tokenizer("SentencePieceTokenizer", dir.string()); },
                     {"tokenizer.model", "not a SentencePiece model"});
}

}  // namespace
}  // namespace primus
