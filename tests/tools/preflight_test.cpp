// `primus-cli preflight` in one process, as a user runs it: the report on a machine without a GPU (this
// development machine; on a GPU machine the GPU rows are checked instead), the JSON and markdown reports, checks
// that fail (a bad NCCL_SOCKET_IFNAME or NCCL_IB_HCA, too little disk, an impossible GEMM threshold) exiting 1
// and naming what failed, bad flags exiting 2 naming the flag; and the GPU threshold table.
#include "tools/preflight.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

class Preflight : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    // The job's variables and the network ones the checks read: each test sets what it needs.
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "PRIMUS_LAUNCHED", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      unsetenv(name);
    }
    dir_ = testing::temp_dir("preflight");
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

  testing::CliResult run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--", "preflight"});
    return testing::wait_cli(testing::spawn_cli(args, dir_), dir_);
  }

  nlohmann::json report() { return nlohmann::json::parse(testing::read_text(dir_ + "/report/preflight.json")); }

  // The checks of the JSON report named group/name.
  static std::vector<nlohmann::json> find(const nlohmann::json& r, const std::string& group, const std::string& name) {
    std::vector<nlohmann::json> out;
    for (const nlohmann::json& c : r["checks"]) {
      if (c["group"] == group && c["name"] == name) out.push_back(c);
    }
    return out;
  }

  std::string dir_;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(Preflight, ReportOnThisMachinePassesAndSaysWhetherThereIsAGpu) {
  testing::CliResult result = run({"--report-dir", dir_ + "/report", "--workspace", dir_});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_CONTAINS(result.out, "preflight: PASS");
  EXPECT_CONTAINS(result.out, "host/cpu");
  EXPECT_CONTAINS(result.out, "wrote " + dir_ + "/report/preflight.md");
  const nlohmann::json r = report();
  for (const char* key : {"version", "started_utc", "world_size", "result", "counts", "checks"}) {
    EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump(2);
  }
  EXPECT_EQ(r["result"], "pass");
  EXPECT_EQ(r["world_size"], 1);
  EXPECT_EQ(r["counts"]["fail"], 0);
  int total = 0;
  for (const char* status : {"pass", "info", "warn", "fail"}) total += r["counts"][status].get<int>();
  EXPECT_EQ(total, static_cast<int>(r["checks"].size()));
  for (const nlohmann::json& c : r["checks"]) {
    for (const char* key : {"group", "name", "status", "value", "detail", "measured", "unit", "rank", "host"}) {
      EXPECT_TRUE(c.contains(key)) << key << " missing in " << c.dump();
    }
    EXPECT_EQ(c["rank"], 0);
  }
  for (const auto& [group, name] : std::vector<std::pair<std::string, std::string>>{
           {"host", "cpu"}, {"host", "memory"}, {"host", "numa"}, {"host", "kernel"}, {"host", "open files limit"},
           {"host", "locked memory limit"}, {"host", "free disk"}, {"network", "NCCL_SOCKET_IFNAME"},
           {"network", "NCCL_IB_HCA"}, {"gpu", "gpus"}}) {
    EXPECT_EQ(find(r, group, name).size(), 1u) << group << "/" << name << " in " << r.dump(2);
  }
  const nlohmann::json disk = find(r, "host", "free disk").at(0);
  EXPECT_EQ(disk["status"], "pass");
  EXPECT_EQ(disk["unit"], "GiB");
  EXPECT_GT(disk["measured"].get<double>(), 1.0);
  EXPECT_CONTAINS(disk["value"].get<std::string>(), dir_);
  const nlohmann::json gpus = find(r, "gpu", "gpus").at(0);
  if (!testing::why_no_gpu().empty()) {
    // No GPU: said plainly, and the CPU measured instead (timings as info).
    EXPECT_EQ(gpus["status"], "info");
    EXPECT_TRUE(gpus["value"].get<std::string>().starts_with("no GPU: ")) << gpus.dump();
    EXPECT_CONTAINS(result.out, "no GPU: ");
    const nlohmann::json gemm = find(r, "perf", "gemm f32 1024^3").at(0);
    EXPECT_EQ(gemm["status"], "info") << gemm.dump();
    EXPECT_EQ(gemm["unit"], "TFLOP/s");
    EXPECT_GT(gemm["measured"].get<double>(), 0.0);
    const nlohmann::json copy = find(r, "perf", "memory copy 256 MiB").at(0);
    EXPECT_EQ(copy["status"], "info") << copy.dump();
    EXPECT_GT(copy["measured"].get<double>(), 0.0);
  } else {
    EXPECT_EQ(gpus["status"], "pass") << gpus.dump();
    EXPECT_EQ(find(r, "gpu", "gpu 0").size(), 1u);
    EXPECT_EQ(find(r, "perf", "gemm bf16 8192^3").size(), 1u);
  }
  const std::string md = testing::read_text(dir_ + "/report/preflight.md");
  EXPECT_TRUE(md.starts_with("# Preflight report\n")) << md;
  EXPECT_CONTAINS(md, "| status | group | check | rank | host | value | detail |");
  EXPECT_CONTAINS(md, "| host | free disk |");
}

TEST_F(Preflight, AMissingSocketInterfaceFailsNamingIt) {
  setenv("NCCL_SOCKET_IFNAME", "nosuchif7", 1);
  testing::CliResult result = run({"--report-dir", dir_ + "/report"});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_CONTAINS(result.out, "FAIL   network/NCCL_SOCKET_IFNAME");
  EXPECT_CONTAINS(result.out, "no interface named nosuchif7");
  EXPECT_CONTAINS(result.out, "preflight: FAIL");
  const nlohmann::json r = report();
  EXPECT_EQ(r["result"], "fail");
  EXPECT_EQ(r["counts"]["fail"], 1);
  EXPECT_EQ(find(r, "network", "NCCL_SOCKET_IFNAME").at(0)["status"], "fail");
}

TEST_F(Preflight, AMissingGlooInterfaceFailsNamingIt) {
  setenv("GLOO_SOCKET_IFNAME", "lo9", 1);  // an exact name: "lo" exists, "lo9" does not
  testing::CliResult result = run({});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_CONTAINS(result.out, "FAIL   network/GLOO_SOCKET_IFNAME");
  EXPECT_CONTAINS(result.out, "'lo9': no interface named lo9");
}

TEST_F(Preflight, LoopbackAsSocketInterfacePasses) {
  setenv("NCCL_SOCKET_IFNAME", "=lo", 1);  // exact name; every Linux host has it
  testing::CliResult result = run({"--report-dir", dir_ + "/report"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json c = find(report(), "network", "NCCL_SOCKET_IFNAME").at(0);
  EXPECT_EQ(c["status"], "pass") << c.dump();
  EXPECT_CONTAINS(c["value"].get<std::string>(), "lo 127.0.0.1");
}

TEST_F(Preflight, AMissingInfinibandDeviceFailsNamingIt) {
  setenv("NCCL_IB_HCA", "=mlx5_nosuch:1", 1);
  testing::CliResult result = run({"--report-dir", dir_ + "/report"});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_CONTAINS(result.out, "FAIL   network/NCCL_IB_HCA");
  EXPECT_CONTAINS(result.out, "no device mlx5_nosuch:1 under /sys/class/infiniband");
}

TEST_F(Preflight, TooLittleDiskOrAnUnreachableGemmRateFail) {
  testing::CliResult disk = run({"--min-free-disk-gib", "1e9", "--workspace", dir_ + "/not/yet/made"});
  EXPECT_EQ(disk.exit_code, 1) << disk.out << disk.err;
  EXPECT_CONTAINS(disk.out, "FAIL   host/free disk");
  EXPECT_CONTAINS(disk.out, "at least 1e+09 GiB (--min-free-disk-gib)");
  testing::CliResult gemm = run({"--device", "cpu", "--min-gemm-tflops", "1e6"});
  EXPECT_EQ(gemm.exit_code, 1) << gemm.out << gemm.err;
  EXPECT_CONTAINS(gemm.out, "FAIL   perf/gemm f32 1024^3");
  EXPECT_CONTAINS(gemm.out, "at least 1e+06 TFLOP/s (--min-gemm-tflops)");
  EXPECT_EQ(gemm.out.find("wrong results"), std::string::npos) << "the GEMM's values are right: " << gemm.out;
}

TEST_F(Preflight, ExpectingGpusWhereThereAreNoneFails) {
  if (testing::why_no_gpu().empty()) GTEST_SKIP() << "this machine has a GPU";
  testing::CliResult result = run({"--expected-gpus", "1"});
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_CONTAINS(result.out, "FAIL   gpu/gpus");
  EXPECT_CONTAINS(result.out, "expected 1 (--expected-gpus)");
}

TEST_F(Preflight, BadFlagsExitTwoNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--min-free-disk-gib", "-1"}, "--min-free-disk-gib"},
      {{"--expected-gpus", "0"}, "--expected-gpus"},
      {{"--allreduce-bytes", "4X"}, "--allreduce-bytes"},
      {{"--timeout-minutes", "0"}, "--timeout-minutes"},
      {{"--device", "tpu"}, "--device"},
      {{"--no-such-flag"}, "--no-such-flag"},
  };
  for (const auto& [args, flag] : cases) {
    testing::CliResult result = run(args);
    EXPECT_EQ(result.exit_code, 2) << flag << "\n" << result.out << result.err;
    EXPECT_CONTAINS(result.err, flag);
  }
}

TEST(PreflightThresholds, FromTheMeasuredCeilingsWithAMargin) {
  const GpuThresholds h200 = gpu_thresholds("NVIDIA H200");
  EXPECT_EQ(h200.matched, "H200");
  EXPECT_DOUBLE_EQ(h200.min_gemm_tflops, 0.75 * 790.0);
  EXPECT_DOUBLE_EQ(h200.min_copy_gbps, 0.75 * 4260.0);
  const GpuThresholds h100 = gpu_thresholds("NVIDIA H100 80GB HBM3");
  EXPECT_EQ(h100.matched, "H100");
  EXPECT_DOUBLE_EQ(h100.min_gemm_tflops, 0.75 * 790.0);
  EXPECT_NEAR(h100.min_copy_gbps, 2230.0, 1.0);
  for (const char* other : {"NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", ""}) {
    const GpuThresholds t = gpu_thresholds(other);
    EXPECT_EQ(t.matched, "") << other;
    EXPECT_EQ(t.min_gemm_tflops, 0.0) << other;
    EXPECT_EQ(t.min_copy_gbps, 0.0) << other;
  }
}

}  // namespace
}  // namespace primus
