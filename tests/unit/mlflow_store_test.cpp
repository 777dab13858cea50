// The MLflow file store writer: every file of a new store read back byte for byte (meta.yaml of the Default
// experiment, of ours and of the run; metric, param and tag files), experiment reuse by name, reopening a run
// with metrics cut back to the checkpoint's step, FAILED on an unfinished run, key checks, number and YAML
// scalar formats, and the effective config flattened into params.
#include "observe/mlflow_store.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "core/error.h"
#include "core/file_io.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

// The subdirectories of `dir` (names), sorted.
std::vector<std::string> subdirs(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The one experiment directory besides Default ("0") and .trash.
std::string only_experiment(const std::string& root) {
  std::vector<std::string> ids;
  for (const std::string& name : subdirs(root)) {
    if (name != "0" && name != ".trash") ids.push_back(name);
  }
  EXPECT_EQ(ids.size(), 1u);
  return ids.empty() ? "" : ids.front();
}

int64_t field_int(const std::string& yaml, const std::string& key) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(yaml, m, std::regex("(^|\n)" + key + ": ([0-9]+)\n"))) << key << " in\n" << yaml;
  return m.empty() ? -1 : std::stoll(m[2]);
}

MlflowRunOptions options(const std::string& root, const std::string& resume_file = "") {
  return MlflowRunOptions{.tracking_dir = root,
                          .experiment_name = "tiny llama",
                          .run_name = "tiny_cpu",
                          .user = "alice",
                          .resume_file = resume_file,
                          .keep_through_step = 0,
                          .params = {{"lr", "3.0e-3"}, {"data_path", "[a.txt, b.txt]"}, {"env.OMP_NUM_THREADS", "2"}},
                          .tags = {{"primus.run_dir", "/runs/tiny_cpu"}}};
}

TEST(MlflowStore, NewStoreHasMlflowsLayoutByteForByte) {
  const std::string root = testing::temp_dir("mlflow") + "/mlruns";
  const int64_t before =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::string experiment_id, run_id;
  {
    MlflowRun run(options(root));
    experiment_id = run.experiment_id();
    run_id = run.run_id();
    EXPECT_FALSE(run.reopened());
    EXPECT_EQ(run.run_path(), root + "/" + experiment_id + "/" + run_id);
    run.log_metric("train/loss", 2.5, 1, 1700000000001);
    run.log_metric("train/loss", 2.25, 2, 1700000000002);
    run.log_metric("lr", 3e-4, 2, 1700000000002);
    run.finish(MlflowRunStatus::kFinished);
  }
  EXPECT_TRUE(std::regex_match(experiment_id, std::regex("[1-9][0-9]{17}"))) << experiment_id;
  EXPECT_TRUE(std::regex_match(run_id, std::regex("[0-9a-f]{32}"))) << run_id;
  EXPECT_EQ(subdirs(root), (std::vector<std::string>{".trash", "0", experiment_id}));

  // The Default experiment, as a new MLflow store has it.
  const std::string default_meta = read_file(root + "/0/meta.yaml");
  const int64_t default_time = field_int(default_meta, "creation_time");
  EXPECT_EQ(default_meta, fmt::format("artifact_location: file://{0}/0\ncreation_time: {1}\nexperiment_id: '0'\n"
                                      "last_update_time: {1}\nlifecycle_stage: active\nname: Default\n",
                                      root, default_time));
  EXPECT_GE(default_time, before);

  const std::string experiment_meta = read_file(root + "/" + experiment_id + "/meta.yaml");
  const int64_t created = field_int(experiment_meta, "creation_time");
  EXPECT_EQ(experiment_meta, fmt::format("artifact_location: file://{0}/{1}\ncreation_time: {2}\nexperiment_id: '{1}'\n"
                                         "last_update_time: {2}\nlifecycle_stage: active\nname: tiny llama\n",
                                         root, experiment_id, created));

  const std::string run_path = root + "/" + experiment_id + "/" + run_id;
  const std::string run_meta = read_file(run_path + "/meta.yaml");
  const int64_t start = field_int(run_meta, "start_time"), end = field_int(run_meta, "end_time");
  EXPECT_GE(start, before);
  EXPECT_GE(end, start);
  EXPECT_EQ(run_meta, fmt::format("artifact_uri: file://{0}/{1}/{2}/artifacts\n"
                                  "end_time: {4}\n"
                                  "entry_point_name: ''\n"
                                  "experiment_id: '{1}'\n"
                                  "lifecycle_stage: active\n"
                                  "run_id: {5}\n"
                                  "run_name: tiny_cpu\n"
                                  "run_uuid: {5}\n"
                                  "source_name: ''\n"
                                  "source_type: 4\n"
                                  "source_version: ''\n"
                                  "start_time: {3}\n"
                                  "status: 3\n"
                                  "tags: []\n"
                                  "user_id: alice\n",
                                  root, experiment_id, run_id, start, end, mlflow_yaml_scalar(run_id)));
  // It reads back as YAML with the types MLflow's reader expects.
  const YAML::Node parsed = YAML::Load(run_meta);
  EXPECT_EQ(parsed["experiment_id"].as<std::string>(), experiment_id);
  EXPECT_EQ(parsed["run_id"].as<std::string>(), run_id);
  EXPECT_EQ(parsed["status"].as<int>(), 3);
  EXPECT_EQ(parsed["entry_point_name"].as<std::string>(), "");
  EXPECT_TRUE(parsed["tags"].IsSequence());

  EXPECT_EQ(subdirs(run_path), (std::vector<std::string>{"artifacts", "metrics", "params", "tags"}));
  EXPECT_EQ(read_file(run_path + "/metrics/train/loss"), "1700000000001 2.5 1\n1700000000002 2.25 2\n");
  EXPECT_EQ(read_file(run_path + "/metrics/lr"), "1700000000002 0.0003 2\n");
  EXPECT_EQ(read_file(run_path + "/params/lr"), "3.0e-3");
  EXPECT_EQ(read_file(run_path + "/params/data_path"), "[a.txt, b.txt]");
  EXPECT_EQ(read_file(run_path + "/params/env.OMP_NUM_THREADS"), "2");
  EXPECT_EQ(read_file(run_path + "/tags/mlflow.runName"), "tiny_cpu");
  EXPECT_EQ(read_file(run_path + "/tags/mlflow.user"), "alice");
  EXPECT_EQ(read_file(run_path + "/tags/mlflow.source.type"), "LOCAL");
  EXPECT_EQ(read_file(run_path + "/tags/primus.run_dir"), "/runs/tiny_cpu");
  EXPECT_TRUE(fs::is_empty(run_path + "/artifacts"));
}

TEST(MlflowStore, MetricsRecordsUseTheKeyTableAndOneTimestamp) {
  const std::string root = testing::temp_dir("mlflow_record");
  MlflowRun run(options(root));
  const nlohmann::json record = {{"step", 7},
                                 {"loss", 3.25},
                                 {"lr", 1e-4},
                                 {"eval_loss", 3.5},
                                 {"consumed_samples", 112},
                                 {"mem_peak_gib", 1.5},
                                 {"note", "text is skipped"},
                                 {"phase", {{"fwd ms", 2.0}}},
                                 {"odd:name", 1}};
  run.log_metrics(record);
  const std::string metrics = run.run_path() + "/metrics/";
  std::smatch m;
  const std::string loss = read_file(metrics + "train/loss");
  ASSERT_TRUE(std::regex_match(loss, m, std::regex("([0-9]{13}) 3.25 7\n"))) << loss;
  const std::string timestamp = m[1];
  EXPECT_EQ(read_file(metrics + "train/lr"), timestamp + " 0.0001 7\n");
  EXPECT_EQ(read_file(metrics + "eval/loss"), timestamp + " 3.5 7\n");
  EXPECT_EQ(read_file(metrics + "train/consumed_samples"), timestamp + " 112.0 7\n");
  EXPECT_EQ(read_file(metrics + "memory/peak_gib"), timestamp + " 1.5 7\n");
  EXPECT_EQ(read_file(metrics + "phase/fwd ms"), timestamp + " 2.0 7\n");
  EXPECT_EQ(read_file(metrics + "odd_name"), timestamp + " 1.0 7\n");
  EXPECT_FALSE(fs::exists(metrics + "note"));
  EXPECT_FALSE(fs::exists(metrics + "step"));
  EXPECT_THROW(run.log_metrics({{"loss", 1.0}}), RuntimeError);  // no step
}

TEST(MlflowStore, MetricKeyTable) {
  EXPECT_EQ(mlflow_metric_key("loss"), "train/loss");
  EXPECT_EQ(mlflow_metric_key("lr"), "train/lr");
  EXPECT_EQ(mlflow_metric_key("grad_norm"), "train/grad_norm");
  EXPECT_EQ(mlflow_metric_key("eval_loss"), "eval/loss");
  EXPECT_EQ(mlflow_metric_key("tokens_per_s"), "perf/tokens_per_s");
  EXPECT_EQ(mlflow_metric_key("tflops_per_gpu"), "perf/tflops_per_gpu");
  EXPECT_EQ(mlflow_metric_key("mfu"), "perf/mfu");
  EXPECT_EQ(mlflow_metric_key("mem_peak_gib"), "memory/peak_gib");
  EXPECT_EQ(mlflow_metric_key("step_ms"), "time/step_ms");
  EXPECT_EQ(mlflow_metric_key("forward_ms"), "time/forward_ms");
  EXPECT_EQ(mlflow_metric_key("some_new_metric"), "some_new_metric");
  EXPECT_EQ(mlflow_metric_key("a:b//c/../d"), "a_b/c/__/d");
  for (const char* name : {"loss", "eval_loss", "x y", "weird#name", "/lead", "trail/", "../up"}) {
    EXPECT_TRUE(mlflow_valid_key(mlflow_metric_key(name))) << name;
  }
}

TEST(MlflowStore, KeysMlflowRefusesAreRejected) {
  for (const char* key : {"loss", "train/loss", "a b", "a-b.c_d", "mlflow.runName"})
    EXPECT_TRUE(mlflow_valid_key(key)) << key;
  for (const char* key : {"", "/abs", "dir/", "a//b", "a/./b", "../x", ".", "a:b", "a#b", "tab\tkey"}) {
    EXPECT_FALSE(mlflow_valid_key(key)) << key;
  }
  EXPECT_FALSE(mlflow_valid_key(std::string(251, 'a')));
  MlflowRun run(options(testing::temp_dir("mlflow_keys")));
  EXPECT_THROW(run.log_metric("bad:key", 1.0, 1), UsageError);
  EXPECT_THROW(run.log_param("../escape", "x"), UsageError);
  EXPECT_THROW(run.set_tag("a//b", "x"), UsageError);
}

TEST(MlflowStore, NumbersPrintLikePythonAndRoundTrip) {
  EXPECT_EQ(mlflow_number(3.0), "3.0");
  EXPECT_EQ(mlflow_number(-2.0), "-2.0");
  EXPECT_EQ(mlflow_number(0.1), "0.1");
  EXPECT_EQ(mlflow_number(2.25), "2.25");
  EXPECT_EQ(mlflow_number(1e20), "1e+20");
  EXPECT_EQ(mlflow_number(std::nan("")), "nan");
  EXPECT_EQ(mlflow_number(INFINITY), "inf");
  EXPECT_EQ(mlflow_number(-INFINITY), "-inf");
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-300, 300);
  for (int i = 0; i < 2000; ++i) {
    const double v = std::ldexp(mantissa(rng), exponent(rng));
    EXPECT_EQ(std::strtod(mlflow_number(v).c_str(), nullptr), v) << mlflow_number(v);
  }
}

TEST(MlflowStore, YamlScalarsStayStrings) {
  EXPECT_EQ(mlflow_yaml_scalar("Default"), "Default");
  EXPECT_EQ(mlflow_yaml_scalar("file:///tmp/mlruns/0"), "file:///tmp/mlruns/0");
  EXPECT_EQ(mlflow_yaml_scalar("tiny llama"), "tiny llama");
  EXPECT_EQ(mlflow_yaml_scalar(""), "''");
  EXPECT_EQ(mlflow_yaml_scalar("0"), "'0'");
  EXPECT_EQ(mlflow_yaml_scalar("123456789012345678"), "'123456789012345678'");
  EXPECT_EQ(mlflow_yaml_scalar("42f8beffe4ac2a6b0375abd332cedd5a"), "42f8beffe4ac2a6b0375abd332cedd5a");  // as PyYAML
  EXPECT_EQ(mlflow_yaml_scalar("12345678901234567890123456789012"), "'12345678901234567890123456789012'");
  EXPECT_EQ(mlflow_yaml_scalar("0b101"), "'0b101'");
  EXPECT_EQ(mlflow_yaml_scalar("1e5"), "'1e5'");
  EXPECT_EQ(mlflow_yaml_scalar("true"), "'true'");
  EXPECT_EQ(mlflow_yaml_scalar("No"), "'No'");
  EXPECT_EQ(mlflow_yaml_scalar("null"), "'null'");
  EXPECT_EQ(mlflow_yaml_scalar("it's"), "'it''s'");
  EXPECT_EQ(mlflow_yaml_scalar("a: b"), "'a: b'");
  EXPECT_EQ(mlflow_yaml_scalar("two\nlines"), "\"two\\nlines\"");
  for (const std::string text :
       {"Default", "",    "0",      "1e5",       "true",       "~",        "- item",      "a: b",       "#x",
        "it's",    "[x]", "{a: 1}", "tab\there", "two\nlines", "quote\"d", "back\\slash", "2024-01-01", "  padded  ",
        "ünïcode", "@at", "x:",     "0x1F",      ".inf",       "0b1010",   "42f8beff",    "0e5",        "1_000"}) {
    const YAML::Node node = YAML::Load("key: " + mlflow_yaml_scalar(text) + "\n");
    EXPECT_EQ(node["key"].as<std::string>(), text) << mlflow_yaml_scalar(text);
    EXPECT_FALSE(node["key"].IsNull()) << text;
  }
}

TEST(MlflowStore, ExperimentsAreFoundByNameAndRunsAreNewWithoutAResumeFile) {
  const std::string root = testing::temp_dir("mlflow_reuse");
  // An experiment as MLflow itself writes it (quoted name, PyYAML style), found by name.
  fs::create_directories(root + "/424242424242424242");
  write_file_atomic(root + "/424242424242424242/meta.yaml",
                    "artifact_location: file:///elsewhere/424242424242424242\ncreation_time: 1\n"
                    "experiment_id: '424242424242424242'\nlast_update_time: 1\nlifecycle_stage: active\n"
                    "name: 'tiny: llama'\n");
  MlflowRunOptions o = options(root);
  o.experiment_name = "tiny: llama";
  std::string first, second;
  {
    MlflowRun a(o);
    first = a.run_id();
    EXPECT_EQ(a.experiment_id(), "424242424242424242");
    a.finish(MlflowRunStatus::kFinished);
    EXPECT_EQ(read_file(a.run_path() + "/meta.yaml").substr(0, 80),
              ("artifact_uri: file:///elsewhere/424242424242424242/" + first + "/artifacts\n").substr(0, 80));
  }
  {
    MlflowRun b(o);
    second = b.run_id();
    EXPECT_EQ(b.experiment_id(), "424242424242424242");
    b.finish(MlflowRunStatus::kFinished);
  }
  EXPECT_NE(first, second);
  EXPECT_EQ(subdirs(root + "/424242424242424242").size(), 2u);
  // The root existed, so no Default experiment is added (MLflow adds it only to a new store).
  EXPECT_FALSE(fs::exists(root + "/0"));
  MlflowRun other(options(root));
  EXPECT_NE(other.experiment_id(), "424242424242424242");
}

TEST(MlflowStore, UnfinishedRunIsFailedAndReopenedRunIsCutBackToTheCheckpoint) {
  const std::string dir = testing::temp_dir("mlflow_resume");
  const std::string root = dir + "/mlruns", resume = dir + "/mlflow_run.json";
  std::string run_id, run_path;
  int64_t start = 0;
  {
    MlflowRun run(options(root, resume));
    run_id = run.run_id();
    run_path = run.run_path();
    for (int step = 1; step <= 5; ++step) run.log_metrics({{"step", step}, {"loss", 10.0 - step}});
    start = field_int(read_file(run_path + "/meta.yaml"), "start_time");
    EXPECT_NE(read_file(run_path + "/meta.yaml").find("end_time: null\n"), std::string::npos);
    EXPECT_NE(read_file(run_path + "/meta.yaml").find("status: 1\n"), std::string::npos);
  }  // destroyed unfinished, as when an exception unwinds the trainer
  std::string meta = read_file(run_path + "/meta.yaml");
  EXPECT_NE(meta.find("status: 4\n"), std::string::npos) << meta;
  EXPECT_GE(field_int(meta, "end_time"), start);
  const nlohmann::json saved = nlohmann::json::parse(read_file(resume));
  EXPECT_EQ(saved["run_id"], run_id);
  EXPECT_EQ(saved["tracking_dir"], fs::absolute(root).lexically_normal().string());

  // A torn last line (a kill mid-write) is dropped along with the steps after the checkpoint.
  std::ofstream(run_path + "/metrics/train/loss", std::ios::app) << "1700000000000 4.";
  MlflowRunOptions again = options(root, resume);
  again.keep_through_step = 3;
  again.params = {{"lr", "1.0e-3"}};  // a changed value is rewritten: params follow the run's current config
  {
    MlflowRun run(again);
    EXPECT_TRUE(run.reopened());
    EXPECT_EQ(run.run_id(), run_id);
    meta = read_file(run_path + "/meta.yaml");
    EXPECT_NE(meta.find("status: 1\n"), std::string::npos) << meta;
    EXPECT_NE(meta.find("end_time: null\n"), std::string::npos) << meta;
    EXPECT_EQ(field_int(meta, "start_time"), start);
    const std::string loss = read_file(run_path + "/metrics/train/loss");
    EXPECT_TRUE(std::regex_match(loss, std::regex("[0-9]+ 9.0 1\n[0-9]+ 8.0 2\n[0-9]+ 7.0 3\n"))) << loss;
    run.log_metrics({{"step", 4}, {"loss", 5.5}});
    run.finish(MlflowRunStatus::kKilled);
  }
  EXPECT_EQ(subdirs(root + "/" + only_experiment(root)).size(), 1u);
  EXPECT_NE(read_file(run_path + "/meta.yaml").find("status: 5\n"), std::string::npos);
  EXPECT_EQ(read_file(run_path + "/params/lr"), "1.0e-3");
  EXPECT_TRUE(std::regex_match(read_file(run_path + "/metrics/train/loss"),
                               std::regex("[0-9]+ 9.0 1\n[0-9]+ 8.0 2\n[0-9]+ 7.0 3\n[0-9]+ 5.5 4\n")));

  // A run deleted in the UI (lifecycle_stage: deleted) is not reopened: a new run starts.
  std::string deleted = read_file(run_path + "/meta.yaml");
  deleted.replace(deleted.find("lifecycle_stage: active"), 23, "lifecycle_stage: deleted");
  write_file_atomic(run_path + "/meta.yaml", deleted);
  MlflowRun fresh(options(root, resume));
  EXPECT_FALSE(fresh.reopened());
  EXPECT_NE(fresh.run_id(), run_id);
  EXPECT_EQ(nlohmann::json::parse(read_file(resume))["run_id"], fresh.run_id());
}

TEST(MlflowStore, EffectiveConfigFlattensIntoParams) {
  const std::string yaml =
      "# Effective config\nwork_group: amd\nuser_name: root\nexp_name: tiny_cpu\nworkspace: ./output\n"
      "env:\n  OMP_NUM_THREADS: \"2\"\n"
      "modules:\n  pre_trainer:\n    framework: megatron\n    overrides:\n      # model\n      num_layers: 2\n"
      "      # training\n      lr: 3.0e-3\n      data_path: [/a/b, /c]\n      save: \"\"\n"
      "      recompute_method: null\n      split: \"969,30,1\"\n";
  const MlflowKeyValues params = mlflow_config_params(yaml);
  const MlflowKeyValues expected = {{"work_group", "amd"},        {"user_name", "root"},
                                    {"exp_name", "tiny_cpu"},     {"workspace", "./output"},
                                    {"env.OMP_NUM_THREADS", "2"}, {"modules.pre_trainer.framework", "megatron"},
                                    {"num_layers", "2"},          {"lr", "3.0e-3"},
                                    {"data_path", "[/a/b, /c]"},  {"save", ""},
                                    {"recompute_method", "null"}, {"split", "969,30,1"}};
  EXPECT_EQ(params, expected);
  EXPECT_EQ(mlflow_config_params("env: {}\n"), (MlflowKeyValues{{"env", "{}"}}));
  EXPECT_THROW(mlflow_config_params("a: [unclosed\n"), RuntimeError);
}

TEST(MlflowStore, TrackingDirThatIsAFileIsAUsageError) {
  const std::string dir = testing::temp_dir("mlflow_file");
  write_file_atomic(dir + "/mlruns", "not a directory");
  EXPECT_THROW(MlflowRun run(options(dir + "/mlruns")), UsageError);
}

}  // namespace
}  // namespace primus
