#include "observe/metric_sinks.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace primus {

double MoeMetrics::Layer::max_load() const {
  double sum = 0.0, most = 0.0;
  for (double tokens : tokens_per_expert) sum += tokens, most = std::max(most, tokens);
  return sum > 0.0 ? most * static_cast<double>(tokens_per_expert.size()) / sum : 0.0;
}

namespace {

// Over the layers: the mean of a loss (absent when no layer has it), the largest max_load and the dropped entries'
// sum (absent without a capacity).
struct MoeSummary {
  std::optional<double> load_balancing_loss, seq_load_balancing_loss, z_loss, dropped_tokens;
  double max_load = 0.0;
};

MoeSummary summarize(const MoeMetrics& moe) {
  MoeSummary s;
  auto mean = [&](std::optional<double> MoeMetrics::Layer::*field) {
    double sum = 0.0;
    int layers = 0;
    for (const MoeMetrics::Layer& l : moe.layers) {
      if (l.*field) sum += *(l.*field), ++layers;
    }
    return layers > 0 ? std::optional<double>(sum / layers) : std::nullopt;
  };
  s.load_balancing_loss = mean(&MoeMetrics::Layer::load_balancing_loss);
  s.seq_load_balancing_loss = mean(&MoeMetrics::Layer::seq_load_balancing_loss);
  s.z_loss = mean(&MoeMetrics::Layer::z_loss);
  for (const MoeMetrics::Layer& l : moe.layers) {
    s.max_load = std::max(s.max_load, l.max_load());
    if (l.dropped_tokens) s.dropped_tokens = s.dropped_tokens.value_or(0.0) + *l.dropped_tokens;
  }
  return s;
}

nlohmann::json moe_record(const MoeMetrics& moe) {
  const MoeSummary s = summarize(moe);
  nlohmann::json r = {{"max_load", s.max_load}};
  if (s.load_balancing_loss) r["load_balancing_loss"] = *s.load_balancing_loss;
  if (s.seq_load_balancing_loss) r["seq_load_balancing_loss"] = *s.seq_load_balancing_loss;
  if (s.z_loss) r["z_loss"] = *s.z_loss;
  if (s.dropped_tokens) r["dropped_tokens"] = *s.dropped_tokens;
  nlohmann::json layers = nlohmann::json::array();
  for (const MoeMetrics::Layer& l : moe.layers) {
    nlohmann::json layer = {{"layer", l.layer}, {"tokens_per_expert", l.tokens_per_expert}, {"max_load", l.max_load()}};
    if (l.dropped_tokens) layer["dropped_tokens"] = *l.dropped_tokens;
    if (l.load_balancing_loss) layer["load_balancing_loss"] = *l.load_balancing_loss;
    if (l.seq_load_balancing_loss) layer["seq_load_balancing_loss"] = *l.seq_load_balancing_loss;
    if (l.z_loss) layer["z_loss"] = *l.z_loss;
    layers.push_back(std::move(layer));
  }
  r["layers"] = std::move(layers);
  return r;
}

}  // namespace

nlohmann::json StepMetrics::record() const {
  nlohmann::json r = {{"step", step},
                      {"loss", loss},
                      {"lr", lr},
                      {"grad_norm", grad_norm},
                      {"tokens_per_s", tokens_per_s},
                      {"step_ms", step_ms},
                      {"tflops_per_gpu", tflops_per_gpu},
                      {"consumed_samples", consumed_samples},
                      {"elapsed_s", elapsed_s}};
  if (mfu) r["mfu"] = *mfu;
  if (mem_peak_gib) r["mem_peak_gib"] = *mem_peak_gib;
  if (eval_loss) r["eval_loss"] = *eval_loss;
  if (phases) {
    r["data_ms"] = phases->data_ms;
    r["forward_ms"] = phases->forward_ms;
    r["backward_ms"] = phases->backward_ms;
    r["optimizer_ms"] = phases->optimizer_ms;
  }
  if (moe) r["moe"] = moe_record(*moe);
  if (!mtp_losses.empty()) r["mtp_losses"] = mtp_losses;
  return r;
}

namespace {

class ConsoleSink : public MetricSink {
 public:
  void write(const StepMetrics& m) override {
    spdlog::info(
        " iteration {:>6}/{:<6} | loss {:.4f} |{} lr {:.3e} | grad norm {:.3f} | {:.1f} ms/step | {:.0f} tokens/s | "
        "{:.2f} TFLOP/s{}",
        m.step, m.train_iters, m.loss, m.eval_loss ? fmt::format(" eval loss {:.4f} |", *m.eval_loss) : "", m.lr,
        m.grad_norm, m.step_ms, m.tokens_per_s, m.tflops_per_gpu,
        m.mfu ? fmt::format(" | MFU {:.3f} | peak {:.1f} GiB", *m.mfu, m.mem_peak_gib.value_or(0.0)) : "");
  }
};

class JsonlSink : public MetricSink {
 public:
  JsonlSink(const std::string& path, int64_t keep_through_step) : log_(path, keep_through_step) {}
  void write(const StepMetrics& m) override { log_.write(m.record()); }

 private:
  MetricsLog log_;
};

class TensorBoardSink : public MetricSink {
 public:
  TensorBoardSink(const std::string& dir, TensorBoardSwitches switches) : writer_(dir), switches_(switches) {
    spdlog::info("TensorBoard: {}", writer_.path());
  }
  // Megatron's tag names, so existing dashboards keep working.
  void write(const StepMetrics& m) override {
    writer_.add_scalar("lm loss", m.loss, m.step);
    writer_.add_scalar("grad-norm", m.grad_norm, m.step);
    if (switches_.learning_rate) writer_.add_scalar("learning-rate", m.lr, m.step);
    if (m.eval_loss) writer_.add_scalar("lm loss validation", *m.eval_loss, m.step);
    if (m.eval_loss && switches_.validation_ppl) {
      writer_.add_scalar("lm loss validation ppl", std::exp(std::min(*m.eval_loss, 20.0)), m.step);
    }
    if (switches_.throughput) {
      writer_.add_scalar("tokens-per-sec", m.tokens_per_s, m.step);
      writer_.add_scalar("tflops-per-gpu", m.tflops_per_gpu, m.step);
      if (m.mfu) writer_.add_scalar("mfu", *m.mfu, m.step);
    }
    if (switches_.memory && m.mem_peak_gib) writer_.add_scalar("mem-peak-gib", *m.mem_peak_gib, m.step);
    if (switches_.timers && m.phases) {
      writer_.add_scalar("data-wait-ms", m.phases->data_ms, m.step);
      writer_.add_scalar("forward-time-ms", m.phases->forward_ms, m.step);
      writer_.add_scalar("backward-time-ms", m.phases->backward_ms, m.step);
      writer_.add_scalar("optimizer-time-ms", m.phases->optimizer_ms, m.step);
    }
    if (m.moe) write_moe(*m.moe, m.step);
    // Megatron's MTPLossLoggingHelper tags.
    for (size_t k = 0; k < m.mtp_losses.size(); ++k) {
      writer_.add_scalar(fmt::format("mtp_{} loss", k + 1), m.mtp_losses[k], m.step);
    }
    writer_.flush();
  }

 private:
  // Megatron's load_balancing_loss and z_loss (means over the MoE layers) and, with moe_per_layer_logging, its
  // moe/<name>_layer_<i> tags; max_load is ours.
  void write_moe(const MoeMetrics& moe, int64_t step) {
    const MoeSummary s = summarize(moe);
    if (s.load_balancing_loss) writer_.add_scalar("load_balancing_loss", *s.load_balancing_loss, step);
    if (s.seq_load_balancing_loss) writer_.add_scalar("seq_load_balancing_loss", *s.seq_load_balancing_loss, step);
    if (s.z_loss) writer_.add_scalar("z_loss", *s.z_loss, step);
    writer_.add_scalar("moe/max_load", s.max_load, step);
    if (s.dropped_tokens) writer_.add_scalar("moe/dropped_tokens", *s.dropped_tokens, step);
    if (!moe.per_layer_tensorboard) return;
    for (const MoeMetrics::Layer& l : moe.layers) {
      if (l.load_balancing_loss) {
        writer_.add_scalar(fmt::format("moe/load_balancing_loss_layer_{}", l.layer), *l.load_balancing_loss, step);
      }
      if (l.seq_load_balancing_loss) {
        writer_.add_scalar(fmt::format("moe/seq_load_balancing_loss_layer_{}", l.layer), *l.seq_load_balancing_loss,
                           step);
      }
      if (l.dropped_tokens) {
        writer_.add_scalar(fmt::format("moe/dropped_tokens_layer_{}", l.layer), *l.dropped_tokens, step);
      }
      if (l.z_loss) writer_.add_scalar(fmt::format("moe/z_loss_layer_{}", l.layer), *l.z_loss, step);
      writer_.add_scalar(fmt::format("moe/max_load_layer_{}", l.layer), l.max_load(), step);
    }
  }

  TensorBoardWriter writer_;
  TensorBoardSwitches switches_;
};

class MlflowSink : public MetricSink {
 public:
  explicit MlflowSink(std::unique_ptr<MlflowRun> run) : run_(std::move(run)) {}
  void write(const StepMetrics& m) override { run_->log_metrics(m.record()); }
  void finish(MlflowRunStatus status) override { run_->finish(status); }

 private:
  std::unique_ptr<MlflowRun> run_;  // destroyed unfinished (an exception): the MLflow run is marked FAILED
};

}  // namespace

std::unique_ptr<MetricSink> make_console_sink() { return std::make_unique<ConsoleSink>(); }
std::unique_ptr<MetricSink> make_jsonl_sink(const std::string& path, int64_t keep_through_step) {
  return std::make_unique<JsonlSink>(path, keep_through_step);
}
std::unique_ptr<MetricSink> make_tensorboard_sink(const std::string& dir, TensorBoardSwitches switches) {
  return std::make_unique<TensorBoardSink>(dir, switches);
}
std::unique_ptr<MetricSink> make_mlflow_sink(std::unique_ptr<MlflowRun> run) {
  return std::make_unique<MlflowSink>(std::move(run));
}

}  // namespace primus
