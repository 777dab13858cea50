// `primus-cli benchmark comm`: the sweep in process at a world of one (sizes, bandwidth factors, option
// checks), then the built primus-cli at a world of one and at a world of two (two processes started with
// torchrun's variables, as `primus-cli direct` starts its workers), checking the table and the JSON lines.
#include "parallel/comm_benchmark.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "parallel/gloo_communicator.h"
#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

using namespace std::chrono_literals;

// Sets (or, with nullopt, removes) environment variables for the guard's lifetime.
class ScopedEnv {
 public:
  void set(const char* name, std::optional<std::string> value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        setenv(it->first, it->second->c_str(), 1);
      else
        unsetenv(it->first);
    }
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

void clear_torchrun(ScopedEnv& env) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                           "NNODES", "NODE_RANK", "GROUP_RANK", "PRIMUS_LAUNCHED"}) {
    env.set(name, std::nullopt);
  }
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::istringstream lines(testing::read_text(path));
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(CommBenchmark, OptionsAreCheckedAndNamed) {
  EXPECT_EQ(parse_byte_size("4096", "--min-bytes"), 4096);
  EXPECT_EQ(parse_byte_size("4K", "--min-bytes"), 4096);
  EXPECT_EQ(parse_byte_size("1MiB", "--min-bytes"), 1 << 20);
  EXPECT_EQ(parse_byte_size("1G", "--max-bytes"), int64_t{1} << 30);
  EXPECT_THROW(parse_byte_size("4X", "--min-bytes"), UsageError);
  EXPECT_THROW(parse_byte_size("", "--min-bytes"), UsageError);
  CommBenchmarkOptions options;
  options.ops = {"allreduce", "send-recv", "AllGather"};
  validate_comm_benchmark_options(options);
  EXPECT_EQ(options.ops, (std::vector<std::string>{"all_reduce", "send_recv", "all_gather"}));
  options.ops = {"broadcast_everything"};
  try {
    validate_comm_benchmark_options(options);
    ADD_FAILURE() << "an unknown op passed";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--ops: unknown collective 'broadcast_everything'"), std::string::npos);
  }
  options = CommBenchmarkOptions{};
  options.max_bytes = 10;
  options.min_bytes = 20;
  EXPECT_THROW(validate_comm_benchmark_options(options), UsageError);
  options = CommBenchmarkOptions{};
  options.step_factor = 1.0;
  EXPECT_THROW(validate_comm_benchmark_options(options), UsageError);
}

TEST(CommBenchmark, SweepAtAWorldOfOne) {
  GlooCommunicator comm(0, 1, nullptr, 5s);
  CommBenchmarkOptions options;
  options.min_bytes = 1024;
  options.max_bytes = 8192;
  options.iters = 3;
  options.warmup = 1;
  int seen = 0;
  std::vector<CommBenchmarkRow> rows = run_comm_benchmark(comm, options, [&](const CommBenchmarkRow&) { ++seen; });
  ASSERT_EQ(rows.size(), 4u * 4u) << "4 ops (send_recv needs two ranks) x sizes 1, 2, 4, 8 KiB";
  EXPECT_EQ(seen, 16);
  for (const CommBenchmarkRow& row : rows) {
    EXPECT_NE(row.op, "send_recv");
    EXPECT_EQ(row.bytes, row.elements * 4);
    EXPECT_GT(row.time_us, 0.0) << row.op;
    EXPECT_GT(row.algbw_gbps, 0.0) << row.op;
    EXPECT_EQ(row.busbw_gbps, 0.0) << "a world of one moves nothing over a link";
  }
  EXPECT_EQ(rows[0].bytes, 1024);
  EXPECT_EQ(rows[3].bytes, 8192);
}

TEST(CommBenchmark, CliAtAWorldOfOne) {
  ScopedEnv env;
  clear_torchrun(env);
  const std::string dir = testing::temp_dir("comm_bench_1");
  const std::string jsonl = dir + "/comm.jsonl";
  // The alias, as Primus's scripts call it.
  pid_t pid =
      testing::spawn_cli({"--", "benchmark", "nccl", "--device", "cpu", "--min-bytes", "1K", "--max-bytes", "4K",
                          "--iters", "2", "--warmup", "1", "--ops", "all_reduce,all_gather", "--jsonl", jsonl},
                         dir);
  testing::CliResult result = testing::wait_cli(pid, dir);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("benchmark comm: gloo on cpu, 1 rank, f32"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("algbw_GB/s"), std::string::npos) << result.out;
  EXPECT_EQ(count(result.out, "\nall_reduce "), 3) << result.out;
  EXPECT_EQ(count(result.out, "\nall_gather "), 3) << result.out;
  std::vector<nlohmann::json> rows = read_jsonl(jsonl);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0]["op"], "all_reduce");
  EXPECT_EQ(rows[0]["bytes"], 1024);
  EXPECT_EQ(rows[2]["bytes"], 4096);
  EXPECT_EQ(rows[0]["world_size"], 1);
  EXPECT_EQ(rows[0]["backend"], "gloo");
  EXPECT_EQ(rows[0]["iters"], 2);
}

TEST(CommBenchmark, CliAtAWorldOfTwo) {
  ScopedEnv env;
  clear_torchrun(env);
  const int port = testing::free_port();
  const std::string jsonl = testing::temp_dir("comm_bench_2_out") + "/comm.jsonl";
  env.set("WORLD_SIZE", "2");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", std::to_string(port));
  env.set("PRIMUS_LAUNCHED", "1");  // a worker of `primus-cli direct`: it runs the command itself
  std::vector<std::string> dirs;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    setenv("RANK", std::to_string(rank).c_str(), 1);  // spawn_cli copies the environment as it is now
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    dirs.push_back(testing::temp_dir("comm_bench_2_rank" + std::to_string(rank)));
    pids.push_back(testing::spawn_cli({"--", "benchmark", "comm", "--min-bytes", "1K", "--max-bytes", "2K", "--iters",
                                       "3", "--warmup", "1", "--jsonl", jsonl, "--timeout-minutes", "1"},
                                      dirs.back()));
  }
  testing::CliResult rank0 = testing::wait_cli(pids[0], dirs[0]);
  testing::CliResult rank1 = testing::wait_cli(pids[1], dirs[1]);
  ASSERT_EQ(rank0.exit_code, 0) << rank0.out << rank0.err;
  ASSERT_EQ(rank1.exit_code, 0) << rank1.out << rank1.err;
  EXPECT_NE(rank0.out.find("benchmark comm: gloo on cpu, 2 ranks, f32, 1 warm-up + 3 timed"), std::string::npos)
      << rank0.out;
  EXPECT_EQ(rank1.out.find("benchmark comm"), std::string::npos) << "only rank 0 prints: " << rank1.out;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"}) {
    EXPECT_EQ(count(rank0.out, std::string("\n") + op + " "), 2) << op << "\n" << rank0.out;
  }
  std::vector<nlohmann::json> rows = read_jsonl(jsonl);
  ASSERT_EQ(rows.size(), 5u * 2u);
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["world_size"], 2);
    EXPECT_EQ(row["dtype"], "f32");
    EXPECT_EQ(row["device"], "cpu");
    const double algbw = row["algbw_gbps"], busbw = row["busbw_gbps"];
    EXPECT_GT(algbw, 0.0) << row.dump();
    // nccl-tests' factors at n = 2: 2(n-1)/n = 1 for all_reduce, 1 for send_recv, (n-1)/n = 1/2 otherwise.
    const double factor = row["op"] == "all_reduce" || row["op"] == "send_recv" ? 1.0 : 0.5;
    EXPECT_NEAR(busbw, algbw * factor, 1e-4 * algbw + 1e-9) << row.dump();
    const double bytes = row["bytes"], time_us = row["time_us"];
    EXPECT_NEAR(algbw, bytes / (time_us * 1e3), 1e-3 * algbw) << row.dump();
  }
  EXPECT_EQ(rows[0]["bytes"], 1024);
  EXPECT_EQ(rows[1]["bytes"], 2048);
}

}  // namespace
}  // namespace primus
