// `primus-cli direct --nproc-per-node 2 -- preflight` on CPU ranks (Gloo): the launcher starts two workers with
// torchrun's variables; every rank measures its device, rank 0 gathers the checks and reports the all-reduce
// bus bandwidth; a failed check on the job exits 1 through the launcher.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

class PreflightRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "PRIMUS_LAUNCHED", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME",
                             "OMP_NUM_THREADS"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      unsetenv(name);
    }
    setenv("OMP_NUM_THREADS", "1", 1);
    dir_ = testing::temp_dir("preflight_ranks");
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

  // Two CPU ranks through the launcher; every wait in it is bounded (the rendezvous by --timeout-minutes 1, a
  // dead rank stops the other within seconds).
  testing::CliResult run_two_ranks() {
    return testing::wait_cli(
        testing::spawn_cli({"direct", "--nproc-per-node", "2", "--master-port", std::to_string(testing::free_port()),
                            "--", "preflight", "--device", "cpu", "--allreduce-bytes", "1M", "--timeout-minutes", "1",
                            "--report-dir", dir_ + "/report"},
                           dir_),
        dir_);
  }

  std::string dir_;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(PreflightRanks, TwoRanksReportTheAllReduceBusBandwidth) {
  testing::CliResult result = run_two_ranks();
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_CONTAINS(result.out, "preflight on 2 ranks");
  EXPECT_CONTAINS(result.out, "comm/all_reduce 1 MiB");
  EXPECT_CONTAINS(result.out, "preflight: PASS");
  const nlohmann::json r = nlohmann::json::parse(testing::read_text(dir_ + "/report/preflight.json"));
  EXPECT_EQ(r["world_size"], 2);
  EXPECT_EQ(r["result"], "pass");
  int allreduce = 0, host_checks = 0;
  std::set<int> gemm_ranks;
  for (const nlohmann::json& c : r["checks"]) {
    if (c["group"] == "comm") {
      ++allreduce;
      EXPECT_EQ(c["name"], "all_reduce 1 MiB");
      EXPECT_EQ(c["status"], "info") << c.dump();
      EXPECT_EQ(c["unit"], "GB/s");
      EXPECT_GT(c["measured"].get<double>(), 0.0) << c.dump();
      EXPECT_CONTAINS(c["value"].get<std::string>(), "gloo over 2 ranks on cpu");
      // At n = 2 nccl-tests' factor 2(n-1)/n is 1: bus bandwidth equals algorithm bandwidth.
      const std::string value = c["value"];
      const double busbw = std::stod(value.substr(value.find("busbw ") + 6));
      const double algbw = std::stod(value.substr(value.find("algbw ") + 6));
      EXPECT_NEAR(busbw, algbw, 0.011 + 1e-3 * algbw) << value;
    }
    if (c["group"] == "host") {
      ++host_checks;
      EXPECT_EQ(c["rank"], 0) << "host checks run once per node: " << c.dump();
    }
    if (c["group"] == "perf" && c["name"] == "gemm f32 1024^3") gemm_ranks.insert(c["rank"].get<int>());
  }
  EXPECT_EQ(allreduce, 1);
  EXPECT_GT(host_checks, 5);
  EXPECT_EQ(gemm_ranks, (std::set<int>{0, 1})) << "every rank measures its own device";
}

TEST_F(PreflightRanks, AFailedCheckOnTheJobExitsOne) {
  setenv("NCCL_SOCKET_IFNAME", "nosuchif7", 1);  // the workers inherit it
  testing::CliResult result = run_two_ranks();
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_CONTAINS(result.out, "no interface named nosuchif7");
  EXPECT_CONTAINS(result.out, "comm/all_reduce 1 MiB");  // the rest of the job still ran
  EXPECT_CONTAINS(result.out, "preflight: FAIL");
  const nlohmann::json r = nlohmann::json::parse(testing::read_text(dir_ + "/report/preflight.json"));
  EXPECT_EQ(r["result"], "fail");
}

}  // namespace
}  // namespace primus
