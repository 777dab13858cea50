// Where a training run's numbers go, behind one interface: the console line, metrics.jsonl, TensorBoard and
// MLflow each implement MetricSink, and the trainer hands every logged step to all of them at once
// (MetricSinks). Only rank 0 of a job builds sinks: every rank computes the same global figures.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "observe/metrics_log.h"
#include "observe/mlflow_store.h"
#include "observe/tensorboard.h"

namespace primus {

// A step's routing in every MoE layer over the global batch: the first thing MoE users look at when a run goes
// wrong is whether the experts share the load.
struct MoeMetrics {
  struct Layer {
    int64_t layer = 0;
    std::vector<double> tokens_per_expert;
    // Mean over the step's micro-batches and data-parallel ranks, without the coefficient (as Megatron logs them);
    // absent when the loss is off.
    std::optional<double> load_balancing_loss;      // aux_loss
    std::optional<double> seq_load_balancing_loss;  // seq_aux_loss (Megatron's tag)
    std::optional<double> z_loss;
    // With an expert capacity: the routing entries (a token's choice of an expert) of the global batch the
    // capacity dropped; tokens_per_expert counts the router's choices, dropped ones included.
    std::optional<double> dropped_tokens;
    double max_load() const;  // the busiest expert's tokens over the mean (1: balanced)
  };
  std::vector<Layer> layers;
  bool per_layer_tensorboard = false;  // moe_per_layer_logging: also one TensorBoard tag per layer
};

// One logged step: means over the steps since the previous log line, plus this step's phases.
struct StepMetrics {
  int64_t step = 0;
  int64_t train_iters = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;  // the whole job's
  double step_ms = 0.0;
  double tflops_per_gpu = 0.0;
  int64_t consumed_samples = 0;
  double elapsed_s = 0.0;
  std::optional<double> mfu;           // GPU runs
  std::optional<double> mem_peak_gib;  // GPU runs
  std::optional<double> eval_loss;
  // Device time of this step's phases (data: the host's wait for the batch); present on log steps.
  struct Phases {
    double data_ms = 0.0, forward_ms = 0.0, backward_ms = 0.0, optimizer_ms = 0.0;
  };
  std::optional<Phases> phases;
  std::optional<MoeMetrics> moe;  // models with MoE layers, on log steps
  // Multi-token prediction: each depth's mean token loss over the last step (mtp_num_layers > 0), on log steps.
  std::vector<double> mtp_losses;

  // The metrics.jsonl record (and MLflow's metrics): docs/training.md lists the fields.
  nlohmann::json record() const;
};

class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual void write(const StepMetrics& m) = 0;
  // The run ended (finished, stopped by a signal); a sink destroyed without it saw a failure.
  virtual void finish(MlflowRunStatus status) {}
};

// Megatron's TensorBoard switches (log_*_to_tensorboard, log_throughput).
struct TensorBoardSwitches {
  bool learning_rate = true;
  bool throughput = false;
  bool timers = false;
  bool memory = false;
  bool validation_ppl = false;
};

std::unique_ptr<MetricSink> make_console_sink();
std::unique_ptr<MetricSink> make_jsonl_sink(const std::string& path, int64_t keep_through_step);
std::unique_ptr<MetricSink> make_tensorboard_sink(const std::string& dir, TensorBoardSwitches switches);
std::unique_ptr<MetricSink> make_mlflow_sink(std::unique_ptr<MlflowRun> run);

class MetricSinks {
 public:
  void add(std::unique_ptr<MetricSink> sink) { sinks_.push_back(std::move(sink)); }
  void write(const StepMetrics& m) {
    for (auto& sink : sinks_) sink->write(m);
  }
  void finish(MlflowRunStatus status) {
    for (auto& sink : sinks_) sink->finish(status);
  }

 private:
  std::vector<std::unique_ptr<MetricSink>> sinks_;
};

}  // namespace primus
