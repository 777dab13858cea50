// Parallel checkpoint I/O: a save on one thread and on several writes the same bytes, and loads on one thread and
// on several give back every weight and moment; checksums and reads cut into ranges and pieces equal the whole
// file's; a corrupted byte or a truncated file fails with exit 3 naming the file, whether found by the checksum
// pass or by a read after it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <random>

#include "checkpoint/checkpoint.h"
#include "checkpoint/parallel_io.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/file_io.h"
#include "ops/ops.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

// A tiny model and optimizer whose weights and moments are random (fresh each run), or zero.
struct State {
  ModelArgs args = testing::tiny_llama_args();
  std::unique_ptr<Model> model = make_model(args, 16);
  AdamW optimizer{model->params(), AdamWConfig{}};
  std::vector<Tensor> tensors() const {
    return {model->params().flat_params(), optimizer.exp_avg(0), optimizer.exp_avg_sq(0)};
  }
  void randomize(uint64_t seed) {
    for (Tensor t : tensors()) ops::fill_normal(t, seed++, 1.0);
  }
  std::string bytes() const {
    std::string all;
    for (const Tensor& t : tensors()) all.append(static_cast<const char*>(t.data()), t.nbytes());
    return all;
  }
};

TrainerState state_at(int64_t iteration) {
  return TrainerState{.iteration = iteration, .consumed_train_samples = 4, .optimizer_steps = 1, .seed = 1, .fp8_scaling = {}};
}

std::string random_bytes(size_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::string s(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t w = rng();
    std::memcpy(&s[i], &w, 8);
  }
  for (size_t i = n & ~size_t{7}; i < n; ++i) s[i] = static_cast<char>(rng());
  return s;
}

void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

TEST(CheckpointParallelIo, SavesOnOneAndSeveralThreadsWriteTheSameBytesAndLoadBackEqual) {
  State saved;
  saved.randomize(std::random_device{}());
  const std::string root = testing::temp_dir("ckpt-parallel-io");
  for (int threads : {1, 4}) {
    save_checkpoint(fmt::format("{}/t{}", root, threads), *saved.model, saved.optimizer, state_at(1), "x: 1\n", {},
                    CheckpointIo{threads});
  }
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "manifest.json"}) {
    EXPECT_EQ(read_file(root + "/t1/iter_0000001/" + file), read_file(root + "/t4/iter_0000001/" + file)) << file;
  }
  // The manifest's CRC, joined from the pieces' CRCs, is the whole file's.
  const std::string model_bytes = read_file(root + "/t4/iter_0000001/model.safetensors");
  EXPECT_NE(read_file(root + "/t4/iter_0000001/manifest.json").find(fmt::format("{}", crc32c(model_bytes))),
            std::string::npos);
  for (int threads : {1, 3}) {
    State loaded;
    const TrainerState state = load_checkpoint(root + "/t4/iter_0000001", *loaded.model, loaded.optimizer, {},
                                               CheckpointIo{threads});
    EXPECT_EQ(state.iteration, 1);
    EXPECT_TRUE(loaded.bytes() == saved.bytes()) << threads << " threads";
  }
}

// Files past one 64 MiB checksum range and reads past one 16 MiB piece, at odd offsets.
TEST(CheckpointParallelIo, RangesAndPiecesJoinToTheWholeFile) {
  const std::string dir = testing::temp_dir("ckpt-parallel-ranges");
  const std::string big = random_bytes((size_t{130} << 20) + 4101);
  const std::string small = random_bytes(77);
  write_plain(dir + "/big", big);
  write_plain(dir + "/small", small);
  write_plain(dir + "/empty", "");
  for (int threads : {1, 3}) {
    const std::vector<uint32_t> crcs = checksum_files(
        {{dir + "/small", small.size()}, {dir + "/big", big.size()}, {dir + "/empty", 0}}, threads);
    ASSERT_EQ(crcs.size(), 3u);
    EXPECT_EQ(crcs[0], crc32c(small));
    EXPECT_EQ(crcs[1], crc32c(big));
    EXPECT_EQ(crcs[2], 0u);
  }
  const int64_t count = (int64_t{70} << 20) / 4 + 3;  // 5 pieces, the last one short
  const uint64_t offset = 4101;
  Tensor dst = Tensor::zeros({count}, DType::kF32);
  uint64_t reported = 0;
  read_tensors({{dir + "/big", offset, count, dst}, {dir + "/small", 8, 2, dst.slice_elements(0, {2})}}, 3,
               [&](uint64_t bytes) { reported += bytes; });
  EXPECT_EQ(reported, 4 * static_cast<uint64_t>(count) + 8);
  EXPECT_EQ(std::memcmp(static_cast<const char*>(dst.data()) + 8, big.data() + offset + 8, 4 * count - 8), 0);
  EXPECT_EQ(std::memcmp(dst.data(), small.data() + 8, 8), 0);
}

TEST(CheckpointParallelIo, ACorruptedByteFailsNamingTheFile) {
  State saved;
  saved.randomize(std::random_device{}());
  const std::string root = testing::temp_dir("ckpt-parallel-corrupt");
  save_checkpoint(root, *saved.model, saved.optimizer, state_at(1), "x: 1\n");
  const std::string file = root + "/iter_0000001/optimizer.safetensors";
  flip_byte(file, fs::file_size(file) - 1000);
  State loaded;
  try {
    load_checkpoint(root + "/iter_0000001", *loaded.model, loaded.optimizer, {}, CheckpointIo{4});
    FAIL() << "loaded a corrupted checkpoint";
  } catch (const RuntimeError& e) {
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC32C"), std::string::npos) << e.what();
  }
}

TEST(CheckpointParallelIo, ATruncatedFileFailsNamingTheFile) {
  State saved;
  saved.randomize(std::random_device{}());
  const std::string root = testing::temp_dir("ckpt-parallel-truncated");
  save_checkpoint(root, *saved.model, saved.optimizer, state_at(1), "x: 1\n");
  const std::string file = root + "/iter_0000001/model.safetensors";
  const uint64_t size = fs::file_size(file);
  fs::resize_file(file, size - 4);
  State loaded;
  try {
    load_checkpoint(root + "/iter_0000001", *loaded.model, loaded.optimizer, {}, CheckpointIo{2});
    FAIL() << "loaded a truncated checkpoint";
  } catch (const RuntimeError& e) {
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  // A file that shrinks after it was checked (between the checksum pass and the reads) fails the read the same way.
  Tensor dst = Tensor::zeros({16}, DType::kF32);
  try {
    read_tensors({{file, size - 40, 16, dst}}, 2);
    FAIL() << "read past the end";
  } catch (const RuntimeError& e) {
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_THROW(checksum_files({{file, size}}, 2), RuntimeError);
}

}  // namespace
}  // namespace primus
