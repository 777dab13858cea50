// An MLflow *file store* written directly, without MLflow and without any network: the `mlruns/` layout that
// `mlflow ui --backend-store-uri file:./mlruns` and MlflowClient(tracking_uri="file:./mlruns") read.
//   <root>/.trash/                                  (MLflow's store expects it)
//   <root>/0/meta.yaml                              experiment "Default", created with a new root as MLflow does
//   <root>/<experiment_id>/meta.yaml                artifact_location, creation_time, experiment_id,
//                                                   last_update_time, lifecycle_stage: active, name
//   <root>/<experiment_id>/<run_id>/meta.yaml       artifact_uri, end_time, entry_point_name, experiment_id,
//                                                   lifecycle_stage, run_id, run_name, run_uuid, source_name,
//                                                   source_type: 4 (LOCAL), source_version, start_time,
//                                                   status (1 RUNNING, 3 FINISHED, 4 FAILED, 5 KILLED), tags: [],
//                                                   user_id — keys sorted, as PyYAML writes them
//   <root>/<experiment_id>/<run_id>/metrics/<key>   one line per value: "<timestamp_ms> <value> <step>"
//   <root>/<experiment_id>/<run_id>/params/<key>    the value, no newline
//   <root>/<experiment_id>/<run_id>/tags/<key>      the value, no newline (mlflow.runName, mlflow.user, ...)
//   <root>/<experiment_id>/<run_id>/artifacts/      empty
// Experiment ids are 18-digit integers and run ids 32 hex digits, like MLflow's own. Metric and param keys
// may hold letters, digits, _ - . / and space; a '/' nests the file (metrics/train/loss), as in MLflow.
//
// Resume: the run's ids are kept in a small JSON file in our run directory; a run started again with that file
// reopens the same MLflow run (status back to RUNNING) and first cuts every metric file back to the
// checkpoint's step, as metrics.jsonl is, so repeated steps are not logged twice.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primus {

// MLflow's RunStatus values, stored as integers in the run's meta.yaml.
enum class MlflowRunStatus : int { kRunning = 1, kScheduled = 2, kFinished = 3, kFailed = 4, kKilled = 5 };

using MlflowKeyValues = std::vector<std::pair<std::string, std::string>>;

struct MlflowRunOptions {
  std::string tracking_dir;       // the store's root directory (created when missing); relative to the working dir
  std::string experiment_name;    // found by name among the active experiments, else created
  std::string run_name;           // meta.yaml run_name and the mlflow.runName tag
  std::string user;               // user_id and the mlflow.user tag
  std::string resume_file;        // keeps the run's ids (<run dir>/mlflow_run.json); empty: always a new run
  int64_t keep_through_step = 0;  // a reopened run drops metric values logged after this step
  MlflowKeyValues params;         // written (or rewritten on resume) into params/
  MlflowKeyValues tags;           // extra run tags, after the mlflow.* ones
};

// One MLflow run, open for logging. Not thread-safe; one writer per run.
class MlflowRun {
 public:
  // Creates or reopens the run (see the file comment). Throws RuntimeError on I/O failure and UsageError on a
  // key MLflow would refuse.
  explicit MlflowRun(const MlflowRunOptions& options);
  // A run never finished explicitly ended by an exception: it is marked FAILED (errors are swallowed here).
  ~MlflowRun();
  MlflowRun(const MlflowRun&) = delete;
  MlflowRun& operator=(const MlflowRun&) = delete;

  // Appends "<timestamp_ms> <value> <step>" to metrics/<key>; timestamp_ms < 0 means now.
  void log_metric(const std::string& key, double value, int64_t step, int64_t timestamp_ms = -1);
  // Every number of a metrics.jsonl record except "step", under mlflow_metric_key's names, at the record's
  // step with one timestamp; then flushes.
  void log_metrics(const nlohmann::json& record);
  void log_param(const std::string& key, const std::string& value);
  void set_tag(const std::string& key, const std::string& value);
  // Flushes the metric files and writes the final status and end_time into meta.yaml.
  void finish(MlflowRunStatus status);

  const std::string& experiment_id() const { return experiment_id_; }
  const std::string& run_id() const { return run_id_; }
  const std::string& run_path() const { return run_path_; }  // <root>/<experiment_id>/<run_id>
  bool reopened() const { return reopened_; }                // true when this resumed an existing run

 private:
  void write_meta(MlflowRunStatus status, int64_t end_time_ms);
  void flush();

  std::string root_;
  std::string experiment_id_;
  std::string run_id_;
  std::string run_path_;
  std::string artifact_uri_;
  std::string run_name_;
  std::string user_;
  int64_t start_time_ms_ = 0;
  bool reopened_ = false;
  bool finished_ = false;
  std::map<std::string, std::unique_ptr<std::ofstream>> metric_files_;
};

// The MLflow key of a metrics.jsonl field, grouped by prefix (sections in the MLflow UI): train/ (loss, lr,
// grad_norm, consumed_samples), eval/loss, perf/ (tokens_per_s, tflops_per_gpu, mfu), memory/peak_gib, time/
// (step_ms, elapsed_s, data_ms, forward_ms, backward_ms, optimizer_ms). A field not in the table keeps its
// name, with characters MLflow refuses replaced by '_'.
std::string mlflow_metric_key(std::string_view metrics_name);

// The effective config (config.yaml) as MLflow params: every scalar at its dotted path, module keys by their
// bare name ("lr", as `config show` names them), lists and maps in YAML flow style, null as "null".
MlflowKeyValues mlflow_config_params(const std::string& effective_yaml);

// True when MLflow accepts `key` as a metric, param or tag name (characters and path shape).
bool mlflow_valid_key(std::string_view key);

// A metric value as MLflow's Python writer prints it: shortest round-trip digits, "3.0" for 3, nan, inf.
std::string mlflow_number(double value);

// A string as a YAML scalar the way PyYAML's safe_dump would keep it a string: plain when unambiguous, else
// single-quoted (double-quoted with escapes when it holds control characters).
std::string mlflow_yaml_scalar(std::string_view text);

}  // namespace primus
