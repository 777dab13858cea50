// Checkpoint progress through a real save and load of a tiny model: bytes reported per phase (save, verify,
// load) rise to totals that match the files, the manifest written from the bytes in flight verifies, a
// corrupt byte is still caught by the streamed check, and the bars drawn from the reports (terminal and log).
#include "train/checkpoint_progress.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "core/file_io.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

struct Report {
  std::string phase;
  int64_t done = 0;
  int64_t total = 0;
};

struct TinyRun {
  ModelArgs args = testing::tiny_llama_args();
  std::unique_ptr<Model> model = make_model(args, 16);
  AdamW optimizer{model->params(), AdamWConfig{}};
  TinyRun() {
    model->params().initialize(11);
    // One step, so the moments are not all zero.
    Rng rng(5);
    testing::train_micro_batch(*model, testing::random_ids({2, 8}, args.vocab_size, rng),
                               testing::random_ids({2, 8}, args.vocab_size, rng));
    optimizer.step(model->params(), 1e-3);
  }
};

// Every phase starts at 0, never goes back and ends at its total; phases in the order given.
void expect_phases(const std::vector<Report>& reports, const std::vector<std::pair<std::string, int64_t>>& phases) {
  size_t k = 0;
  for (const auto& [phase, total] : phases) {
    ASSERT_LT(k, reports.size()) << phase;
    EXPECT_EQ(reports[k].phase, phase);
    EXPECT_EQ(reports[k].done, 0) << phase;
    int64_t last = 0;
    for (; k < reports.size() && reports[k].phase == phase; ++k) {
      EXPECT_EQ(reports[k].total, total) << phase;
      EXPECT_GE(reports[k].done, last) << phase;
      last = reports[k].done;
    }
    EXPECT_EQ(last, total) << phase;
  }
  EXPECT_EQ(k, reports.size());
}

TEST(CheckpointProgress, SaveVerifyAndLoadReportBytesUpToTheirTotals) {
  TinyRun run;
  const std::string dir = testing::temp_dir("ckpt-progress");
  std::vector<Report> reports;
  auto record = [&](const CheckpointProgress& p) { reports.push_back({p.phase, p.done_bytes, p.total_bytes}); };
  TrainerState state{.iteration = 3, .consumed_train_samples = 6, .optimizer_steps = 1, .seed = 9, .fp8_scaling = {}};
  const int64_t written = save_checkpoint(dir, *run.model, run.optimizer, state, "exp_name: tiny\n", record);

  const std::string ckpt = dir + "/iter_0000003";
  const auto size = [&](const char* name) { return static_cast<int64_t>(fs::file_size(ckpt + "/" + name)); };
  const int64_t tensors = size("model.safetensors") + size("optimizer.safetensors");
  EXPECT_EQ(written, tensors);
  expect_phases(reports, {{"save", tensors}});
  EXPECT_GT(reports.size(), 10u);  // a report per tensor at least

  // The manifest, written from the bytes in flight, names each file's real size and CRC32C.
  const nlohmann::json manifest = nlohmann::json::parse(read_file(ckpt + "/manifest.json"));
  int64_t all_files = 0;
  for (const auto& [name, entry] : manifest["files"].items()) {
    const std::string bytes = read_file(ckpt + "/" + name);
    EXPECT_EQ(entry["bytes"].get<uint64_t>(), bytes.size()) << name;
    EXPECT_EQ(entry["crc32c"].get<uint32_t>(), crc32c(bytes)) << name;
    all_files += static_cast<int64_t>(bytes.size());
  }
  EXPECT_EQ(manifest["files"].size(), 5u);

  reports.clear();
  TinyRun fresh;
  fresh.model->params().initialize(99);
  const TrainerState loaded = load_checkpoint(ckpt, *fresh.model, fresh.optimizer, record);
  EXPECT_EQ(loaded.iteration, 3);
  const int64_t numel = run.model->params().numel();
  expect_phases(reports, {{"verify", all_files}, {"load", 3 * 4 * numel}});
  EXPECT_EQ(testing::max_abs_diff(fresh.model->params().flat_params(), run.model->params().flat_params()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(fresh.optimizer.exp_avg_sq(), run.optimizer.exp_avg_sq()), 0.0);

  // One flipped byte deep in the optimizer file: the streamed CRC check refuses the checkpoint.
  std::string optim = read_file(ckpt + "/optimizer.safetensors");
  optim[optim.size() - 5] ^= 0x40;
  write_file_atomic(ckpt + "/optimizer.safetensors", optim);
  try {
    load_checkpoint(ckpt, *fresh.model, fresh.optimizer);
    FAIL() << "a corrupt checkpoint was loaded";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.safetensors: CRC32C"), std::string::npos) << e.what();
  }
}

TEST(CheckpointProgress, BarsOnATerminalAndLinesInALog) {
  TinyRun run;
  for (bool tty : {false, true}) {
    const std::string dir = testing::temp_dir(tty ? "ckpt-bars-tty" : "ckpt-bars-log");
    TrainerState state{.iteration = 1, .seed = 1, .fp8_scaling = {}};
    std::ostringstream out;
    double now = 0.0;
    // Each look at the clock advances it by a second, so the half-second delay passes and lines are due.
    ProgressOutput output{&out, tty, 0, [&now] { return now += 1.0; }};
    const CheckpointProgressFn bars = checkpoint_progress_bars(output);
    save_checkpoint(dir, *run.model, run.optimizer, state, "exp_name: tiny\n", bars);
    TinyRun other;
    load_checkpoint(dir + "/iter_0000001", *other.model, other.optimizer, bars);
    const std::string text = out.str();
    if (tty) {
      EXPECT_EQ(text.find('\n'), std::string::npos) << "terminal bars leave no lines behind";
      for (const char* label : {"\rcheckpoint save [", "\rcheckpoint verify [", "\rcheckpoint load ["}) {
        EXPECT_NE(text.find(label), std::string::npos) << label;
      }
      EXPECT_NE(text.find("MB/s"), std::string::npos);
      EXPECT_EQ(text.back(), '\r') << "the last bar is erased";
    } else {
      EXPECT_EQ(text.find('\r'), std::string::npos);
      for (const char* label :
           {"checkpoint save: 100.0% |", "checkpoint verify: 100.0% |", "checkpoint load: 100.0% |"}) {
        EXPECT_NE(text.find(label), std::string::npos) << label << " in\n" << text;
      }
      EXPECT_NE(text.find(" MB | "), std::string::npos) << text;
    }
  }
  // No stream: no callback at all (the checkpoint code then skips reporting).
  EXPECT_FALSE(checkpoint_progress_bars(ProgressOutput{}));
}

}  // namespace
}  // namespace primus
