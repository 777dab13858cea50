// MMIDIDX .idx/.bin: files built byte by byte from the format description load here; files written here
// read back through an independent reader written from the same description; every corruption the reader
// guards against is a RuntimeError naming the file and the byte offset.
#include "data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

// Little-endian byte builder for fixtures.
struct Bytes {
  std::string data;
  template <typename T>
  Bytes& put(T value) {
    for (size_t i = 0; i < sizeof(T); ++i)
      data.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xFF));
    return *this;
  }
  Bytes& raw(std::string_view bytes) {
    data += bytes;
    return *this;
  }
};

struct Fixture {
  std::vector<std::vector<int64_t>> sequences;
  std::vector<int64_t> documents;  // document index, starting 0, ending S
  uint8_t code = 8;
  int64_t itemsize = 2;
};

// .idx and .bin exactly as FORMATS.md §1 lays them out.
std::pair<std::string, std::string> encode_fixture(const Fixture& f) {
  Bytes idx;
  idx.raw(std::string_view("MMIDIDX\0\0", 9)).put<uint64_t>(1).put<uint8_t>(f.code);
  idx.put<uint64_t>(f.sequences.size()).put<uint64_t>(f.documents.size());
  for (const auto& s : f.sequences) idx.put<int32_t>(static_cast<int32_t>(s.size()));
  int64_t pointer = 0;
  for (const auto& s : f.sequences) {
    idx.put<int64_t>(pointer);
    pointer += static_cast<int64_t>(s.size()) * f.itemsize;
  }
  for (int64_t d : f.documents) idx.put<int64_t>(d);
  Bytes bin;
  for (const auto& s : f.sequences) {
    for (int64_t token : s) {
      if (f.itemsize == 1) bin.put<uint8_t>(static_cast<uint8_t>(token));
      if (f.itemsize == 2) bin.put<uint16_t>(static_cast<uint16_t>(token));
      if (f.itemsize == 4) bin.put<int32_t>(static_cast<int32_t>(token));
      if (f.itemsize == 8) bin.put<int64_t>(token);
    }
  }
  return {idx.data, bin.data};
}

std::string write_fixture(const std::string& dir, const std::string& name, const std::string& idx,
                          const std::string& bin) {
  std::string prefix = dir + "/" + name;
  write_file_atomic(prefix + ".idx", idx);
  write_file_atomic(prefix + ".bin", bin);
  return prefix;
}

Fixture random_fixture(Rng& rng, uint8_t code, int64_t itemsize, int64_t max_token) {
  Fixture f;
  f.code = code;
  f.itemsize = itemsize;
  f.documents.push_back(0);
  int64_t docs = 7 + static_cast<int64_t>(rng.below(6));
  for (int64_t d = 0; d < docs; ++d) {
    int64_t parts = d == 2 ? 0 : 1 + static_cast<int64_t>(rng.below(3));  // document 2 is empty
    for (int64_t p = 0; p < parts; ++p) {
      std::vector<int64_t> s(1 + rng.below(40));
      for (int64_t& t : s) t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_token)));
      f.sequences.push_back(s);
    }
    f.documents.push_back(static_cast<int64_t>(f.sequences.size()));
  }
  return f;
}

void expect_matches(const IndexedDataset& data, const Fixture& f) {
  ASSERT_EQ(data.num_sequences(), static_cast<int64_t>(f.sequences.size()));
  ASSERT_EQ(data.num_documents(), static_cast<int64_t>(f.documents.size()) - 1);
  int64_t tokens = 0;
  for (size_t i = 0; i < f.sequences.size(); ++i) {
    std::vector<int32_t> got = data.sequence(static_cast<int64_t>(i));
    ASSERT_EQ(got.size(), f.sequences[i].size()) << "sequence " << i;
    for (size_t t = 0; t < got.size(); ++t) EXPECT_EQ(got[t], f.sequences[i][t]) << "sequence " << i << " token " << t;
    tokens += static_cast<int64_t>(got.size());
  }
  for (size_t k = 0; k < f.documents.size(); ++k)
    EXPECT_EQ(data.document_entry(static_cast<int64_t>(k)), f.documents[k]);
  EXPECT_EQ(data.num_tokens(), tokens);
}

TEST(IndexedDataset, LoadsFilesBuiltByteByByteFromTheSpecInEveryIntegerDtype) {
  Rng rng(101);
  std::string dir = testing::temp_dir("idx-spec");
  struct Case {
    uint8_t code;
    int64_t itemsize;
    int64_t max_token;
  };
  for (Case c : {Case{8, 2, 65536}, Case{4, 4, 200000}, Case{5, 8, 1 << 30}, Case{1, 1, 256}}) {
    Fixture f = random_fixture(rng, c.code, c.itemsize, c.max_token);
    auto [idx, bin] = encode_fixture(f);
    std::string prefix = write_fixture(dir, "code" + std::to_string(c.code), idx, bin);
    IndexedDataset data(prefix);
    EXPECT_EQ(static_cast<int>(data.dtype()), c.code);
    expect_matches(data, f);
  }
}

TEST(IndexedDataset, PartialReadsAreTheRightSlice) {
  Rng rng(7);
  Fixture f = random_fixture(rng, 8, 2, 60000);
  auto [idx, bin] = encode_fixture(f);
  IndexedDataset data(write_fixture(testing::temp_dir("idx-slice"), "d", idx, bin));
  const auto& s = f.sequences[0];
  std::vector<int32_t> out(s.size() - 1, -7);
  data.read(0, 1, out);
  for (size_t t = 0; t < out.size(); ++t) EXPECT_EQ(out[t], s[t + 1]);
  std::vector<int32_t> too_long(s.size() + 1);
  EXPECT_THROW(data.read(0, 0, too_long), RuntimeError);
}

// An independent reader of the format, written from FORMATS.md §1 (not from the reader under test).
struct SpecReader {
  explicit SpecReader(const std::string& prefix) {
    std::string idx = read_file(prefix + ".idx");
    std::string bin = read_file(prefix + ".bin");
    auto u64 = [&](size_t at) {
      uint64_t v = 0;
      for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(idx[at + static_cast<size_t>(i)]);
      return v;
    };
    magic = idx.substr(0, 9);
    version = u64(9);
    code = static_cast<unsigned char>(idx[17]);
    uint64_t s = u64(18), d = u64(26);
    file_size = idx.size();
    for (uint64_t i = 0; i < s; ++i) {
      uint32_t len = 0;
      for (int b = 3; b >= 0; --b)
        len = len << 8 | static_cast<unsigned char>(idx[34 + 4 * i + static_cast<size_t>(b)]);
      lengths.push_back(len);
      pointers.push_back(static_cast<int64_t>(u64(34 + 4 * s + 8 * i)));
    }
    for (uint64_t k = 0; k < d; ++k) documents.push_back(static_cast<int64_t>(u64(34 + 12 * s + 8 * k)));
    for (uint64_t i = 0; i < s; ++i) {
      std::vector<int64_t> tokens;
      for (uint32_t t = 0; t < lengths[i]; ++t) {
        size_t at = static_cast<size_t>(pointers[i]) + 2 * t;  // uint16
        tokens.push_back(static_cast<unsigned char>(bin[at]) | static_cast<unsigned char>(bin[at + 1]) << 8);
      }
      sequences.push_back(tokens);
    }
  }
  std::string magic;
  uint64_t version = 0;
  int code = 0;
  size_t file_size = 0;
  std::vector<uint32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> documents;
  std::vector<std::vector<int64_t>> sequences;
};

TEST(IndexedDatasetWriter, OutputReadsBackThroughAnIndependentSpecReader) {
  Rng rng(55);
  std::string prefix = testing::temp_dir("idx-write") + "/sub/out";  // parent folders are created
  IndexedDatasetWriter writer(prefix, token_dtype_for_vocab(50257));
  std::vector<std::vector<int64_t>> expected;
  std::vector<int64_t> documents = {0};
  for (int d = 0; d < 9; ++d) {
    int parts = d == 4 ? 0 : 1 + static_cast<int>(rng.below(2));
    for (int p = 0; p < parts; ++p) {
      std::vector<int32_t> tokens(1 + rng.below(30));
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(50257));
      writer.add_sequence(tokens);
      expected.emplace_back(tokens.begin(), tokens.end());
    }
    writer.end_document();
    documents.push_back(static_cast<int64_t>(expected.size()));
  }
  EXPECT_FALSE(fs::exists(prefix + ".idx"));  // nothing visible before finish()
  writer.finish();

  SpecReader spec(prefix);
  EXPECT_EQ(spec.magic, std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(spec.version, 1u);
  EXPECT_EQ(spec.code, 8);  // uint16 for a vocabulary < 65500
  EXPECT_EQ(spec.documents, documents);
  EXPECT_EQ(spec.sequences, expected);
  EXPECT_EQ(spec.file_size, 34 + 12 * expected.size() + 8 * documents.size());
  int64_t pointer = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(spec.pointers[i], pointer);
    pointer += 2 * static_cast<int64_t>(expected[i].size());
  }
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(prefix + ".bin")), pointer);

  IndexedDataset data(prefix);
  Fixture f{expected, documents, 8, 2};
  expect_matches(data, f);
}

TEST(IndexedDatasetWriter, PicksMegatronsDtypeAndRejectsTokensThatDoNotFit) {
  EXPECT_EQ(token_dtype_for_vocab(257), TokenDType::kU16);
  EXPECT_EQ(token_dtype_for_vocab(65499), TokenDType::kU16);
  EXPECT_EQ(token_dtype_for_vocab(65500), TokenDType::kI32);
  EXPECT_EQ(token_dtype_for_vocab(128256), TokenDType::kI32);

  std::string dir = testing::temp_dir("idx-range");
  {
    IndexedDatasetWriter writer(dir + "/u16", TokenDType::kU16);
    std::vector<int32_t> bad = {5, 70000};
    EXPECT_THROW(writer.add_sequence(bad), UsageError);
  }  // abandoned: no files left behind
  EXPECT_FALSE(fs::exists(dir + "/u16.bin"));
  EXPECT_FALSE(fs::exists(dir + "/u16.idx"));

  IndexedDatasetWriter writer(dir + "/i32", TokenDType::kI32);
  std::vector<int32_t> big = {128255, 3, 70000};
  writer.add_document(big);
  writer.add_document({});
  writer.finish();
  IndexedDataset data(dir + "/i32");
  EXPECT_EQ(data.dtype(), TokenDType::kI32);
  EXPECT_EQ(data.sequence(0), big);
  EXPECT_EQ(data.num_documents(), 2);
  EXPECT_EQ(data.document_entry(1), 1);
  EXPECT_EQ(data.document_entry(2), 1);  // the empty document repeats the boundary
}

TEST(IndexedDataset, PathHelpers) {
  EXPECT_EQ(strip_indexed_suffix("a/b.idx"), "a/b");
  EXPECT_EQ(strip_indexed_suffix("a/b.bin"), "a/b");
  EXPECT_EQ(strip_indexed_suffix("a/b_text_document"), "a/b_text_document");
  EXPECT_EQ(idx_path("p"), "p.idx");
  EXPECT_EQ(bin_path("p"), "p.bin");
}

// Corruption: each case edits a valid pair and names the file and offset the reader must report.
struct Corruption {
  std::string name;
  std::function<void(std::string& idx, std::string& bin)> edit;
  std::string file;  // ".idx" or ".bin"
  uint64_t offset;
};

template <typename T>
void poke(std::string& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

TEST(IndexedDataset, EveryCorruptionIsARuntimeErrorNamingFileAndOffset) {
  Fixture f;
  f.sequences = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}};
  f.documents = {0, 2, 3};
  auto [good_idx, good_bin] = encode_fixture(f);
  const uint64_t s = 3;
  const uint64_t pointers = 34 + 4 * s;
  const uint64_t docs = 34 + 12 * s;
  std::vector<Corruption> cases = {
      {"magic", [](std::string& i, std::string&) { i[3] = 'X'; }, ".idx", 0},
      {"version", [](std::string& i, std::string&) { poke<uint64_t>(i, 9, 2); }, ".idx", 9},
      {"dtype code", [](std::string& i, std::string&) { i[17] = 9; }, ".idx", 17},
      {"float dtype", [](std::string& i, std::string&) { i[17] = 6; }, ".idx", 17},
      {"header cut", [](std::string& i, std::string&) { i.resize(20); }, ".idx", 20},
      {"empty idx", [](std::string& i, std::string&) { i.clear(); }, ".idx", 0},
      {"arrays cut", [](std::string& i, std::string&) { i.resize(i.size() - 5); }, ".idx", good_idx.size() - 5},
      {"trailing bytes", [](std::string& i, std::string&) { i += "xyz"; }, ".idx", good_idx.size()},
      {"huge count", [](std::string& i, std::string&) { poke<uint64_t>(i, 18, ~uint64_t{0}); }, ".idx", 18},
      {"sequence count too big", [](std::string& i, std::string&) { poke<uint64_t>(i, 18, 4); }, ".idx",
       good_idx.size()},
      {"zero doc entries", [](std::string& i, std::string&) { poke<uint64_t>(i, 26, 0); }, ".idx", 26},
      {"negative length", [](std::string& i, std::string&) { poke<int32_t>(i, 34 + 4, -2); }, ".idx", 34 + 4},
      {"pointer off", [](std::string& i, std::string&) { poke<int64_t>(i, pointers + 16, 7); }, ".idx", pointers + 16},
      {"length vs pointer", [](std::string& i, std::string&) { poke<int32_t>(i, 34, 4); }, ".idx", pointers + 8},
      {"doc index start", [](std::string& i, std::string&) { poke<int64_t>(i, docs, 1); }, ".idx", docs},
      {"doc index falls", [=](std::string& i, std::string&) { poke<int64_t>(i, docs + 8, 9); }, ".idx", docs + 8},
      {"doc index end", [=](std::string& i, std::string&) { poke<int64_t>(i, docs + 16, 2); }, ".idx", docs + 16},
      {"bin cut", [](std::string&, std::string& b) { b.resize(b.size() - 2); }, ".bin", good_bin.size() - 2},
      {"bin long", [](std::string&, std::string& b) { b += "zz"; }, ".bin", good_bin.size()},
  };
  std::string dir = testing::temp_dir("idx-corrupt");
  {
    IndexedDataset sane(write_fixture(dir, "good", good_idx, good_bin));
    EXPECT_EQ(sane.num_tokens(), 9);
  }
  for (size_t c = 0; c < cases.size(); ++c) {
    std::string idx = good_idx, bin = good_bin;
    cases[c].edit(idx, bin);
    std::string prefix = write_fixture(dir, "case" + std::to_string(c), idx, bin);
    try {
      IndexedDataset data(prefix);
      ADD_FAILURE() << cases[c].name << ": no error";
    } catch (const RuntimeError& error) {
      std::string message = error.what();
      EXPECT_NE(message.find(prefix + cases[c].file), std::string::npos) << cases[c].name << ": " << message;
      EXPECT_NE(message.find(fmt::format("byte offset {}:", cases[c].offset)), std::string::npos)
          << cases[c].name << ": " << message;
    } catch (const std::exception& error) {
      ADD_FAILURE() << cases[c].name << ": wrong exception type: " << error.what();
    }
  }
}

TEST(IndexedDataset, MissingFilesAreUsageErrors) {
  std::string dir = testing::temp_dir("idx-missing");
  EXPECT_THROW(IndexedDataset(dir + "/nothing"), UsageError);
  write_file_atomic(dir + "/half.idx", "x");
  try {
    IndexedDataset data(dir + "/half");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("half.bin"), std::string::npos) << error.what();
  }
}

TEST(IndexedDataset, MultimodalModesAreAcceptedOnlyWhenAsked) {
  Fixture f;
  f.sequences = {{1, 2}, {3}};
  f.documents = {0, 2};
  auto [idx, bin] = encode_fixture(f);
  idx += std::string("\x00\x01", 2);  // int8 modes, one a sequence
  std::string prefix = write_fixture(testing::temp_dir("idx-mm"), "mm", idx, bin);
  EXPECT_THROW(IndexedDataset(prefix, false), RuntimeError);
  IndexedDataset data(prefix, true);
  EXPECT_EQ(data.sequence(1), std::vector<int32_t>{3});
}

}  // namespace
}  // namespace primus
