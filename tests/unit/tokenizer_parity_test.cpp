// Parity with real tokenizer implementations: tests/tokenizer_parity/prepare.sh installs the pinned npm packages
// that ship real vocabularies and encoders (js-tiktoken: cl100k_base, o200k_base, r50k_base; llama3-tokenizer-js;
// llama-tokenizer-js for Llama 2), exports each vocabulary into the files users have (rank files, tokenizer.json,
// vocab.json + merges.txt, a SentencePiece tokenizer.model) and encodes tinyshakespeare plus a generated varied
// corpus (about 1.8 MB in all). Every tokenizer type loaded from those files must give the same ids for every
// document (zero mismatches) and decode back to the text.
//
// The fixtures are prepared once per build directory (<build>/tests/tokenizer_parity_data, or
// $PRIMUS_TOKENIZER_PARITY_DIR); later runs reuse them while the inputs are unchanged.
// DISABLED_EncodeSpeed is the benchmark behind docs/perf/tokenizer.md:
//   tokenizer_parity_test --gtest_also_run_disabled_tests --gtest_filter='*EncodeSpeed*'
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/tokenizer.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct Corpus {
  std::vector<std::string> plain;
  std::vector<std::string> special;
};

class TokenizerParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* env = std::getenv("PRIMUS_TOKENIZER_PARITY_DIR");
    dir_ = env ? fs::path(env) : fs::read_symlink("/proc/self/exe").parent_path() / "tokenizer_parity_data";
    const fs::path script = fs::path(PRIMUS_SOURCE_DIR) / "tests" / "tokenizer_parity" / "prepare.sh";
    const std::string command =
        fmt::format("'{}' '{}' '{}' >&2", script.string(), dir_.string(), testing::shakespeare_path());
    prepare_status_ = std::system(command.c_str());
    if (prepare_status_ != 0) return;
    const json docs = json::parse(read_text(dir_ / "docs.json"));
    corpus_.plain = docs.at("plain").get<std::vector<std::string>>();
    corpus_.special = docs.at("special").get<std::vector<std::string>>();
  }

  void SetUp() override {
    ASSERT_EQ(prepare_status_, 0) << "tests/tokenizer_parity/prepare.sh failed (needs node and npm: "
                                     "scripts/setup.sh --test) for "
                                  << dir_;
  }

  // Encodes every corpus document with `tok` and compares with the reference ids in expected/<name>.json.
  void expect_parity(const Tokenizer& tok, const std::string& name) {
    const json expected = json::parse(read_text(dir_ / "expected" / (name + ".json")));
    compare(tok, corpus_.plain, expected.at("plain"), false, name + " plain");
    if (expected.contains("special")) compare(tok, corpus_.special, expected.at("special"), true, name + " special");
  }

  static void compare(const Tokenizer& tok, const std::vector<std::string>& docs, const json& expected,
                      bool with_specials, const std::string& what) {
    ASSERT_EQ(expected.size(), docs.size()) << what;
    size_t mismatches = 0;
    size_t bad_round_trips = 0;
    size_t bytes = 0;
    size_t tokens = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const std::vector<int32_t> ids = with_specials ? tok.encode_with_specials(docs[d]) : tok.encode(docs[d]);
      const std::vector<int32_t> want = expected[d].get<std::vector<int32_t>>();
      bytes += docs[d].size();
      tokens += ids.size();
      if (ids != want && mismatches++ < 3) {
        size_t i = 0;
        while (i < ids.size() && i < want.size() && ids[i] == want[i]) ++i;
        const auto window = [&](const std::vector<int32_t>& v) {
          std::string s;
          for (size_t k = i; k < v.size() && k < i + 6; ++k) {
            s += fmt::format("{}({:?}) ", v[k], tok.decode(std::span<const int32_t>(&v[k], 1)));
          }
          return s;
        };
        ADD_FAILURE() << what << ": document " << d << " differs at token " << i << " of " << want.size()
                      << "\n  ours:      " << window(ids) << "\n  reference: " << window(want);
      }
      if (tok.decode(ids) != docs[d] && bad_round_trips++ < 3) {
        ADD_FAILURE() << what << ": document " << d << " does not round-trip through decode";
      }
    }
    EXPECT_EQ(mismatches, 0u) << what << ": documents whose ids differ from the reference";
    EXPECT_EQ(bad_round_trips, 0u) << what << ": documents where decode(encode(x)) != x";
    std::cerr << fmt::format("[parity] {}: {} documents, {:.2f} MB, {} tokens, {} mismatches\n", what, docs.size(),
                             bytes / 1e6, tokens, mismatches);
  }

  static inline fs::path dir_;
  static inline int prepare_status_ = -1;
  static inline Corpus corpus_;
};

TEST_F(TokenizerParity, TikTokenizerCl100kBase) {
  auto tok = make_tokenizer("TikTokenizer", (dir_ / "cl100k_base.tiktoken").string());
  EXPECT_EQ(tok->vocab_size(), 100277);
  EXPECT_EQ(tok->eod_id(), 100257);
  expect_parity(*tok, "cl100k_base");
}

TEST_F(TokenizerParity, TikTokenizerO200kBase) {
  auto tok = make_tokenizer("TikTokenizer", (dir_ / "o200k_base.tiktoken").string());
  EXPECT_EQ(tok->vocab_size(), 200019);
  EXPECT_EQ(tok->eod_id(), 199999);
  expect_parity(*tok, "o200k_base");
}

TEST_F(TokenizerParity, TikTokenizerR50kBase) {
  auto tok = make_tokenizer("TikTokenizer", (dir_ / "r50k_base.tiktoken").string());
  EXPECT_EQ(tok->vocab_size(), 50257);
  expect_parity(*tok, "r50k_base");
}

TEST_F(TokenizerParity, Llama3TokenizerFromRankFile) {
  auto tok = make_tokenizer("Llama3Tokenizer", (dir_ / "llama3").string());  // the directory form
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->eod_id(), 128001);
  EXPECT_EQ(tok->bos_id(), 128000);
  expect_parity(*tok, "llama3");
}

TEST_F(TokenizerParity, HuggingFaceTokenizerLlama3Json) {
  auto tok = make_tokenizer("HuggingFaceTokenizer", (dir_ / "llama3" / "tokenizer.json").string());
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->eod_id(), 128001);  // tokenizer_config.json eos_token
  EXPECT_EQ(tok->bos_id(), 128000);
  expect_parity(*tok, "llama3");
}

TEST_F(TokenizerParity, HuggingFaceTokenizerGpt2JsonWithStringMerges) {
  auto tok = make_tokenizer("HuggingFaceTokenizer", (dir_ / "gpt2").string());
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eod_id(), 50256);  // no tokenizer_config.json: the <|endoftext|> added token
  EXPECT_FALSE(tok->bos_id());
  expect_parity(*tok, "r50k_base");
}

TEST_F(TokenizerParity, Gpt2BpeTokenizerVocabAndMerges) {
  auto tok = make_tokenizer("GPT2BPETokenizer", (dir_ / "gpt2" / "vocab.json").string());
  EXPECT_EQ(tok->eod_id(), 50256);
  expect_parity(*tok, "r50k_base");
}

TEST_F(TokenizerParity, SentencePieceLlama2) {
  auto tok = make_tokenizer("Llama2Tokenizer", (dir_ / "llama2" / "tokenizer.model").string());
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->eod_id(), 2);
  EXPECT_EQ(tok->bos_id(), 1);
  expect_parity(*tok, "llama2");
}

// Not a timed test: prints single-thread encoding speed (MB per CPU-second) of English text next to the npm
// encoders' speed.
TEST_F(TokenizerParity, DISABLED_EncodeSpeed) {
  const std::string text = read_text(testing::shakespeare_path());
  // Megabytes per CPU-second of this thread, so that other processes on a shared machine do not count.
  // First pass: a fresh tokenizer's first encode (tables paged in, empty piece cache). Steady: repeated encodes.
  const auto cpu_seconds = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const auto speed = [&](const Tokenizer& tok) {
    double start = cpu_seconds();
    tok.encode(text);
    const double first = text.size() / (cpu_seconds() - start);
    int runs = 0;
    start = cpu_seconds();
    double seconds = 0;
    while (seconds < 3.0) {
      volatile size_t n = tok.encode(text).size();
      (void)n;
      ++runs;
      seconds = cpu_seconds() - start;
    }
    return std::pair(first / 1e6, text.size() * runs / seconds / 1e6);
  };
  const std::pair<const char*, fs::path> cases[] = {{"TikTokenizer", dir_ / "cl100k_base.tiktoken"},
                                                    {"TikTokenizer", dir_ / "o200k_base.tiktoken"},
                                                    {"Llama3Tokenizer", dir_ / "llama3/tokenizer.model"},
                                                    {"HuggingFaceTokenizer", dir_ / "llama3/tokenizer.json"},
                                                    {"GPT2BPETokenizer", dir_ / "gpt2"},
                                                    {"Llama2Tokenizer", dir_ / "llama2/tokenizer.model"}};
  for (const auto& [type, path] : cases) {
    auto tok = make_tokenizer(type, path.string());
    const auto [first, steady] = speed(*tok);
    std::cout << fmt::format("primus {} {}: first pass {:.1f} MB/cpu-s, steady {:.1f} MB/cpu-s\n", type,
                             path.filename().string(), first, steady);
  }
  const std::string command =
      fmt::format("cd '{}' && node bench.mjs '{}' 3", dir_.string(), testing::shakespeare_path());
  EXPECT_EQ(std::system(command.c_str()), 0);
}

}  // namespace
}  // namespace primus
