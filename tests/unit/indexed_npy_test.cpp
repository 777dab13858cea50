// The numpy-side helpers of the index caches: MD5 (RFC 1321 test vectors), .npy writing and mapping, and
// numpy reading our .npy files (skipped without /usr/bin/python3 + numpy).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "data/npy_file.h"
#include "support/test_support.h"

namespace primus {
namespace {

TEST(Md5, MatchesRfc1321Vectors) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("a"), "0cc175b9c0f1b6a831c399e269772661");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(md5_hex("abcdefghijklmnopqrstuvwxyz"), "c3fcd3d76192e4007dfb496cca67e13b");
  EXPECT_EQ(md5_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "57edf4a22be3c955ac49da2e2107b67a");
  // 55/56/64-byte edges of the padding.
  EXPECT_EQ(md5_hex(std::string(55, 'x')), "04364420e25c512fd958a70738aa8f72");
  EXPECT_EQ(md5_hex(std::string(64, 'x')), "c1bb4f81d892b2d57947682aeb252456");
}

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  Rng rng(3);
  std::string dir = testing::temp_dir("npy");
  std::vector<int64_t> values(37 * 2);
  for (int64_t& v : values) v = static_cast<int64_t>(rng.below(1u << 30)) + 1;
  for (IndexDType dtype : {IndexDType::kI32, IndexDType::kU32, IndexDType::kI64}) {
    std::string path = dir + "/a" + npy_descr(dtype) + ".npy";
    path.erase(path.find('<'), 1);
    write_npy(path, values, {37, 2}, dtype);
    std::string bytes = read_file(path);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    EXPECT_EQ((bytes.size() - values.size() * (dtype == IndexDType::kI64 ? 8 : 4)) % 64, 0u);  // aligned data
    IndexArray array = IndexArray::map_npy(path);
    EXPECT_EQ(array.shape(), (std::vector<int64_t>{37, 2}));
    EXPECT_EQ(array.dtype(), dtype);
    ASSERT_EQ(array.size(), 74);
    for (int64_t i = 0; i < 74; ++i) EXPECT_EQ(array[i], values[static_cast<size_t>(i)]);
  }
  write_npy(dir + "/one.npy", {5, 6, 7}, {3}, IndexDType::kI64);
  EXPECT_EQ(IndexArray::map_npy(dir + "/one.npy").shape(), std::vector<int64_t>{3});
  EXPECT_THROW(write_npy(dir + "/neg.npy", {-1}, {1}, IndexDType::kU32), RuntimeError);
}

TEST(Npy, CorruptFilesNameFileAndOffset) {
  std::string dir = testing::temp_dir("npy-bad");
  write_npy(dir + "/ok.npy", {1, 2, 3, 4}, {4}, IndexDType::kI32);
  std::string good = read_file(dir + "/ok.npy");
  struct Case {
    std::string bytes;
    std::string needle;
  };
  std::string wrong_dtype = good;
  wrong_dtype.replace(wrong_dtype.find("<i4"), 3, "<f4");
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  std::vector<Case> cases = {{"", "byte offset 0"},
                             {"\x93NUMPX" + good.substr(6), "byte offset 0"},
                             {good.substr(0, good.size() - 1), "byte offset 128"},
                             {good + "x", "byte offset 128"},
                             {wrong_dtype, "byte offset 10"},
                             {fortran, "fortran_order"}};
  for (size_t c = 0; c < cases.size(); ++c) {
    std::string path = dir + "/bad" + std::to_string(c) + ".npy";
    write_file_atomic(path, cases[c].bytes);
    try {
      IndexArray::map_npy(path);
      ADD_FAILURE() << "case " << c << ": no error";
    } catch (const RuntimeError& error) {
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(cases[c].needle), std::string::npos) << c << ": " << error.what();
    }
  }
}

// numpy must read what we write, and our MD5 must equal Python's hashlib.
TEST(Npy, NumpyReadsOurFiles) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  std::string dir = testing::temp_dir("npy-numpy");
  write_npy(dir + "/s.npy", {9, 8, 7, 6, 5, 4}, {3, 2}, IndexDType::kI32);
  write_npy(dir + "/u.npy", {4000000000, 1}, {2}, IndexDType::kU32);
  std::string command = "/usr/bin/python3 -c \"import numpy as n, hashlib as h; a = n.load('" + dir +
                        "/s.npy'); b = n.load('" + dir +
                        "/u.npy'); print(a.dtype, a.shape, a.sum(), b.dtype, int(b[0]), "
                        "h.md5(b'x' * 55).hexdigest())\" 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buffer[512] = {};
  std::string out;
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  int status = ::pclose(pipe);
  if (out.find("No module named") != std::string::npos) GTEST_SKIP() << "numpy is not installed: " << out;
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out, "int32 (3, 2) 39 uint32 4000000000 " + md5_hex(std::string(55, 'x')) + "\n");
}

}  // namespace
}  // namespace primus
