// Byte-level BPE engine against plain reference implementations on random vocabularies (both merge orders, short
// and long pieces), the PCRE2 pre-tokenizer, Meta's Llama 3 chunking, NFC, byte-level spelling and threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "data/bpe_encoder.h"
#include "data/bpe_regex.h"
#include "data/bpe_text.h"
#include "data/bpe_tokenizer.h"

namespace primus {
namespace {

// A random vocabulary: the 256 bytes plus `merges` tokens made by joining two earlier tokens, biased to the
// letters a-e so random text over them meets many merges. Ids are a random permutation, so merge order and id
// order differ.
struct RandomVocab {
  std::vector<std::optional<std::string>> tokens;   // by id
  std::vector<std::pair<int32_t, int32_t>> merges;  // in priority order
};

RandomVocab random_vocab(Rng& rng, int merges) {
  std::vector<std::string> made;
  for (int b = 0; b < 256; ++b) made.push_back(std::string(1, static_cast<char>(b)));
  std::vector<std::pair<size_t, size_t>> made_merges;
  std::set<std::string> seen(made.begin(), made.end());
  while (static_cast<int>(made_merges.size()) < merges) {
    const auto pick = [&]() -> size_t {
      if (rng.uniform() < 0.4) return 'a' + rng.below(5);
      return made.size() > 256 && rng.uniform() < 0.8 ? 256 + rng.below(made.size() - 256) : 'a' + rng.below(5);
    };
    const size_t l = pick(), r = pick();
    const std::string joined = made[l] + made[r];
    if (joined.size() > 12 || !seen.insert(joined).second) continue;
    made.push_back(joined);
    made_merges.emplace_back(l, r);
  }
  std::vector<int32_t> id_of(made.size());
  for (size_t i = 0; i < made.size(); ++i) id_of[i] = static_cast<int32_t>(i);
  for (size_t i = made.size() - 1; i > 0; --i) std::swap(id_of[i], id_of[rng.below(i + 1)]);
  RandomVocab v;
  v.tokens.resize(made.size());
  for (size_t i = 0; i < made.size(); ++i) v.tokens[id_of[i]] = made[i];
  for (const auto& [l, r] : made_merges) v.merges.emplace_back(id_of[l], id_of[r]);
  return v;
}

std::map<std::string, int32_t> token_ids(const RandomVocab& v) {
  std::map<std::string, int32_t> ids;
  for (size_t id = 0; id < v.tokens.size(); ++id) ids.emplace(*v.tokens[id], static_cast<int32_t>(id));
  return ids;
}

// tiktoken's rule, spelled out: merge the adjacent pair whose concatenation has the lowest rank (= id), leftmost.
std::vector<int32_t> reference_rank_bpe(const RandomVocab& v, const std::string& piece, bool whole_first) {
  const auto ids = token_ids(v);
  if (whole_first && ids.count(piece)) return {ids.at(piece)};
  std::vector<std::string> parts;
  for (char c : piece) parts.push_back(std::string(1, c));
  for (;;) {
    int32_t best_rank = INT_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = ids.find(parts[i] + parts[i + 1]);
      if (it != ids.end() && it->second < best_rank) best_rank = it->second, best = i;
    }
    if (best_rank == INT_MAX) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  std::vector<int32_t> out;
  for (const auto& p : parts) out.push_back(ids.at(p));
  return out;
}

// Hugging Face's rule: merge the adjacent pair listed first in merges, leftmost.
std::vector<int32_t> reference_merge_list_bpe(const RandomVocab& v, const std::string& piece, bool whole_first) {
  const auto ids = token_ids(v);
  if (whole_first && ids.count(piece)) return {ids.at(piece)};
  std::map<std::pair<int32_t, int32_t>, int32_t> rank;
  for (size_t i = 0; i < v.merges.size(); ++i) rank.emplace(v.merges[i], static_cast<int32_t>(i));
  std::vector<int32_t> parts;
  for (char c : piece) parts.push_back(ids.at(std::string(1, c)));
  for (;;) {
    int32_t best_rank = INT_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = rank.find({parts[i], parts[i + 1]});
      if (it != rank.end() && it->second < best_rank) best_rank = it->second, best = i;
    }
    if (best_rank == INT_MAX) break;
    parts[best] = ids.at(*v.tokens[parts[best]] + *v.tokens[parts[best + 1]]);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return parts;
}

std::string random_text(Rng& rng, size_t length) {
  std::string s(length, 'a');
  for (char& c : s)
    c = rng.uniform() < 0.95 ? static_cast<char>('a' + rng.below(5)) : static_cast<char>(rng.below(256));
  return s;
}

TEST(BytePairEncoder, MatchesReferenceRulesOnRandomVocabularies) {
  Rng rng(0x7B0C);
  for (int trial = 0; trial < 6; ++trial) {
    const RandomVocab v = random_vocab(rng, 150 + static_cast<int>(rng.below(300)));
    for (const bool whole_first : {false, true}) {
      BytePairEncoder by_rank(v.tokens, BytePairEncoder::MergeOrder::kTokenRank, {}, whole_first, "random");
      BytePairEncoder by_list(v.tokens, BytePairEncoder::MergeOrder::kMergeList, v.merges, whole_first, "random");
      for (int i = 0; i < 60; ++i) {
        // Lengths on both sides of the short/long switch (48 bytes), and pieces that are whole tokens.
        std::string piece = i % 10 == 0 ? *v.tokens[256 + rng.below(v.tokens.size() - 256)]
                                        : random_text(rng, 1 + rng.below(i % 2 ? 40 : 300));
        for (int repeat = 0; repeat < 2; ++repeat) {  // the second pass is answered by the piece cache
          std::vector<int32_t> got;
          got.push_back(-7);  // encode_piece appends
          by_rank.encode_piece(piece, got);
          got.erase(got.begin());
          ASSERT_EQ(got, reference_rank_bpe(v, piece, whole_first)) << "rank order, piece of " << piece.size();
          got.clear();
          by_list.encode_piece(piece, got);
          ASSERT_EQ(got, reference_merge_list_bpe(v, piece, whole_first)) << "merge list, piece of " << piece.size();
        }
      }
    }
  }
}

TEST(BytePairEncoder, RejectsVocabularyWithoutAllBytes) {
  std::vector<std::optional<std::string>> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(b == 0x7F ? std::nullopt : std::optional(std::string(1, char(b))));
  try {
    BytePairEncoder(tokens, BytePairEncoder::MergeOrder::kTokenRank, {}, true, "vocab.txt");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("0x7F"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocab.txt"), std::string::npos) << e.what();
  }
}

constexpr const char* kCl100k =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> split(const PretokenRegex& re, std::string_view text) {
  std::vector<std::string_view> pieces;
  re.split(text, pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

TEST(PretokenRegex, SplitsLikeTiktoken) {
  PretokenRegex re(kCl100k, "test");
  using V = std::vector<std::string>;
  EXPECT_EQ(split(re, "Hello world's END'LL  12345!!\n\n"),
            (V{"Hello", " world", "'s", " END", "'LL", " ", " ", "123", "45", "!!\n\n"}));
  EXPECT_EQ(split(re, "Grüße, 世界!  \t x"), (V{"Grüße", ",", " 世界", "!", "  \t", " x"}));
  EXPECT_EQ(split(re, "a\r\n\r\nb   "), (V{"a", "\r\n\r\n", "b", "   "}));
  EXPECT_TRUE(split(re, "").empty());
}

// \s is Unicode White_Space as in Rust tiktoken and Hugging Face (Oniguruma): U+0085 is whitespace, U+FEFF is not.
// JavaScript's \s says the opposite for both, which is why the npm parity corpus leaves them out.
TEST(PretokenRegex, WhitespaceClassIsUnicodeWhiteSpace) {
  PretokenRegex re(kCl100k, "test");
  using V = std::vector<std::string>;
  EXPECT_EQ(split(re, "a\u0085\u0085b"), (V{"a", "\u0085", "\u0085b"}));
  EXPECT_EQ(split(re, "a\ufeff\ufeffb"), (V{"a", "\ufeff\ufeff", "b"}));
  EXPECT_EQ(split(re, "a\u3000\u00a0b"), (V{"a", "\u3000", "\u00a0b"}));
}

TEST(PretokenRegex, InvalidUtf8BecomesGapPiecesThatRoundTrip) {
  PretokenRegex re(kCl100k, "test");
  Rng rng(0xBAD8);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text = random_text(rng, rng.below(80));
    for (char& c : text) {
      if (rng.uniform() < 0.2) c = static_cast<char>(0x80 + rng.below(128));  // stray continuation / lead bytes
      if (rng.uniform() < 0.1) c = ' ';
    }
    std::string joined;
    for (const std::string& p : split(re, text)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, text);
  }
}

TEST(PretokenRegex, BadPatternIsUsageErrorWithOffset) {
  try {
    PretokenRegex re("abc(?<", "tokenizer.json: pre_tokenizer.pattern.Regex");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("pre_tokenizer.pattern.Regex"), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset"), std::string::npos) << msg;
  }
}

TEST(PretokenRegex, LongWhitespaceRunsDoNotExhaustTheJitStack) {
  PretokenRegex re(kCl100k, "test");
  const std::string text = std::string(300000, ' ') + "x" + std::string(200000, '\n');
  std::string joined;
  for (const std::string& p : split(re, text)) joined += p;
  EXPECT_EQ(joined, text);
}

TEST(Llama3Chunks, CutsRunsLongerThan25000AndChunksAt400000Chars) {
  auto sizes = [](std::string_view text) {
    std::vector<size_t> out;
    for (std::string_view c : llama3_chunks(text)) out.push_back(c.size());
    return out;
  };
  using V = std::vector<size_t>;
  EXPECT_TRUE(llama3_chunks("").empty());
  EXPECT_EQ(sizes(std::string(25000, 'a')), (V{25000}));
  EXPECT_EQ(sizes(std::string(25001, 'a')), (V{25000, 1}));
  EXPECT_EQ(sizes(std::string(60000, ' ')), (V{25000, 25000, 10000}));
  // A run is counted per character: "é" is one character in two bytes, NBSP (U+00A0) is whitespace.
  std::string accents;
  for (int i = 0; i < 25003; ++i) accents += "é";
  EXPECT_EQ(sizes(accents), (V{50000, 6}));
  std::string nbsp = "x";
  for (int i = 0; i < 25001; ++i) nbsp += "\u00a0";
  EXPECT_EQ(sizes(nbsp), (V{1 + 2 * 25000, 2}));
  // Alternating runs never cut; 400,000 characters make a chunk.
  std::string alternating;
  while (alternating.size() < 400010) alternating += "ab ";
  alternating.resize(400010);
  EXPECT_EQ(sizes(alternating), (V{400000, 10}));
  size_t total = 0;
  for (size_t s : sizes(alternating)) total += s;
  EXPECT_EQ(total, alternating.size());
}

TEST(TextHelpers, ByteLevelSpellingRoundTripsAllBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = byte_level_encode(all);
  EXPECT_EQ(byte_level_encode(" "), "\u0120");   // Ġ
  EXPECT_EQ(byte_level_encode("\n"), "\u010a");  // Ċ
  EXPECT_EQ(byte_level_encode("A~"), "A~");
  ASSERT_TRUE(byte_level_decode(spelled));
  EXPECT_EQ(*byte_level_decode(spelled), all);
  EXPECT_FALSE(byte_level_decode("\u2581hello"));  // SentencePiece's ▁ is not in the alphabet
}

TEST(TextHelpers, NfcComposesAndLeavesOtherTextAlone) {
  EXPECT_EQ(nfc_normalize("e\u0301"), "\u00e9");
  EXPECT_EQ(nfc_normalize("Cafe\u0301 A\u030a"), "Caf\u00e9 \u00c5");
  EXPECT_EQ(nfc_normalize("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc_normalize("\u00e9\u4e16"), "\u00e9\u4e16");
  const std::string invalid = "e\u0301\xff";
  EXPECT_EQ(nfc_normalize(invalid), invalid);
  EXPECT_TRUE(python_isspace(0x3000));
  EXPECT_TRUE(python_isspace(0x1C));
  EXPECT_TRUE(python_isspace(0x85));
  EXPECT_FALSE(python_isspace(0x200B));
  EXPECT_FALSE(python_isspace(0xFEFF));
}

// A BpeTokenizer over a random vocabulary and the cl100k regex, for the pipeline tests below.
std::unique_ptr<BpeTokenizer> small_tokenizer(Rng& rng, std::vector<AddedToken> added) {
  const RandomVocab v = random_vocab(rng, 200);
  BpeTokenizer::Options o;
  o.name = "test";
  o.patterns.push_back({kCl100k, "test"});
  o.added = std::move(added);
  o.eod_id = 300;
  return std::make_unique<BpeTokenizer>(
      BytePairEncoder(v.tokens, BytePairEncoder::MergeOrder::kTokenRank, {}, true, "test"), std::move(o));
}

TEST(BpeTokenizer, AddedTokensSpecialOnlyWithSpecialsOthersAlways) {
  Rng rng(0xADD);
  auto tok = small_tokenizer(rng, {AddedToken{.content = "<|end|>", .id = 500, .special = true},
                                   AddedToken{.content = "<tool>", .id = 501, .special = false},
                                   AddedToken{.content = "<|end|>xx", .id = 502, .special = true}});
  EXPECT_EQ(tok->vocab_size(), 503);
  const std::string text = "ab<|end|>cd<tool>e<|end|>xxf";
  const std::vector<int32_t> plain = tok->encode(text);
  const std::vector<int32_t> specials = tok->encode_with_specials(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 500), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 501), 1);
  EXPECT_EQ(std::count(specials.begin(), specials.end(), 500), 1);
  EXPECT_EQ(std::count(specials.begin(), specials.end(), 502), 1);  // leftmost-longest
  EXPECT_EQ(tok->decode(plain), text);
  EXPECT_EQ(tok->decode(specials), text);
  EXPECT_EQ(tok->token_id("<tool>"), 501);
}

TEST(BpeTokenizer, AddedTokenStripAndSingleWord) {
  Rng rng(0x57);
  auto tok = small_tokenizer(rng, {AddedToken{.content = "<m>", .id = 600, .lstrip = true, .rstrip = true},
                                   AddedToken{.content = "cat", .id = 601, .special = false, .single_word = true}});
  const std::vector<int32_t> ids = tok->encode_with_specials("a  <m>  b");
  const std::vector<int32_t> expected_tail = tok->encode("b");
  ASSERT_GE(ids.size(), 3u);
  const std::vector<int32_t> a = tok->encode("a");
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(a.size())), a);
  EXPECT_EQ(ids[a.size()], 600);  // the spaces on both sides went into the match
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(a.size()) + 1, ids.end()), expected_tail);
  const std::vector<int32_t> word = tok->encode("a cat b");
  const std::vector<int32_t> inside = tok->encode("concatenate");
  EXPECT_EQ(std::count(word.begin(), word.end(), 601), 1);
  EXPECT_EQ(std::count(inside.begin(), inside.end(), 601), 0);
}

TEST(BpeTokenizer, DecodeRejectsUnknownIdsAndRoundTripsRandomBytes) {
  Rng rng(0xDEC);
  auto tok = small_tokenizer(rng, {});
  for (int trial = 0; trial < 100; ++trial) {
    std::string bytes(rng.below(300), '\0');
    for (char& c : bytes) c = static_cast<char>(rng.below(256));
    ASSERT_EQ(tok->decode(tok->encode(bytes)), bytes);
  }
  try {
    tok->decode(std::vector<int32_t>{1, 2, 100000});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
}

TEST(BpeTokenizer, ThreadsEncodeConcurrentlyWithTheSameResult) {
  Rng rng(0x7777);
  auto tok = small_tokenizer(rng, {});
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_text(rng, 200 + rng.below(800)));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok->encode(t));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) mismatches[w] += tok->encode(texts[i]) != expected[i];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(mismatches[w], 0) << "thread " << w;
}

}  // namespace
}  // namespace primus
