// core/file_io: CRC32C against published vectors and a bitwise reference, atomic writes that never leave a
// torn or temporary file behind, and read_file errors that name the path.
#include "core/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "support/test_support.h"

namespace primus {
namespace {

// gtest-only substring check (the tests do not link gmock).
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

// One bit at a time straight from the definition, independent of the table-driven code.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

std::vector<unsigned char> random_bytes(size_t n, Rng& rng) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng.next_u64());
  return v;
}

std::set<std::string> dir_entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Crc32c, PublishedVectors) {
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  // RFC 3720 (iSCSI) appendix B.4.
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), up.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), down.size()), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, MatchesBitwiseReferenceAtEveryLengthAndAlignment) {
  Rng rng(11);
  std::vector<unsigned char> buf = random_bytes(300, rng);
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n = 0; n + start <= 100; ++n) {
      ASSERT_EQ(crc32c(buf.data() + start, n), crc32c_bitwise(buf.data() + start, n)) << start << " " << n;
    }
  }
}

TEST(Crc32c, ChainsAcrossAnySplit) {
  Rng rng(12);
  std::vector<unsigned char> buf = random_bytes(1000, rng);
  const uint32_t whole = crc32c(buf.data(), buf.size());
  EXPECT_EQ(whole, crc32c_bitwise(buf.data(), buf.size()));
  for (size_t cut : {0, 1, 7, 8, 9, 63, 500, 999, 1000}) {
    uint32_t first = crc32c(buf.data(), cut);
    EXPECT_EQ(crc32c(buf.data() + cut, buf.size() - cut, first), whole) << cut;
  }
  // Three pieces as well.
  uint32_t c = crc32c(buf.data(), 3);
  c = crc32c(buf.data() + 3, 400, c);
  c = crc32c(buf.data() + 403, buf.size() - 403, c);
  EXPECT_EQ(c, whole);
}

TEST(Crc32c, MaskRotatesAndOffsets) {
  EXPECT_EQ(mask_crc32c(0x12345678u), 0x4F730F40u);
  EXPECT_EQ(mask_crc32c(0u), 0xA282EAD8u);
  Rng rng(13);
  std::vector<unsigned char> buf = random_bytes(77, rng);
  uint32_t masked = masked_crc32c(buf.data(), buf.size());
  uint32_t rot = masked - 0xA282EAD8u;
  EXPECT_EQ((rot >> 17) | (rot << 15), crc32c(buf.data(), buf.size()));
}

TEST(FileIo, ReadFileReturnsExactBytes) {
  std::string dir = testing::temp_dir("fileio");
  std::string path = dir + "/blob.bin";
  Rng rng(21);
  std::vector<unsigned char> bytes = random_bytes(70000, rng);
  bytes[5] = 0;  // embedded NUL must survive
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::string got = read_file(path);
  ASSERT_EQ(got.size(), bytes.size());
  EXPECT_EQ(0, std::memcmp(got.data(), bytes.data(), bytes.size()));
  std::ofstream(dir + "/empty");
  EXPECT_EQ(read_file(dir + "/empty"), "");
}

TEST(FileIo, ReadFileErrorsNameThePath) {
  std::string dir = testing::temp_dir("fileio");
  try {
    read_file(dir + "/missing.txt");
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_CONTAINS(e.what(), dir + "/missing.txt");
    EXPECT_CONTAINS(e.what(), "No such file");
  }
  EXPECT_THROW(read_file(dir), RuntimeError);
}

TEST(FileIo, WriteFileAtomicReplacesAndLeavesNoTemporary) {
  std::string dir = testing::temp_dir("fileio");
  std::string path = dir + "/config.json";
  write_file_atomic(path, "first version, longer than the second");
  EXPECT_EQ(slurp(path), "first version, longer than the second");
  write_file_atomic(path, std::string_view("sec\0nd", 6));
  EXPECT_EQ(slurp(path), std::string("sec\0nd", 6));
  EXPECT_EQ(dir_entries(dir), std::set<std::string>{"config.json"});
}

TEST(FileIo, StreamingWriterCommitsConcatenation) {
  std::string dir = testing::temp_dir("fileio");
  std::string path = dir + "/stream.bin";
  Rng rng(22);
  std::string expected;
  {
    AtomicFileWriter w(path);
    EXPECT_EQ(w.tmp_path(), fmt::format("{}.tmp.{}", path, ::getpid()));
    for (int i = 0; i < 50; ++i) {
      std::vector<unsigned char> piece = random_bytes(rng.below(5000), rng);
      std::string s(piece.begin(), piece.end());
      w.append(s);
      expected += s;
    }
    EXPECT_EQ(w.bytes_written(), expected.size());
    EXPECT_FALSE(std::filesystem::exists(path)) << "target must not appear before commit";
    w.commit();
  }
  EXPECT_EQ(slurp(path), expected);
  EXPECT_EQ(dir_entries(dir), std::set<std::string>{"stream.bin"});
}

TEST(FileIo, InterruptedWriterKeepsOldFile) {
  std::string dir = testing::temp_dir("fileio");
  std::string path = dir + "/model.safetensors";
  write_file_atomic(path, "old complete contents");
  {
    AtomicFileWriter w(path);
    w.append("new partial contents that never get committed");
    EXPECT_TRUE(std::filesystem::exists(w.tmp_path()));
  }
  EXPECT_EQ(slurp(path), "old complete contents");
  EXPECT_EQ(dir_entries(dir), std::set<std::string>{"model.safetensors"});
}

TEST(FileIo, WriteErrorsNameThePath) {
  std::string dir = testing::temp_dir("fileio");
  try {
    write_file_atomic(dir + "/no/such/dir/file.txt", "x");
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_CONTAINS(e.what(), dir + "/no/such/dir/file.txt");
  }
  EXPECT_THROW(fsync_directory(dir + "/absent"), RuntimeError);
  EXPECT_NO_THROW(fsync_directory(dir));
}

}  // namespace
// A FIFO named where a program's own file should be (a checkpoint's tracker or manifest) is refused at once
// instead of blocking the reader forever; a pipe is still read where any file is allowed.
TEST(FileIo, RegularOnlyReadRefusesAFifoWithoutBlocking) {
  const std::string dir = testing::temp_dir("fifo_read");
  const std::string fifo = dir + "/latest_checkpointed_iteration.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  try {
    read_file(fifo, FileKinds::kRegularOnly);
    FAIL() << "a FIFO was read";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fifo), std::string::npos) << e.what();
  }
}

// Outputs that are not regular files (a device such as /dev/full, a FIFO, a symbolic link) are never replaced.
TEST(FileIo, WriteFileAtomicRefusesToReplaceNonRegularFiles) {
  const std::string dir = testing::temp_dir("nonregular_write");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string target = dir + "/target";
  write_file_atomic(target, "kept");
  const std::string link = dir + "/link";
  std::filesystem::create_symlink(target, link);
  for (const std::string& path : {fifo, link, std::string("/dev/null")}) {
    try {
      write_file_atomic(path, "replaced");
      FAIL() << path << " was replaced";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(read_file(target), "kept");
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
}

}  // namespace primus
