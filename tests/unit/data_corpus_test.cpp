// Text corpus loading (files, directories, errors) and Megatron split bounds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/text_corpus.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string random_bytes(Rng& rng, size_t n) {
  std::string s(n, '?');
  for (char& c : s) c = static_cast<char>(rng.below(256));
  return s;
}

std::string error_of(const std::vector<std::string>& paths) {
  ByteLevelTokenizer tok;
  try {
    load_text_corpus(paths, tok);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no UsageError>";
}

TEST(TextCorpus, DirectoryIsSortedRecursiveAndSkipsHidden) {
  Rng rng(0xC0);
  fs::path dir = testing::temp_dir("corpus");
  // Created out of order so that directory listing order and sorted order differ.
  std::string c = random_bytes(rng, 37), a = random_bytes(rng, 11), b = random_bytes(rng, 23), d = random_bytes(rng, 5);
  write(dir / "sub" / "c.txt", c);
  write(dir / "b.txt", b);
  write(dir / "a.txt", a);
  write(dir / "sub" / "deeper" / "d.bin", d);
  write(dir / ".hidden.txt", random_bytes(rng, 9));
  write(dir / ".git" / "objects.txt", random_bytes(rng, 9));
  write(dir / "empty.txt", "");

  ByteLevelTokenizer tok;
  TokenCorpus corpus = load_text_corpus({dir.string()}, tok);
  std::vector<std::string> expect_docs = {(dir / "a.txt").string(), (dir / "b.txt").string(),
                                          (dir / "sub" / "c.txt").string(),
                                          (dir / "sub" / "deeper" / "d.bin").string()};
  EXPECT_EQ(corpus.documents, expect_docs);
  std::vector<std::string> contents = {a, b, c, d};
  std::vector<int32_t> expect_tokens;
  std::vector<int64_t> expect_starts = {0};
  for (const std::string& text : contents) {
    for (unsigned char ch : text) expect_tokens.push_back(ch);
    expect_tokens.push_back(tok.eod_id());
    expect_starts.push_back(static_cast<int64_t>(expect_tokens.size()));
  }
  EXPECT_EQ(corpus.tokens, expect_tokens);
  EXPECT_EQ(corpus.document_starts, expect_starts);
  EXPECT_EQ(corpus.num_tokens(), 11 + 23 + 37 + 5 + 4);
}

TEST(TextCorpus, PathsKeepTheirGivenOrder) {
  Rng rng(0xC1);
  fs::path dir = testing::temp_dir("corpus-order");
  write(dir / "z.txt", random_bytes(rng, 4));
  write(dir / "dir" / "y.txt", random_bytes(rng, 6));
  ByteLevelTokenizer tok;
  TokenCorpus corpus = load_text_corpus({(dir / "z.txt").string(), (dir / "dir").string()}, tok);
  ASSERT_EQ(corpus.documents.size(), 2u);
  EXPECT_EQ(corpus.documents[0], (dir / "z.txt").string());
  EXPECT_EQ(corpus.documents[1], (dir / "dir" / "y.txt").string());
  EXPECT_EQ(corpus.tokens[4], tok.eod_id());
  EXPECT_EQ(corpus.tokens.back(), tok.eod_id());
  EXPECT_EQ(corpus.num_tokens(), 12);
}

TEST(TextCorpus, TinyShakespeare) {
  ByteLevelTokenizer tok;
  TokenCorpus corpus = load_text_corpus({testing::shakespeare_path()}, tok);
  ASSERT_EQ(corpus.num_tokens(), 1115395);
  EXPECT_EQ(corpus.tokens.back(), tok.eod_id());
  for (int64_t i = 0; i + 1 < corpus.num_tokens(); ++i) ASSERT_LT(corpus.tokens[static_cast<size_t>(i)], 256);
  std::span<const int32_t> head = corpus.slice({0, 14});
  EXPECT_EQ(tok.decode(head), "First Citizen:");
}

TEST(TextCorpus, Errors) {
  fs::path dir = testing::temp_dir("corpus-errors");
  std::string missing = (dir / "no-such-file.txt").string();
  EXPECT_EQ(error_of({missing}), "data_path: '" + missing + "' does not exist");
  write(dir / "empty" / "e.txt", "");
  write(dir / "empty" / ".hidden", "not read");
  std::string msg = error_of({(dir / "empty").string()});
  EXPECT_NE(msg.find("no text found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 files"), std::string::npos) << msg;
  fs::create_directories(dir / "nothing");
  msg = error_of({(dir / "nothing").string()});
  EXPECT_NE(msg.find("no text found"), std::string::npos) << msg;
  msg = error_of({});
  EXPECT_NE(msg.find("data_path"), std::string::npos) << msg;
}

TEST(SplitRange, MegatronWeightsOnOddTokenCount) {
  const int64_t n = 123457;
  TokenRange train = split_range(n, "969,30,1", kSplitTrain);
  TokenRange valid = split_range(n, "969,30,1", kSplitValid);
  TokenRange test = split_range(n, "969,30,1", kSplitTest);
  // round(0.969 * 123457) = round(119629.833) = 119630; round(0.999 * 123457) = round(123333.543) = 123334.
  EXPECT_EQ(train, (TokenRange{0, 119630}));
  EXPECT_EQ(valid, (TokenRange{119630, 123334}));
  EXPECT_EQ(test, (TokenRange{123334, n}));
  // Same weights, other spellings.
  EXPECT_EQ(split_range(n, "96.9/3/0.1", kSplitValid), valid);
  EXPECT_EQ(split_range(n, " 969 , 30 , 1 ", kSplitTest), test);
}

TEST(SplitRange, AllTrainAndShortForms) {
  const int64_t n = 123457;
  EXPECT_EQ(split_range(n, "1,0,0", kSplitTrain), (TokenRange{0, n}));
  EXPECT_EQ(split_range(n, "1,0,0", kSplitValid), (TokenRange{n, n}));
  EXPECT_EQ(split_range(n, "1,0,0", kSplitTest), (TokenRange{n, n}));
  EXPECT_EQ(split_range(n, "1", kSplitTrain), (TokenRange{0, n}));
  EXPECT_EQ(split_range(100, "9,1", kSplitValid), (TokenRange{90, 100}));
  EXPECT_EQ(split_range(100, "0,1,0", kSplitValid), (TokenRange{0, 100}));
  EXPECT_EQ(split_range(0, "969,30,1", kSplitValid), (TokenRange{0, 0}));
}

TEST(SplitRange, PartsTileTheStream) {
  Rng rng(0x5911);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t n = static_cast<int64_t>(rng.below(1000000));
    std::string split = fmt::format("{},{},{}", rng.below(1000), rng.below(100), 1 + rng.below(10));
    TokenRange t = split_range(n, split, kSplitTrain), v = split_range(n, split, kSplitValid),
               s = split_range(n, split, kSplitTest);
    ASSERT_EQ(t.begin, 0);
    ASSERT_EQ(t.end, v.begin);
    ASSERT_EQ(v.end, s.begin);
    ASSERT_EQ(s.end, n);
    ASSERT_LE(t.begin, t.end);
    ASSERT_LE(v.begin, v.end);
    ASSERT_LE(s.begin, s.end);
  }
}

TEST(SplitRange, MalformedSplitsAreUsageErrors) {
  for (const char* bad :
       {"", "969,30,x", "969,,1", "969,30,1,5", "-1,2,0", "0,0,0", "a", "969;30;1", "nan,1,1", "inf,1,1", "1,2/3"}) {
    try {
      split_range(1000, bad, kSplitTrain);
      ADD_FAILURE() << "no error for split '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("split: '" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace primus
