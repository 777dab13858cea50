// The pure half of `primus-cli slurm` (src/cli/slurm_script.cpp) and the experiment's `slurm:` section
// (src/config/slurm_section.cpp): argument parsing, flags over config, the exact srun command and batch script,
// host lists, `scontrol show node` output and srun's failure lines. The real cluster: slurm_cluster_test.cpp.
#include "cli/slurm_script.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "support/test_support.h"

namespace primus::cli {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

std::string usage_error(const std::vector<std::string>& words) {
  try {
    parse_slurm_arguments(words);
  } catch (const UsageError& error) {
    return error.what();
  }
  return "";
}

TEST(SlurmArguments, LongShortAndAttachedFormsAndPassthrough) {
  SlurmArguments a = parse_slurm_arguments({"sbatch",
                                            "-N",
                                            "4",
                                            "--partition=gpu",
                                            "-t4:00:00",
                                            "-J",
                                            "run",
                                            "--account",
                                            "proj",
                                            "--gpus-per-node",
                                            "h100:8",
                                            "-o",
                                            "o-%j.txt",
                                            "--mem",
                                            "10G",
                                            "--exclusive",
                                            "--nproc-per-node",
                                            "2",
                                            "--master-port=1234",
                                            "-W",
                                            "--dry-run"});
  EXPECT_EQ(a.launcher, "sbatch");
  EXPECT_EQ(a.given.nodes, 4);
  EXPECT_EQ(a.given.partition, "gpu");
  EXPECT_EQ(a.given.time, "4:00:00");
  EXPECT_EQ(a.given.job_name, "run");
  EXPECT_EQ(a.given.account, "proj");
  EXPECT_EQ(a.given.gpus_per_node, 8);
  EXPECT_EQ(a.gpus_per_node_text, "h100:8");
  EXPECT_EQ(a.given.output, "o-%j.txt");
  EXPECT_EQ(a.passthrough, (std::vector<std::string>{"--mem", "10G", "--exclusive"}));
  EXPECT_EQ(a.nproc_per_node, 2);
  EXPECT_EQ(a.master_port, 1234);
  EXPECT_TRUE(a.wait);
  EXPECT_TRUE(a.dry_run);
  EXPECT_EQ(a.given.sources.at("nodes"), "-N 4");
  EXPECT_EQ(a.given.sources.at("partition"), "--partition gpu");

  SlurmArguments plain = parse_slurm_arguments({"--nodes", "2"});
  EXPECT_EQ(plain.launcher, "srun");  // the default
  EXPECT_EQ(plain.given.nodes, 2);
  EXPECT_FALSE(plain.wait);
  EXPECT_EQ(parse_slurm_arguments({"node", "--nproc-per-node", "3"}).nproc_per_node, 3);
}

TEST(SlurmArguments, BadFlagsNameTheFlag) {
  EXPECT_CONTAINS(usage_error({"srun", "-N", "0"}), "-N 0: expected a whole number >= 1, got '0'");
  EXPECT_CONTAINS(usage_error({"srun", "--nodes=2-4"}), "--nodes 2-4: a node range ('2-4') is not supported");
  EXPECT_CONTAINS(usage_error({"srun", "-t", "4h"}), "-t 4h: '4h' is not a Slurm time");
  EXPECT_CONTAINS(usage_error({"srun", "--gpus-per-node", "h100:x"}), "--gpus-per-node h100:x: expected [TYPE:]COUNT");
  EXPECT_CONTAINS(usage_error({"srun", "-p"}), "-p: needs a value");
  EXPECT_CONTAINS(usage_error({"srun", "--master-port", "70000"}), "--master-port 70000: must be a TCP port");
  EXPECT_CONTAINS(usage_error({"srun", "-n", "8"}), "-n: primus-cli slurm runs one task per node");
  EXPECT_CONTAINS(usage_error({"sbatch", "--ntasks-per-node=8"}), "--ntasks-per-node=8: primus-cli slurm runs one");
  EXPECT_CONTAINS(usage_error({"srun", "train"}), "'train' is not a Slurm flag");
  EXPECT_CONTAINS(usage_error({"-N", "2", "sbatch"}), "'sbatch' must come first after 'slurm'");
  EXPECT_CONTAINS(usage_error({"node", "-N", "2"}), "primus-cli slurm node takes only --nproc-per-node");
  EXPECT_CONTAINS(usage_error({"node", "--mem", "1G"}), "primus-cli slurm node takes only --nproc-per-node");
}

SlurmSettings config_settings() {
  SlurmSettings s;
  s.nodes = 8;
  s.partition = "big";
  s.time = "2-00:00:00";
  s.gpus_per_node = 4;
  s.sources = {
      {"nodes", "exp.yaml:3"}, {"partition", "exp.yaml:4"}, {"time", "exp.yaml:5"}, {"gpus_per_node", "exp.yaml:6"}};
  return s;
}

TEST(SlurmJob, FlagsWinOverTheConfigWhichWinsOverDefaults) {
  SlurmJob job = merge_slurm_job(parse_slurm_arguments({"sbatch", "-N", "2"}), config_settings(), "/runs/exp", "exp");
  EXPECT_EQ(job.nodes, 2);
  EXPECT_EQ(job.partition, "big");
  EXPECT_EQ(job.time, "2-00:00:00");
  EXPECT_EQ(job.job_name, "exp");
  EXPECT_EQ(job.gpus_per_node, "4");
  EXPECT_EQ(job.nproc_per_node, 4);  // one worker per requested GPU
  EXPECT_EQ(job.output, "/runs/exp/slurm/job-%j.out");
  ASSERT_GE(job.origins.size(), 4u);
  EXPECT_EQ(job.origins[0], "nodes 2 (from -N 2)");
  EXPECT_EQ(job.origins[1], "partition big (from slurm.partition at exp.yaml:4)");

  SlurmJob srun = merge_slurm_job(parse_slurm_arguments({"--nproc-per-node", "1", "-J", "mine"}), SlurmSettings{},
                                  "/runs/exp", "exp");
  EXPECT_EQ(srun.launcher, "srun");
  EXPECT_EQ(srun.nodes, 1);
  EXPECT_EQ(srun.job_name, "mine");
  EXPECT_EQ(srun.output, "");  // srun's output is the console
  EXPECT_EQ(srun.nproc_per_node, 1);
}

TEST(SlurmJob, TheSrunCommandIsExact) {
  SlurmJob job = merge_slurm_job(
      parse_slurm_arguments({"srun", "-N", "2", "-p", "debug", "--exclusive", "--master-port", "29600", "--debug"}),
      SlurmSettings{}, "/runs/exp", "exp");
  std::vector<std::string> entry =
      node_entry_argv(job, "/opt/primus/primus-cli", {"train", "pretrain", "--config", "e.yaml"});
  EXPECT_EQ(shell_join(entry),
            "/opt/primus/primus-cli --debug slurm node --master-port 29600 -- train pretrain --config e.yaml");
  EXPECT_EQ(shell_join(srun_argv(job, entry)),
            "srun --job-name=exp --nodes=2 --ntasks-per-node=1 --partition=debug --kill-on-bad-exit=1 --exclusive "
            "/opt/primus/primus-cli --debug slurm node --master-port 29600 -- train pretrain --config e.yaml");
}

TEST(SlurmJob, TheBatchScriptIsOneASlurmUserWouldWrite) {
  SlurmJob job = merge_slurm_job(
      parse_slurm_arguments({"sbatch", "-N", "4", "--partition", "p", "-A", "acct", "--mem", "10G", "--exclusive"}),
      SlurmSettings{}, "/runs/exp", "exp");
  std::vector<std::string> entry =
      node_entry_argv(job, "/opt/primus-cli", {"train", "pretrain", "--config", "my exp.yaml"});
  std::string script = sbatch_script(job, entry, "/home/me", {"header line"});
  EXPECT_EQ(script.substr(0, script.find("\nsrun ")),
            "#!/bin/bash\n"
            "# header line\n"
            "#SBATCH --job-name=exp\n"
            "#SBATCH --nodes=4\n"
            "#SBATCH --ntasks-per-node=1\n"
            "#SBATCH --partition=p\n"
            "#SBATCH --account=acct\n"
            "#SBATCH --output=/runs/exp/slurm/job-%j.out\n"
            "#SBATCH --chdir=/home/me\n"
            "#SBATCH --mem 10G\n"
            "#SBATCH --exclusive\n"
            "\n"
            "# One task per node: `primus-cli slurm node` takes NNODES, NODE_RANK and MASTER_ADDR from SLURM_NNODES,\n"
            "# SLURM_NODEID and the first host of the step's nodes (its NodeAddr), then starts the node's workers.\n"
            "# A failing node stops the others (--kill-on-bad-exit); its error and the rank's last lines are above.");
  EXPECT_CONTAINS(script,
                  "\nsrun --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/primus-cli slurm node -- train pretrain "
                  "--config 'my exp.yaml'\nstatus=$?\n");
  EXPECT_CONTAINS(script, "exit \"$status\"\n");

  // The script runs as written under bash: syntax-checked here, run for real by slurm_cluster_test.
  const std::string path = testing::temp_dir("sbatch_script") + "/job.sh";
  std::ofstream(path) << script;
  EXPECT_EQ(std::system(("bash -n '" + path + "'").c_str()), 0) << script;
}

TEST(SlurmScript, ShellQuoting) {
  EXPECT_EQ(shell_quote("a/b-c.yaml"), "a/b-c.yaml");
  EXPECT_EQ(shell_quote("lr=1e-3"), "lr=1e-3");
  EXPECT_EQ(shell_quote("two words"), "'two words'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST(SlurmScript, HostListsExpandAsScontrolDoes) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_hostlist("n1"), V{"n1"});
  EXPECT_EQ(expand_hostlist("n[1-3]"), (V{"n1", "n2", "n3"}));
  EXPECT_EQ(expand_hostlist("gpu[08-10,12],login"), (V{"gpu08", "gpu09", "gpu10", "gpu12", "login"}));
  EXPECT_EQ(expand_hostlist("a[1-2]-ib[0-1]"), (V{"a1-ib0", "a1-ib1", "a2-ib0", "a2-ib1"}));
  EXPECT_EQ(expand_hostlist("x,y[3]"), (V{"x", "y3"}));
  EXPECT_THROW(expand_hostlist("n[1-3"), UsageError);
  EXPECT_THROW(expand_hostlist("n1-3]"), UsageError);
  EXPECT_THROW(expand_hostlist("n[3-1]"), UsageError);
  EXPECT_THROW(expand_hostlist("n[a-b]"), UsageError);
}

TEST(SlurmScript, NodeAddrAndOutputPaths) {
  EXPECT_EQ(parse_node_addr("NodeName=n1 Arch=x86_64 CoresPerSocket=1\n   NodeAddr=10.1.2.3 NodeHostName=host1 "
                            "Version=22.05.8\n"),
            "10.1.2.3");
  EXPECT_EQ(parse_node_addr("NodeName=n1 Arch=x86_64\n"), "");
  EXPECT_EQ(resolve_output_path("/r/job-%j.out", "42", "exp"), "/r/job-42.out");
  EXPECT_EQ(resolve_output_path("%x-%j-100%%.log", "7", "exp"), "exp-7-100%.log");
  EXPECT_EQ(resolve_output_path("/r/%N-%j.out", "7", "exp"), std::nullopt);
}

TEST(SlurmScript, TheFailingTaskIsTheOneThatWasNotStopped) {
  // As srun 22.05 reported the failure test's job: node 2's task failed, node 1's was stopped because of it.
  std::optional<SrunFailure> f = find_failed_task(
      "srun: error: n1: task 0: Exited with exit code 143\n"
      "srun: launch/slurm: _step_signal: Terminating StepId=4.0\n"
      "srun: error: n2: task 1: Exited with exit code 2\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->node, "n2");
  EXPECT_EQ(f->tasks, "1");
  EXPECT_EQ(f->exit_code, 2);
  EXPECT_EQ(f->how, "exited with code 2");

  f = find_failed_task("srun: error: n1: task 0: Killed\nsrun: error: gpu7: tasks 2-3: Exited with exit code 3\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->node, "gpu7");
  EXPECT_EQ(f->tasks, "2-3");
  EXPECT_EQ(f->exit_code, 3);

  f = find_failed_task("srun: error: n1: task 0: Killed\nsrun: error: n2: task 1: Terminated\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->node, "n1");  // only stopped tasks: the first reported
  EXPECT_EQ(f->how, "was killed");
  EXPECT_EQ(f->exit_code, -1);
  EXPECT_FALSE(find_failed_task("all fine\n"));
}

TEST(SlurmTime, SlurmFormats) {
  for (const char* ok : {"90", "90:30", "4:00:00", "2-0", "2-12:30", "2-12:30:00", "UNLIMITED", "infinite"}) {
    EXPECT_TRUE(is_slurm_time(ok)) << ok;
  }
  for (const char* bad : {"", "4h", "1:2:3:4", "-5", "2-", "a:00", "1-2-3"}) EXPECT_FALSE(is_slurm_time(bad)) << bad;
}

// The config's slurm: section: both spellings, typed, errors naming file, line and key, and it survives the
// effective config.yaml.
class SlurmSection : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    dir_ = testing::temp_dir("slurm_section");
  }
  std::string write(const std::string& slurm_lines) {
    const std::string path = dir_ + "/exp.yaml";
    std::ofstream(path) << "exp_name: e\nworkspace: " << dir_ << "\nslurm:\n"
                        << slurm_lines
                        << "modules:\n  pre_trainer:\n    framework: megatron\n    model: tiny_llama\n"
                           "    overrides: {train_iters: 2, seq_length: 16, lr: 1.0e-3, mock_data: true}\n";
    return path;
  }
  std::string error_of(const std::string& slurm_lines) {
    try {
      load_experiment_config(write(slurm_lines), {});
    } catch (const UsageError& error) {
      return error.what();
    }
    return "";
  }
  std::string dir_;
};

TEST_F(SlurmSection, ReadsBothSpellingsAndRoundTrips) {
  LoadedConfig loaded = load_experiment_config(
      write("  nodes: 2\n  partition: gpu\n  time: \"4:00:00\"\n  job-name: my-run\n  account: proj\n"
            "  gpus_per_node: 8\n  output: /logs/%j.out\n"),
      {"slurm.nodes=4"});
  const SlurmSettings& s = loaded.config.slurm;
  EXPECT_EQ(s.nodes, 4);  // the command line wins
  EXPECT_EQ(s.partition, "gpu");
  EXPECT_EQ(s.time, "4:00:00");
  EXPECT_EQ(s.job_name, "my-run");
  EXPECT_EQ(s.account, "proj");
  EXPECT_EQ(s.gpus_per_node, 8);
  EXPECT_EQ(s.output, "/logs/%j.out");
  EXPECT_EQ(s.sources.at("nodes"), "command line");
  EXPECT_TRUE(s.sources.at("job_name").ends_with("exp.yaml:7")) << s.sources.at("job_name");
  EXPECT_CONTAINS(format_config_show(loaded), "slurm.job_name");

  // The effective config loads back to the same settings.
  const std::string effective = dir_ + "/effective.yaml";
  std::ofstream(effective) << loaded.config.effective_yaml;
  EXPECT_CONTAINS(loaded.config.effective_yaml, "slurm:\n  nodes: 4\n  partition: gpu\n  time: \"4:00:00\"\n");
  const SlurmSettings again = load_experiment_config(effective, {}).config.slurm;
  EXPECT_EQ(again.nodes, 4);
  EXPECT_EQ(again.time, "4:00:00");
  EXPECT_EQ(again.job_name, "my-run");
  EXPECT_EQ(again.gpus_per_node, 8);
  EXPECT_EQ(again.output, "/logs/%j.out");
}

TEST_F(SlurmSection, BadValuesNameFileLineAndKey) {
  EXPECT_CONTAINS(error_of("  nodes: 0\n"), "exp.yaml:4: slurm.nodes: must be >= 1, got 0");
  EXPECT_CONTAINS(error_of("  nodes: two\n"), "exp.yaml:4: slurm.nodes: expected a whole number");
  EXPECT_CONTAINS(error_of("  time: 4h\n"), "exp.yaml:4: slurm.time: '4h' is not a Slurm time");
  EXPECT_CONTAINS(error_of("  partiton: gpu\n"),
                  "unknown key 'partiton' in the slurm section (did you mean 'partition'?)");
  EXPECT_CONTAINS(error_of("  mem: 10G\n"), "other Slurm flags go on the command line");
  EXPECT_CONTAINS(error_of("  job_name: a\n  job-name: b\n"), "slurm.job_name is given twice");
  EXPECT_CONTAINS(error_of("  partition: [a, b]\n"), "expected a single value");
  EXPECT_CONTAINS(error_of("  gpus-per-node: -1\n"), "must be >= 0, got -1");
}

}  // namespace
}  // namespace primus::cli
