// `primus-cli benchmark checkpoint` through the binary: a tiny run prints a save and a load speed, --json prints
// one object with the numbers, --keep leaves a checkpoint that loads, and bad options exit 2 naming the option.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

testing::CliResult run(const std::vector<std::string>& args, const std::string& dir) {
  return testing::wait_cli(testing::spawn_cli(args, dir), dir);
}

TEST(CheckpointBenchmark, ATinyRunPrintsSaveAndLoadSpeedsAndCleansUp) {
  const std::string dir = testing::temp_dir("ckpt-bench-table");
  const std::string target = dir + "/target";
  const testing::CliResult r =
      run({"--", "benchmark", "checkpoint", "--size-gb", "0.01", "--dir", target, "--threads", "2"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* line : {"benchmark checkpoint:", "save ", "load (warm)", "load (cold)", "page cache:", "round trip"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("2 I/O threads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_empty(target)) << "the benchmark's checkpoint was left in " << target;
}

TEST(CheckpointBenchmark, JsonParsesAndKeepLeavesALoadableCheckpoint) {
  const std::string dir = testing::temp_dir("ckpt-bench-json");
  const testing::CliResult r =
      run({"--", "benchmark", "checkpoint", "--size-gb", "0.01", "--dir", dir + "/target", "--json", "--keep"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"], "cpu");
  // 0.01 GB asked: the shape comes within a layer of it.
  EXPECT_GT(j["bytes"].get<double>(), 0.006e9);
  EXPECT_LT(j["bytes"].get<double>(), 0.014e9);
  EXPECT_GT(j["save_gb_per_s"].get<double>(), 0);
  EXPECT_GT(j["load_warm"]["gb_per_s"].get<double>(), 0);
  EXPECT_GT(j["load_warm"]["verify_s"].get<double>(), 0);
  EXPECT_GT(j["load_warm"]["read_s"].get<double>(), 0);
  EXPECT_TRUE(j["load_cold"].is_null() || j["load_cold"]["gb_per_s"].get<double>() > 0);
  EXPECT_GE(j["resident_after_drop"].get<double>(), 0);
  EXPECT_EQ(j["round_trip"], true);
  const std::string kept = j["kept_dir"].get<std::string>();
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "manifest.json"}) {
    EXPECT_TRUE(fs::exists(kept + "/iter_0000001/" + file)) << file;
  }
  EXPECT_TRUE(fs::exists(kept + "/latest_checkpointed_iteration.txt"));
}

TEST(CheckpointBenchmark, BadOptionsExitTwoNamingTheOption) {
  const std::string dir = testing::temp_dir("ckpt-bench-bad");
  const testing::CliResult size = run({"--", "benchmark", "checkpoint", "--size-gb", "0", "--dir", dir}, dir);
  EXPECT_EQ(size.exit_code, 2);
  EXPECT_NE(size.err.find("--size-gb"), std::string::npos) << size.err;
  const testing::CliResult threads =
      run({"--", "benchmark", "checkpoint", "--size-gb", "0.01", "--dir", dir, "--threads", "300"}, dir);
  EXPECT_EQ(threads.exit_code, 2);
  EXPECT_NE(threads.err.find("--threads"), std::string::npos) << threads.err;
  const testing::CliResult missing = run({"--", "benchmark", "checkpoint", "--size-gb", "0.01"}, dir);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("--dir"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace primus
