// Profiling: the Chrome/Perfetto trace of a training run (valid trace-event JSON, ops nested under the layers that
// ran them on the device track), the per-phase step times in metrics.jsonl, and the slow-step monitor.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/file_io.h"
#include "models/model.h"
#include "ops/profile.h"
#include "support/test_support.h"
#include "support/tiny_models.h"
#include "train/pretrain.h"
#include "train/step_monitor.h"

namespace primus {
namespace {

using nlohmann::json;

// Complete ("X") events of one track (pid), by name.
std::vector<json> events_named(const json& trace, int pid, const std::string& name) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["pid"] == pid && e["name"] == name) out.push_back(e);
  }
  return out;
}

bool inside(const json& inner, const json& outer) {
  const double slack = 1e-3;  // µs
  const double b = inner["ts"], d = inner["dur"], ob = outer["ts"], od = outer["dur"];
  return b + slack >= ob && b + d <= ob + od + slack;
}

void check_trace_format(const json& trace) {
  ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());
  for (const json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid")) << e.dump();
    if (e["ph"] == "X") {
      ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number()) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
    } else {
      EXPECT_EQ(e["ph"], "M") << e.dump();
    }
  }
}

TEST(Profile, TraceNestsOpsUnderLayersOnBothTracks) {
  const ModelArgs args = testing::tiny_llama_args();
  const std::unique_ptr<Model> model = make_model(args, 8);
  model->params().initialize(3);
  Rng rng(4);
  const Tensor tokens = testing::random_ids({2, 8}, args.vocab_size, rng);
  const Tensor labels = testing::random_ids({2, 8}, args.vocab_size, rng);
  testing::train_micro_batch(*model, tokens, labels);  // untraced: leaves nothing behind

  ops::Trace::start(kCpuDevice);
  EXPECT_TRUE(ops::Trace::active());
  testing::train_micro_batch(*model, tokens, labels);
  const std::string path = testing::temp_dir("profile") + "/trace.json";
  EXPECT_GT(ops::Trace::stop_and_write(path), 50);
  EXPECT_FALSE(ops::Trace::active());

  const json trace = json::parse(read_file(path));
  check_trace_format(trace);
  for (int pid : {1, 2}) {
    const std::vector<json> mlp = events_named(trace, pid, "model.layers.1.mlp");
    const std::vector<json> swiglu = events_named(trace, pid, "swiglu_forward");
    ASSERT_EQ(mlp.size(), 1u) << "track " << pid;
    ASSERT_EQ(swiglu.size(), 2u) << "track " << pid;  // one MLP per layer
    EXPECT_TRUE(inside(swiglu[1], mlp[0])) << "track " << pid << ": " << swiglu[1].dump() << " in " << mlp[0].dump();
    EXPECT_FALSE(inside(swiglu[0], mlp[0])) << "layer 0's op is not under layer 1";
    ASSERT_EQ(events_named(trace, pid, "model.layers.0.self_attn (backward)").size(), 1u);
    EXPECT_FALSE(events_named(trace, pid, "attention_backward").empty());
  }
}

TEST(Profile, StopWithoutStartIsAnError) { EXPECT_THROW(ops::Trace::stop_and_write("/nonexistent/x.json"), Error); }

TEST(Profile, TrainingWritesTheTraceOfTheProfiledIterationsAndPhaseTimes) {
  ExperimentConfig c;
  c.exp_name = "profiled";
  c.workspace = testing::temp_dir("profile_run");
  c.effective_yaml = "exp_name: profiled\n";
  c.model = testing::tiny_llama_args();
  c.model.vocab_size = 0;  // the byte-level tokenizer decides
  c.model.max_position_embeddings = 32;
  TrainingArgs& t = c.train;
  t.train_iters = 6;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;  // two micro-batches per step
  t.seq_length = 16;
  t.lr_decay_iters = 6;
  t.log_interval = 2;
  t.eval_interval = 0;
  t.mock_data = true;
  t.profile = true;
  t.profile_step_start = 3;
  t.profile_step_end = 5;
  ASSERT_EQ(run_pretrain(c, {}), 0);

  const json trace = json::parse(read_file(c.run_dir() + "/profile/trace_rank0.json"));
  check_trace_format(trace);
  // Iterations 3 and 4, each with two micro-batches: four forward scopes, two optimizer scopes, per track.
  EXPECT_EQ(events_named(trace, 1, "forward").size(), 4u);
  EXPECT_EQ(events_named(trace, 2, "optimizer").size(), 2u);
  EXPECT_EQ(events_named(trace, 1, "data").size(), 2u);

  std::istringstream metrics(read_file(c.run_dir() + "/metrics.jsonl"));
  int logged = 0;
  for (std::string line; std::getline(metrics, line); ++logged) {
    const json r = json::parse(line);
    for (const char* key : {"data_ms", "forward_ms", "backward_ms", "optimizer_ms"}) {
      ASSERT_TRUE(r.contains(key)) << key << " in " << line;
      EXPECT_GE(r[key].get<double>(), 0.0) << key;
    }
    EXPECT_GT(r["forward_ms"].get<double>(), 0.0);
    EXPECT_LE(r["forward_ms"].get<double>() + r["backward_ms"].get<double>() + r["optimizer_ms"].get<double>(),
              r["step_ms"].get<double>() * 2 + 1.0)
        << "phase times of one step fit in the logged window";
  }
  EXPECT_EQ(logged, 3);
}

TEST(SlowStepMonitor, WarnsOnlyAfterAFullWindowAndAboveTheFactor) {
  SlowStepMonitor monitor(0, 5, 2.0);
  EXPECT_FALSE(monitor.add(1, 900.0)) << "no window yet (a slow first step is normal)";
  for (int64_t step = 2; step <= 5; ++step) EXPECT_FALSE(monitor.add(step, 100.0 + static_cast<double>(step)));
  EXPECT_FALSE(monitor.add(6, 190.0));  // median of {900, 102, 103, 104, 105} is 104: 190 < 208
  EXPECT_TRUE(monitor.add(7, 250.0));   // median of {102, 103, 104, 105, 190} is 104
  EXPECT_FALSE(monitor.add(8, 120.0));
}

}  // namespace
}  // namespace primus
