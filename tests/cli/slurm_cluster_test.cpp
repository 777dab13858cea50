// `primus-cli slurm` against a real Slurm: each test process starts a two-node cluster on localhost (munged,
// slurmctld, and two slurmd, -N n1 and -N n2, with a generated slurm.conf and MUNGE key in a temporary
// directory), runs two-node CPU training jobs over Gloo through srun and sbatch, and checks that their losses
// equal one process's at the same global batch, that a job failing on one node is reported with that node and
// rank, and that `slurm node` reads Slurm's variables as scontrol does. Nothing is installed here: the packages
// come from scripts/setup.sh --test (slurm-wlm, munge). Without root or without the programs the tests skip,
// saying why. Every daemon is a child of the test process (foreground, PR_SET_PDEATHSIG), stopped in
// TearDownTestSuite and, should the test process die, by the kernel; the jobs' processes are reaped as orphans
// (PR_SET_CHILD_SUBREAPER).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cli/slurm_script.h"
#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::CliResult;
using testing::read_text;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

// The path of a program on PATH or in the sbin folders (root's daemons live there); empty when absent.
std::string find_program(const std::string& name) {
  std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/local/sbin";
  std::stringstream folders(path);
  for (std::string folder; std::getline(folders, folder, ':');) {
    if (folder.empty()) continue;
    fs::path candidate = fs::path(folder) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

// Runs a shell command with a limit (coreutils timeout); output in `output`. Returns the exit code (124 when the
// limit was reached).
int run_shell(const std::string& command, int limit_s, std::string* output = nullptr) {
  static const std::string out = testing::temp_dir("slurm_sh") + "/out";
  const std::string line = fmt::format("timeout -k 5 {} bash -c '{}' >'{}' 2>&1", limit_s, command, out);
  int status = std::system(line.c_str());
  if (output != nullptr) *output = read_text(out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1000;
}

// A daemon in the foreground as our child; it gets SIGTERM when the test process dies.
pid_t start_daemon(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<std::string> args = argv;
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    ::execv(pointers[0], pointers.data());
    ::_exit(127);
  }
  return pid;
}

// Processes whose parent is this one (the daemons, and job processes orphaned to us as subreaper).
std::vector<pid_t> children() {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_text(entry.path() / "stat");
    size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == ::getpid()) pids.push_back(std::stoi(name));
  }
  return pids;
}

struct Cluster {
  std::string dir;
  std::string conf;
  std::vector<std::pair<std::string, pid_t>> daemons;  // in start order
};

// The experiment of every run: data_parallel_test's tiny Llama on mock tokens, 20 steps, global batch 8 (two ranks
// of micro-batch 2 accumulate two micro-batches each). `extra` lines go under overrides.
std::string write_config(const std::string& dir, const std::string& exp_name, const std::string& extra = "") {
  const std::string path = dir + "/" + exp_name + ".yaml";
  std::ofstream(path) << "exp_name: " << exp_name << "\n"
                      << "workspace: " << dir << "/workspace\n"
                      << "slurm:\n"
                         "  nodes: 2\n"
                         "  time: \"0:10:00\"\n"
                         "modules:\n"
                         "  pre_trainer:\n"
                         "    framework: megatron\n"
                         "    model: tiny_llama\n"
                         "    overrides:\n"
                         "      train_iters: 20\n"
                         "      micro_batch_size: 2\n"
                         "      global_batch_size: 8\n"
                         "      seq_length: 32\n"
                         "      lr: 3.0e-3\n"
                         "      lr_warmup_iters: 2\n"
                         "      weight_decay: 0.1\n"
                         "      clip_grad: 0.5\n"
                         "      log_interval: 1\n"
                         "      eval_interval: 0\n"
                         "      mock_data: true\n"
                         "      device: cpu\n"
                         "      distributed_timeout_minutes: 1\n"
                      << extra;
  return path;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> values;
  std::istringstream in(read_text(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) values.push_back(nlohmann::json::parse(line)["loss"]);
  return values;
}

void expect_same_losses(const std::vector<double>& one, const std::vector<double>& job, const std::string& what) {
  ASSERT_EQ(one.size(), 20u);
  ASSERT_EQ(job.size(), one.size()) << what;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_LE(std::abs(one[i] - job[i]), 1e-5 * std::abs(one[i]))
        << what << ": loss of step " << i + 1 << ": " << one[i] << " vs " << job[i];
  }
}

class SlurmCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) {
      skip_ = "the test cluster's daemons (slurmctld, slurmd, munged) run as root; this is uid " +
              std::to_string(::geteuid());
      return;
    }
    for (const char* program : {"munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "squeue"}) {
      if (find_program(program).empty()) {
        skip_ = std::string(program) +
                " not found: install Debian's slurm-wlm and munge (bash scripts/setup.sh --test) to run these tests";
        return;
      }
    }
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    cluster_ = new Cluster;
    ready_ = start_cluster(*cluster_);
  }

  // False after a failure naming the daemon that did not come up.
  static bool start_cluster(Cluster& c) {
    c.dir = testing::temp_dir("slurm_cluster");
    c.conf = c.dir + "/slurm.conf";
    for (const char* sub : {"state", "spool", "log"}) fs::create_directories(c.dir + "/" + sub);
    ::chmod(c.dir.c_str(), 0755);  // munged requires its socket's folders to be searchable by all
    // A fresh MUNGE key, readable by root only (munged refuses a key others may read).
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      random.read(key.data(), static_cast<std::streamsize>(key.size()));
      std::ofstream(c.dir + "/munge.key", std::ios::binary) << key;
      ::chmod((c.dir + "/munge.key").c_str(), 0600);
    }
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const int ctld_port = testing::free_port();
    const int n1_port = testing::free_port();
    int n2_port = testing::free_port();
    while (n2_port == n1_port || n2_port == ctld_port) n2_port = testing::free_port();
    // PARALLEL.md: per-node spool, pid and log files (%n; else the second node refuses jobs, "credential
    // replayed"), a Port per node, NodeAddr 127.0.0.1, linuxproc process tracking, no task plugin, cons_tres.
    std::ofstream(c.conf) << fmt::format(
        "ClusterName=primustest\n"
        "SlurmctldHost=localhost(127.0.0.1)\n"
        "SlurmctldPort={ctld}\n"
        "SlurmUser=root\n"
        "SlurmdUser=root\n"
        "AuthType=auth/munge\n"
        "AuthInfo=socket={dir}/munge.socket\n"
        "CredType=cred/munge\n"
        "StateSaveLocation={dir}/state\n"
        "SlurmdSpoolDir={dir}/spool/%n\n"
        "SlurmctldPidFile={dir}/slurmctld.pid\n"
        "SlurmdPidFile={dir}/slurmd-%n.pid\n"
        "SlurmctldLogFile={dir}/log/slurmctld.log\n"
        "SlurmdLogFile={dir}/log/slurmd-%n.log\n"
        "ProctrackType=proctrack/linuxproc\n"
        "TaskPlugin=task/none\n"
        "SelectType=select/cons_tres\n"
        "SchedulerType=sched/builtin\n"
        "ReturnToService=2\n"
        "MpiDefault=none\n"
        "JobCompType=jobcomp/none\n"
        "AccountingStorageType=accounting_storage/none\n"
        "JobAcctGatherType=jobacct_gather/none\n"
        "SlurmctldTimeout=30\n"
        "SlurmdTimeout=30\n"
        "InactiveLimit=0\n"
        "KillWait=3\n"
        "MessageTimeout=20\n"
        "NodeName=n1 NodeAddr=127.0.0.1 NodeHostname={host} Port={n1} CPUs=1 State=UNKNOWN\n"
        "NodeName=n2 NodeAddr=127.0.0.1 NodeHostname={host} Port={n2} CPUs=1 State=UNKNOWN\n"
        "PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP\n",
        fmt::arg("ctld", ctld_port), fmt::arg("dir", c.dir), fmt::arg("host", host), fmt::arg("n1", n1_port),
        fmt::arg("n2", n2_port));
    setenv("SLURM_CONF", c.conf.c_str(), 1);

    const std::string log = c.dir + "/log/";
    c.daemons.emplace_back("munged",
                           start_daemon({find_program("munged"), "-F", "--socket=" + c.dir + "/munge.socket",
                                         "--key-file=" + c.dir + "/munge.key", "--pid-file=" + c.dir + "/munged.pid",
                                         "--log-file=" + log + "munged.log", "--seed-file=" + c.dir + "/munged.seed"},
                                        log + "munged.out"));
    if (!wait_until("munged's socket " + c.dir + "/munge.socket", 20,
                    [&] { return fs::exists(c.dir + "/munge.socket"); })) {
      return false;
    }
    c.daemons.emplace_back("slurmctld",
                           start_daemon({find_program("slurmctld"), "-D", "-f", c.conf}, log + "ctld.out"));
    if (!wait_until("slurmctld to answer scontrol ping", 60, [&] {
          std::string out;
          return run_shell("scontrol ping", 10, &out) == 0 && out.find("is UP") != std::string::npos;
        })) {
      return false;
    }
    for (const char* node : {"n1", "n2"}) {
      c.daemons.emplace_back(
          std::string("slurmd ") + node,
          start_daemon({find_program("slurmd"), "-D", "-N", node, "-f", c.conf}, log + "slurmd-" + node + ".out"));
    }
    return wait_until("nodes n1 and n2 to be idle (sinfo)", 60, [&] {
      std::string out;
      return run_shell("sinfo -h -N -o %N:%t", 10, &out) == 0 && out.find("n1:idle") != std::string::npos &&
             out.find("n2:idle") != std::string::npos;
    });
  }

  // Polls `ready` every 200 ms; fails the set-up naming what it waited for, with the daemons' logs.
  template <typename Ready>
  static bool wait_until(const std::string& what, int limit_s, Ready ready) {
    std::string why = fmt::format("waited {} s for {}", limit_s, what);
    for (auto deadline = Clock::now() + std::chrono::seconds(limit_s); Clock::now() < deadline;) {
      if (ready()) return true;
      bool died = false;
      for (auto& [name, pid] : cluster_->daemons) {
        int status = 0;
        if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid) {
          why = fmt::format("{} exited (status {}) while waiting for {}", name, status, what);
          pid = -1;
          died = true;
        }
      }
      if (died) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::string logs;
    for (const auto& entry : fs::directory_iterator(cluster_->dir + "/log")) {
      logs += "---- " + entry.path().string() + "\n" + read_text(entry.path()).substr(0, 4000);
    }
    ADD_FAILURE() << why << "; the cluster's logs:\n" << logs;
    return false;
  }

  static void TearDownTestSuite() {
    if (cluster_ == nullptr) return;
    // Jobs first (their steps would outlive slurmd), then the daemons in reverse order, then anything orphaned to us.
    if (ready_) {
      run_shell("scancel --full --quiet --user=root", 20);
      for (int i = 0; i < 100; ++i) {
        std::string out;
        if (run_shell("squeue -h -o %i", 10, &out) != 0 || out.empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    for (auto it = cluster_->daemons.rbegin(); it != cluster_->daemons.rend(); ++it) {
      if (it->second > 0) stop(it->second, it->first);
    }
    for (pid_t pid : children()) stop(pid, "orphaned job process " + std::to_string(pid));
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    unsetenv("SLURM_CONF");
    delete cluster_;
    cluster_ = nullptr;
    ready_ = false;
  }

  // SIGTERM, then SIGKILL after 10 s; reaped either way.
  static void stop(pid_t pid, const std::string& what) {
    ::kill(pid, SIGTERM);
    for (auto deadline = Clock::now() + std::chrono::seconds(10); Clock::now() < deadline;) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << what << " (pid " << pid << ") did not stop within 10 s of SIGTERM; killed";
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(ready_) << "the cluster did not start (the set-up's failure says why)";
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "PRIMUS_LAUNCHED", "RANK",
                             "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"}) {
      unsetenv(name);
    }
    dir_ = testing::temp_dir("slurm_job");
  }

  // primus-cli with `args`, waited for at most `limit_s` (then killed: a failure naming the command).
  CliResult run(const std::vector<std::string>& args, int limit_s = 150) {
    pid_t pid = testing::spawn_cli(args, dir_);
    for (auto deadline = Clock::now() + std::chrono::seconds(limit_s); Clock::now() < deadline;) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        CliResult result;
        result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
        result.out = read_text(dir_ + "/stdout");
        result.err = read_text(dir_ + "/stderr");
        return result;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGTERM);
    CliResult result = testing::wait_cli(pid, dir_);
    ADD_FAILURE() << "primus-cli " << ::testing::PrintToString(args) << " did not finish in " << limit_s << " s:\n"
                  << result.err;
    return result;
  }

  // One process, no Slurm: the losses every job must reproduce.
  std::vector<double> one_process_losses(const std::string& config) {
    CliResult result = run({"--", "train", "pretrain", "--config", config, "exp_name=single"});
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return losses(dir_ + "/workspace/single");
  }

  static std::string skip_;
  static Cluster* cluster_;
  static bool ready_;
  std::string dir_;
};

std::string SlurmCluster::skip_;
bool SlurmCluster::ready_ = false;
Cluster* SlurmCluster::cluster_ = nullptr;

TEST_F(SlurmCluster, SrunOfTwoNodesTrainsAsOneProcess) {
  const std::string config = write_config(dir_, "srun2");
  const std::vector<double> one = one_process_losses(config);
  const auto start = Clock::now();
  CliResult result = run({"slurm", "srun", "-N", "2", "--nproc-per-node", "1", "--master-port",
                          std::to_string(testing::free_port()), "--", "train", "pretrain", "--config", config});
  std::printf("srun job of 2 nodes: %.1f s\n", std::chrono::duration<double>(Clock::now() - start).count());
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // Each node's entry derived its place in the job from Slurm and found the first node's address.
  EXPECT_CONTAINS(result.err, "slurm node: job ");
  EXPECT_CONTAINS(result.err, ", node 0 of 2 (SLURM_NODEID 0), master n1 = 127.0.0.1");
  EXPECT_CONTAINS(result.err, ", node 1 of 2 (SLURM_NODEID 1), master n1 = 127.0.0.1");
  EXPECT_CONTAINS(result.err, "distributed: rank 0 of 2 (gloo)");
  EXPECT_CONTAINS(result.err, "slurm: the job finished on 2 node(s)");
  expect_same_losses(one, losses(dir_ + "/workspace/srun2"), "srun, 2 nodes x 1 rank");
}

TEST_F(SlurmCluster, SbatchWritesItsScriptIntoTheRunDirectoryAndTrainsAsOneProcess) {
  const std::string config = write_config(dir_, "sbatch2");
  const std::vector<double> one = one_process_losses(config);
  const auto start = Clock::now();
  CliResult result = run({"slurm", "sbatch", "--nproc-per-node", "1", "--master-port",
                          std::to_string(testing::free_port()), "--", "train", "pretrain", "--config", config});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(result.out, match, std::regex(R"(Submitted batch job (\d+))"))) << result.out;
  const std::string job_id = match[1];
  const std::string run_dir = dir_ + "/workspace/sbatch2";
  // The job runs on after sbatch returns: wait until the queue no longer has it.
  bool done = false;
  for (auto deadline = Clock::now() + std::chrono::seconds(120); !done && Clock::now() < deadline;) {
    std::string out;
    done = run_shell("squeue -h -j " + job_id + " -o %T", 10, &out) == 0 && out.empty();
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(done) << "job " << job_id << " still queued or running after 120 s";
  std::printf("sbatch job of 2 nodes: %.1f s from submission to the end\n",
              std::chrono::duration<double>(Clock::now() - start).count());
  std::vector<fs::path> scripts;
  for (const auto& entry : fs::directory_iterator(run_dir + "/slurm")) {
    if (entry.path().extension() == ".sh") scripts.push_back(entry.path());
  }
  ASSERT_EQ(scripts.size(), 1u);
  const std::string script = read_text(scripts[0]);
  EXPECT_CONTAINS(script, "#SBATCH --nodes=2\n");  // from the config's slurm: section
  EXPECT_CONTAINS(script, "#SBATCH --time=0:10:00\n");
  EXPECT_CONTAINS(script, "#SBATCH --job-name=sbatch2\n");
  EXPECT_CONTAINS(script, "#SBATCH --output=" + run_dir + "/slurm/job-%j.out\n");
  const std::string output = read_text(run_dir + "/slurm/job-" + job_id + ".out");
  EXPECT_CONTAINS(output, "distributed: rank 0 of 2 (gloo)");
  expect_same_losses(one, losses(run_dir), "sbatch, 2 nodes x 1 rank");
}

TEST_F(SlurmCluster, AJobThatFailsOnOneNodeNamesTheNodeAndTheRank) {
  // hidden_dropout must be 0: valid where the config is checked before submission and on node 0, not on node 1.
  const std::string config = write_config(dir_, "fails", "      hidden_dropout: ${SLURM_NODEID:0}\n");
  for (const char* launcher : {"srun", "sbatch"}) {
    std::vector<std::string> args{"slurm", launcher};
    if (std::string(launcher) == "sbatch") args.push_back("--wait");
    for (const std::string& word : {std::string("--nproc-per-node"), std::string("1"), std::string("--master-port"),
                                    std::to_string(testing::free_port()), std::string("--"), std::string("train"),
                                    std::string("pretrain"), std::string("--config"), config}) {
      args.push_back(word);
    }
    const auto start = Clock::now();
    CliResult result = run(args);
    std::printf("%s job failing on node 1: reported after %.1f s\n", launcher,
                std::chrono::duration<double>(Clock::now() - start).count());
    EXPECT_EQ(result.exit_code, 2) << launcher << "\n" << result.err;
    EXPECT_CONTAINS(result.err,
                    "failed on node n2 (task 1, NODE_RANK 1): it exited with code 2; the other nodes were "
                    "stopped");
    EXPECT_CONTAINS(result.err, "primus-cli: error: rank 1 (pid ");
    EXPECT_CONTAINS(result.err, "hidden_dropout");
    // Rank 0, stopped by Slurm because of rank 1, may log how it ended, but is not reported as a failure.
    EXPECT_EQ(result.err.find("error: rank 0 (pid"), std::string::npos) << "rank 0 was blamed:\n" << result.err;
    if (HasFailure() && std::string(launcher) == "sbatch") {
      for (const auto& entry : fs::directory_iterator(dir_ + "/workspace/fails/slurm")) {
        if (entry.path().extension() == ".out") std::cout << entry.path() << ":\n" << read_text(entry.path());
      }
    }
  }
}

// SIGTERM to `primus-cli slurm srun` reaches every rank once (scancel --signal, not srun's own kill): each saves
// the checkpoint and the job exits 143; the same command then resumes from it.
TEST_F(SlurmCluster, SigtermToTheLauncherCheckpointsTheJob) {
  const std::string config = write_config(dir_, "stopped");
  const std::string port = std::to_string(testing::free_port());
  pid_t launcher = testing::spawn_cli({"slurm", "srun", "--nproc-per-node", "1", "--master-port", port, "--", "train",
                                       "pretrain", "--config", config, "train_iters=1000000"},
                                      dir_);
  const std::string metrics = dir_ + "/workspace/stopped/metrics.jsonl";
  for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
    if (read_text(metrics).find("\"step\":3,") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (read_text(metrics).find("\"step\":3,") == std::string::npos) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
    run_shell("scancel --quiet --user=root", 20);
    FAIL() << "the job did not reach step 3 within 60 s:\n" << read_text(dir_ + "/stderr");
  }
  ASSERT_EQ(::kill(launcher, SIGTERM), 0);
  CliResult result;
  for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
    int status = 0;
    if (::waitpid(launcher, &status, WNOHANG) == launcher) {
      result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (result.exit_code == -1) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
    run_shell("scancel --quiet --user=root", 20);
    FAIL() << "primus-cli slurm srun did not end within 60 s of SIGTERM:\n" << read_text(dir_ + "/stderr");
  }
  result.err = read_text(dir_ + "/stderr");
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  EXPECT_CONTAINS(result.err, "slurm: SIGTERM received: sent to every process of job ");
  EXPECT_CONTAINS(result.err, "saved checkpoint ");
  EXPECT_EQ(result.err.find("second stop signal"), std::string::npos) << "a rank got SIGTERM twice:\n" << result.err;
  const std::string checkpoints = dir_ + "/workspace/stopped/checkpoints";
  const int saved = std::stoi(read_text(checkpoints + "/latest_checkpointed_iteration.txt"));
  EXPECT_GE(saved, 3);

  result = run({"slurm", "srun", "--nproc-per-node", "1", "--master-port", std::to_string(testing::free_port()), "--",
                "train", "pretrain", "--config", config, "train_iters=" + std::to_string(saved + 2)});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.err, "resumed from");
  EXPECT_EQ(std::stoi(read_text(checkpoints + "/latest_checkpointed_iteration.txt")), saved + 2);
}

// Inside an allocation of both nodes, a job step on n2 alone has n2 as its master (the step's first node, not
// the allocation's); Slurm flags primus-cli does not know (--nodelist) reach srun.
TEST_F(SlurmCluster, AStepOnSomeNodesOfAnAllocationUsesItsOwnFirstNode) {
  const std::string config = write_config(dir_, "step");
  std::string out;
  const int code = run_shell(fmt::format("salloc -N 2 -J alloc {} slurm srun -N 1 --nodelist=n2 --nproc-per-node 1 "
                                         "--master-port {} -- config validate --config {}",
                                         testing::cli_path().string(), testing::free_port(), config),
                             120, &out);
  EXPECT_EQ(code, 0) << out;
  EXPECT_CONTAINS(out, "--nodelist=n2 ");
  EXPECT_CONTAINS(out, ", node 0 of 1 (SLURM_NODEID 0), master n2 = 127.0.0.1");
  EXPECT_CONTAINS(out, "OK: " + config);
}

// `slurm node` expands the job's node list with scontrol; primus-cli's own expansion (its fallback) agrees.
TEST_F(SlurmCluster, HostListsExpandAsScontrolExpandsThem) {
  for (const char* list : {"n[1-2]", "gpu[08-11,13],login1", "a[1-2]-ib[0-1]"}) {
    std::string out;
    ASSERT_EQ(run_shell(std::string("scontrol show hostnames ") + list, 20, &out), 0) << out;
    std::vector<std::string> expected;
    std::istringstream lines(out);
    for (std::string host; std::getline(lines, host);) expected.push_back(host);
    EXPECT_EQ(cli::expand_hostlist(list), expected) << list;
  }
}

// Without the cluster: what a user sees before submitting, and the node entry outside a job.
class SlurmCli : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    for (const char* name : {"SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST"}) unsetenv(name);
    dir_ = testing::temp_dir("slurm_cli");
  }
  CliResult run(const std::vector<std::string>& args) {
    return testing::wait_cli(testing::spawn_cli(args, dir_), dir_);
  }
  std::string dir_;
};

TEST_F(SlurmCli, DryRunPrintsTheBatchScriptAndSubmitsNothing) {
  const std::string config = write_config(dir_, "dry");
  CliResult result = run({"--dry-run", "slurm", "sbatch", "-N", "4", "--partition", "p", "--", "train", "pretrain",
                          "--config", config, "lr=1e-3"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.out, "primus-cli dry run: nothing was submitted\n");
  EXPECT_CONTAINS(result.out, "  slurm        nodes 4 (from -N 4)\n");
  EXPECT_CONTAINS(result.out, "  slurm        time 0:10:00 (from slurm.time at ");
  EXPECT_CONTAINS(result.out, "---- batch script ----\n#!/bin/bash\n");
  EXPECT_CONTAINS(result.out, "#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=1\n#SBATCH --partition=p\n");
  EXPECT_CONTAINS(result.out, "\nsrun --ntasks-per-node=1 --kill-on-bad-exit=1 " + testing::cli_path().string() +
                                  " slurm node -- train pretrain --config " + config + " lr=1e-3\n");
  EXPECT_FALSE(fs::exists(dir_ + "/workspace")) << "a dry run wrote into the run directory";

  result = run({"slurm", "--dry-run", "srun", "-t", "1:00:00", "--", "train", "pretrain", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.out,
                  "  srun         srun --job-name=dry --nodes=2 --ntasks-per-node=1 --time=1:00:00 "
                  "--kill-on-bad-exit=1 " +
                      testing::cli_path().string() + " slurm node -- train pretrain --config " + config + "\n");
}

// A node whose step is cancelled while it asks scontrol (another node failed first) starts no worker: it must not
// launch with the host name it falls back to when scontrol says nothing. A scontrol that hangs stands in for it.
TEST_F(SlurmCli, AStopSignalWhileAskingScontrolStartsNoWorker) {
  const std::string bin = dir_ + "/bin";
  fs::create_directories(bin);
  std::ofstream(bin + "/scontrol") << "#!/bin/sh\nexec sleep 30\n";
  fs::permissions(bin + "/scontrol", fs::perms::owner_all);
  const std::string path = std::getenv("PATH");
  setenv("PATH", (bin + ":" + path).c_str(), 1);
  setenv("SLURM_JOB_ID", "7", 1);
  setenv("SLURM_NNODES", "2", 1);
  setenv("SLURM_NODEID", "0", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  const std::string config = write_config(dir_, "stopped");
  pid_t pid = testing::spawn_cli({"slurm", "node", "--", "config", "validate", "--config", config}, dir_);
  setenv("PATH", path.c_str(), 1);
  for (const char* name : {"SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST"}) unsetenv(name);
  // Wait until the fake scontrol runs (a child of primus-cli), then stop the node entry as slurmstepd would.
  bool asking = false;
  for (auto deadline = Clock::now() + std::chrono::seconds(20); !asking && Clock::now() < deadline;) {
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string stat = read_text(entry.path() / "stat");
      asking = asking || (stat.find("(sleep)") != std::string::npos &&
                          stat.find(") S " + std::to_string(pid) + " ") != std::string::npos);
    }
    if (!asking) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(asking) << "the node entry did not run scontrol:\n" << read_text(dir_ + "/stderr");
  ::kill(-pid, SIGTERM);  // the whole process group, as slurmstepd signals every process of the step
  ::kill(pid, SIGTERM);
  CliResult result = testing::wait_cli(pid, dir_);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  EXPECT_CONTAINS(result.err, "slurm node: stopped by signal 15 before the workers started");
  EXPECT_EQ(result.err.find("started, pid"), std::string::npos) << result.err;
}

TEST_F(SlurmCli, BadInputExitsTwoBeforeAnythingIsSubmitted) {
  const std::string config = write_config(dir_, "bad");
  CliResult result = run({"slurm", "srun", "-N", "0", "--", "train", "pretrain", "--config", config});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "primus-cli: error: -N 0: expected a whole number >= 1");
  result = run({"slurm", "srun", "--", "train", "pretrain", "--config", config, "slurm.time=4h"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "slurm.time: '4h' is not a Slurm time");
  result = run({"slurm", "sbatch", "--", "train", "pretrian", "--config", config});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "unknown command 'pretrian'");
  result = run({"slurm", "node", "--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "primus-cli slurm node runs inside a Slurm job step");
}

}  // namespace
}  // namespace primus
