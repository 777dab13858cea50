// MLflow logging of a real training job (configs/examples/tiny_cpu.yaml, shortened), in process: the experiment
// and run meta.yaml, every metrics.jsonl value in its MLflow metric file at the same step, the effective config
// as params, and the final status — FINISHED, KILLED after a stop signal, FAILED when the run throws; a resumed
// run continues the same MLflow run without logging a step twice.
#include <gtest/gtest.h>
#include <signal.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "config/config.h"
#include "core/error.h"
#include "core/file_io.h"
#include "observe/mlflow_store.h"
#include "support/cli_process.h"
#include "support/test_support.h"
#include "train/pretrain.h"
#include "train/signals.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

ExperimentConfig tiny_job(const std::string& dir, std::vector<std::string> extra = {}) {
  static const std::string data = testing::use_default_data();
  if (data.empty()) throw std::runtime_error("scripts/prepare_default_data.sh failed (see stderr)");
  std::vector<std::string> overrides = {"workspace=" + dir + "/workspace",
                                        "train_iters=6",
                                        "eval_interval=3",
                                        "eval_iters=1",
                                        "save_interval=4",
                                        "sample_length=0",
                                        "lr_warmup_iters=1",
                                        "mlflow_tracking_dir=" + dir + "/mlruns"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return load_experiment_config(PRIMUS_SOURCE_DIR "/configs/examples/tiny_cpu.yaml", overrides).config;
}

std::vector<nlohmann::json> read_metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> records;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

struct MetricPoint {
  int64_t timestamp;
  double value;
};

// metrics/<key> parsed as MLflow's reader does: "<timestamp> <value> <step>" per line; fails on a repeated step.
std::map<int64_t, MetricPoint> read_metric(const std::string& run_path, const std::string& key) {
  std::map<int64_t, MetricPoint> points;
  const std::string text = read_file(run_path + "/metrics/" + key);
  EXPECT_TRUE(text.empty() || text.back() == '\n') << key;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string timestamp, value, step, extra;
    fields >> timestamp >> value >> step;
    EXPECT_FALSE(fields >> extra) << key << ": " << line;
    const int64_t s = std::stoll(step);
    EXPECT_FALSE(points.count(s)) << key << ": step " << s << " logged twice";
    points[s] = {std::stoll(timestamp), std::stod(value)};
  }
  return points;
}

struct StoreRun {
  std::string experiment_id, run_id, path;
  YAML::Node meta;
};

// The only run of the only experiment (besides Default) in the store.
StoreRun only_run(const std::string& root) {
  StoreRun run;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name != "0" && name != ".trash") {
      EXPECT_TRUE(run.experiment_id.empty()) << "a second experiment " << name;
      run.experiment_id = name;
    }
  }
  for (const auto& entry : fs::directory_iterator(root + "/" + run.experiment_id)) {
    if (!entry.is_directory()) continue;
    EXPECT_TRUE(run.run_id.empty()) << "a second run " << entry.path();
    run.run_id = entry.path().filename().string();
  }
  run.path = root + "/" + run.experiment_id + "/" + run.run_id;
  run.meta = YAML::Load(read_file(run.path + "/meta.yaml"));
  return run;
}

// Every number of every metrics.jsonl record is in its MLflow file at the record's step with the same value,
// and the files hold nothing else.
void expect_metrics_match_jsonl(const std::string& run_dir, const std::string& run_path) {
  std::map<std::string, std::map<int64_t, double>> expected;
  for (const nlohmann::json& record : read_metrics(run_dir)) {
    for (const auto& [name, value] : record.items()) {
      if (name != "step" && value.is_number()) expected[mlflow_metric_key(name)][record["step"]] = value.get<double>();
    }
  }
  ASSERT_FALSE(expected.empty());
  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(run_path + "/metrics")) {
    if (entry.is_regular_file()) ++files;
  }
  EXPECT_EQ(files, expected.size());
  for (const auto& [key, by_step] : expected) {
    const std::map<int64_t, MetricPoint> logged = read_metric(run_path, key);
    ASSERT_EQ(logged.size(), by_step.size()) << key;
    for (const auto& [step, value] : by_step) {
      ASSERT_TRUE(logged.count(step)) << key << " step " << step;
      EXPECT_EQ(logged.at(step).value, value) << key << " step " << step;
      EXPECT_GT(logged.at(step).timestamp, 1600000000000) << key;
    }
  }
}

TEST(MlflowPretrain, TinyJobLogsExperimentRunParamsAndEveryMetric) {
  const std::string dir = testing::temp_dir("mlflow_e2e");
  const ExperimentConfig c = tiny_job(dir);
  EXPECT_EQ(c.train.mlflow_experiment_name, "tiny_cpu");  // derived from exp_name
  ASSERT_EQ(run_pretrain(c, {}), 0);

  const std::string root = fs::absolute(dir + "/mlruns").lexically_normal().string();
  const StoreRun run = only_run(root);
  const YAML::Node experiment = YAML::Load(read_file(root + "/" + run.experiment_id + "/meta.yaml"));
  EXPECT_EQ(experiment["name"].as<std::string>(), "tiny_cpu");
  EXPECT_EQ(experiment["experiment_id"].as<std::string>(), run.experiment_id);
  EXPECT_EQ(experiment["lifecycle_stage"].as<std::string>(), "active");
  EXPECT_EQ(experiment["artifact_location"].as<std::string>(), "file://" + root + "/" + run.experiment_id);
  EXPECT_EQ(YAML::Load(read_file(root + "/0/meta.yaml"))["name"].as<std::string>(), "Default");

  const YAML::Node& meta = run.meta;
  EXPECT_EQ(meta["run_id"].as<std::string>(), run.run_id);
  EXPECT_EQ(meta["run_uuid"].as<std::string>(), run.run_id);
  EXPECT_EQ(meta["experiment_id"].as<std::string>(), run.experiment_id);
  EXPECT_EQ(meta["run_name"].as<std::string>(), "tiny_cpu");
  EXPECT_EQ(meta["user_id"].as<std::string>(), c.user_name);
  EXPECT_EQ(meta["status"].as<int>(), 3);  // FINISHED
  EXPECT_EQ(meta["lifecycle_stage"].as<std::string>(), "active");
  EXPECT_EQ(meta["source_type"].as<int>(), 4);
  EXPECT_GE(meta["end_time"].as<int64_t>(), meta["start_time"].as<int64_t>());
  EXPECT_EQ(meta["artifact_uri"].as<std::string>(),
            "file://" + root + "/" + run.experiment_id + "/" + run.run_id + "/artifacts");

  expect_metrics_match_jsonl(c.run_dir(), run.path);
  std::vector<int64_t> steps;
  for (const auto& [step, point] : read_metric(run.path, "train/loss")) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  steps.clear();
  for (const auto& [step, point] : read_metric(run.path, "eval/loss")) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 6}));
  for (const char* key : {"train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/tflops_per_gpu", "time/step_ms"}) {
    EXPECT_TRUE(fs::exists(run.path + "/metrics/" + key)) << key;
  }

  // Params: the effective config, module keys by their bare names.
  EXPECT_EQ(read_file(run.path + "/params/exp_name"), "tiny_cpu");
  EXPECT_EQ(read_file(run.path + "/params/train_iters"), "6");
  EXPECT_EQ(read_file(run.path + "/params/seq_length"), "64");
  EXPECT_EQ(read_file(run.path + "/params/num_layers"), "2");
  EXPECT_EQ(read_file(run.path + "/params/tokenizer_type"), "GPT2BPETokenizer");
  EXPECT_EQ(read_file(run.path + "/params/mlflow_tracking_dir"), dir + "/mlruns");
  EXPECT_EQ(read_file(run.path + "/params/modules.pre_trainer.framework"), "megatron");
  size_t params = 0;
  for (const auto& entry : fs::directory_iterator(run.path + "/params")) params += entry.is_regular_file();
  EXPECT_EQ(params, mlflow_config_params(c.effective_yaml).size());

  EXPECT_EQ(read_file(run.path + "/tags/mlflow.runName"), "tiny_cpu");
  EXPECT_EQ(read_file(run.path + "/tags/mlflow.user"), c.user_name);
  EXPECT_EQ(read_file(run.path + "/tags/mlflow.source.type"), "LOCAL");
  EXPECT_EQ(read_file(run.path + "/tags/primus.run_dir"), fs::absolute(c.run_dir()).string());
  EXPECT_EQ(nlohmann::json::parse(read_file(c.run_dir() + "/mlflow_run.json"))["run_id"], run.run_id);
}

TEST(MlflowPretrain, ResumedRunContinuesTheSameRunWithoutRepeatingSteps) {
  const std::string dir = testing::temp_dir("mlflow_resume_e2e");
  const ExperimentConfig c = tiny_job(dir);
  ASSERT_EQ(run_pretrain(c, {}), 0);  // checkpoints at 4 and 6
  const std::string root = dir + "/mlruns";
  const StoreRun first = only_run(root);

  // As if the run had been killed after logging steps 5 and 6 but before their checkpoint.
  const std::string checkpoints = c.run_dir() + "/checkpoints";
  fs::remove_all(checkpoints + "/iter_0000006");
  write_file_atomic(checkpoints + "/latest_checkpointed_iteration.txt", "4");
  ASSERT_EQ(run_pretrain(c, {}), 0);

  const StoreRun second = only_run(root);  // still one experiment and one run
  EXPECT_EQ(second.run_id, first.run_id);
  EXPECT_EQ(second.meta["status"].as<int>(), 3);
  EXPECT_EQ(second.meta["start_time"].as<int64_t>(), first.meta["start_time"].as<int64_t>());
  ASSERT_EQ(read_metrics(c.run_dir()).size(), 6u);
  expect_metrics_match_jsonl(c.run_dir(), second.path);  // steps 5 and 6 once each, with the resumed values
}

TEST(MlflowPretrain, StopSignalMarksKilledAndTheResumedRunFinishes) {
  const std::string dir = testing::temp_dir("mlflow_signal");
  const ExperimentConfig c = tiny_job(dir, {"mlflow_experiment_name=signals: test"});
  request_stop(SIGTERM);  // as if SIGTERM arrived during the first step
  const int code = run_pretrain(c, {});
  clear_stop_request();
  ASSERT_EQ(code, 128 + SIGTERM);
  const std::string root = dir + "/mlruns";
  StoreRun run = only_run(root);
  EXPECT_EQ(YAML::Load(read_file(root + "/" + run.experiment_id + "/meta.yaml"))["name"].as<std::string>(),
            "signals: test");
  EXPECT_EQ(run.meta["status"].as<int>(), 5);  // KILLED
  EXPECT_GE(run.meta["end_time"].as<int64_t>(), run.meta["start_time"].as<int64_t>());
  EXPECT_EQ(read_metric(run.path, "train/loss").size(), 1u);

  ASSERT_EQ(run_pretrain(c, {}), 0);
  const StoreRun resumed = only_run(root);
  EXPECT_EQ(resumed.run_id, run.run_id);
  EXPECT_EQ(resumed.meta["status"].as<int>(), 3);
  EXPECT_EQ(read_metric(resumed.path, "train/loss").size(), 6u);
  expect_metrics_match_jsonl(c.run_dir(), resumed.path);
}

TEST(MlflowPretrain, RunThatThrowsIsMarkedFailed) {
  const std::string dir = testing::temp_dir("mlflow_failed");
  write_file_atomic(dir + "/blocker", "a file where the checkpoint directory should go");
  const ExperimentConfig c =
      tiny_job(dir, {"train_iters=2", "save_interval=0", "save=" + dir + "/blocker/checkpoints"});
  EXPECT_THROW(run_pretrain(c, {}), std::exception);  // the final checkpoint cannot be written
  const StoreRun run = only_run(dir + "/mlruns");
  EXPECT_EQ(run.meta["status"].as<int>(), 4);  // FAILED
  EXPECT_GE(run.meta["end_time"].as<int64_t>(), run.meta["start_time"].as<int64_t>());
  EXPECT_EQ(read_metric(run.path, "train/loss").size(), 2u);
}

}  // namespace
}  // namespace primus
