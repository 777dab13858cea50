// Tokenizer interface: ByteLevelTokenizer round trips, eod handling, the factory and vocabulary padding.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"

namespace primus {
namespace {

TEST(ByteLevelTokenizer, RoundTripsRandomBytesIncludingExtremes) {
  Rng rng(0xB17E);
  auto tok = make_tokenizer("ByteLevelTokenizer");
  for (int trial = 0; trial < 20; ++trial) {
    std::string bytes(1 + rng.below(500), '?');
    for (char& c : bytes) c = static_cast<char>(rng.below(256));
    bytes[0] = '\0';
    bytes.push_back(static_cast<char>(0xFF));
    std::vector<int32_t> ids = tok->encode(bytes);
    ASSERT_EQ(ids.size(), bytes.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(ids[i], static_cast<unsigned char>(bytes[i])) << "position " << i;
      ASSERT_GE(ids[i], 0);
      ASSERT_LT(ids[i], tok->vocab_size());
      ASSERT_NE(ids[i], tok->eod_id());
    }
    EXPECT_EQ(ids.front(), 0);
    EXPECT_EQ(ids.back(), 255);
    EXPECT_EQ(tok->decode(ids), bytes);
  }
}

TEST(ByteLevelTokenizer, EodDecodesToNothingAndSpecialTextStaysBytes) {
  ByteLevelTokenizer tok;
  EXPECT_EQ(tok.eod_id(), 256);
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.name(), "ByteLevelTokenizer");
  std::vector<int32_t> ids = {'a', 'b', 256, 'c', 256};
  EXPECT_EQ(tok.decode(ids), "abc");
  // The literal text of the special token is ordinary bytes, never the eod id.
  std::vector<int32_t> special = tok.encode("<|endoftext|>");
  EXPECT_EQ(special.size(), 13u);
  for (int32_t id : special) EXPECT_NE(id, tok.eod_id());
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.decode(std::vector<int32_t>{}), "");
}

TEST(ByteLevelTokenizer, DecodeRejectsIdsOutsideVocab) {
  ByteLevelTokenizer tok;
  EXPECT_THROW(tok.decode(std::vector<int32_t>{'a', 257}), UsageError);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), UsageError);
  try {
    tok.decode(std::vector<int32_t>{'x', 'y', 300});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
}

TEST(MakeTokenizer, UnknownTypeListsKnownOnes) {
  try {
    make_tokenizer("GPT2BPETokenizerX");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("GPT2BPETokenizerX"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ByteLevelTokenizer"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer_type"), std::string::npos) << msg;
  }
  for (const std::string& type : known_tokenizer_types()) {
    if (!tokenizer_needs_model(type)) {
      EXPECT_EQ(make_tokenizer(type)->name(), type);
    }
  }
}

TEST(PaddedVocabSize, RoundsUpToMultiple) {
  EXPECT_EQ(padded_vocab_size(257, 128), 384);
  EXPECT_EQ(padded_vocab_size(256, 128), 256);
  EXPECT_EQ(padded_vocab_size(50257, 128), 50304);
  EXPECT_EQ(padded_vocab_size(50257, 128 * 8), 51200);
  EXPECT_EQ(padded_vocab_size(257, 1), 257);
  EXPECT_EQ(padded_vocab_size(1, 64), 64);
  Rng rng(77);
  for (int i = 0; i < 100; ++i) {
    int64_t vocab = 1 + static_cast<int64_t>(rng.below(200000));
    int64_t d = 1 + static_cast<int64_t>(rng.below(1000));
    int64_t p = padded_vocab_size(vocab, d);
    EXPECT_EQ(p % d, 0);
    EXPECT_GE(p, vocab);
    EXPECT_LT(p - vocab, d);
  }
  EXPECT_THROW(padded_vocab_size(257, 0), UsageError);
  EXPECT_THROW(padded_vocab_size(0, 128), UsageError);
}

}  // namespace
}  // namespace primus
