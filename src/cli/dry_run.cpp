// The --dry-run report: enough to check a launch before spending GPU time on it (which config, which
// overrides, where the run would write, and the shape of the model and schedule), printed to stdout.
#include <fmt/format.h>

#include <cstdio>

#include "cli/cli.h"
#include "cli/container_command.h"
#include "config/config.h"
#include "core/secrets.h"

namespace primus::cli {
namespace {

std::string join(const std::vector<std::string>& words, const std::string& separator) {
  std::string joined;
  for (const std::string& word : words) joined += (joined.empty() ? "" : separator) + word;
  return joined;
}

void line(const std::string& label, const std::string& value) { fmt::print("  {:<12} {}\n", label, value); }

std::string describe_model(const ModelArgs& m, const TrainingArgs& t) {
  std::string vocab = m.vocab_size > 0 ? std::to_string(m.vocab_size)
                                       : fmt::format("from the tokenizer, padded to a multiple of {}",
                                                     m.make_vocab_size_divisible_by * t.tensor_model_parallel_size);
  return fmt::format(
      "{}: {} layers, hidden {}, ffn {}, {} heads, {} kv groups, head dim {}, vocab {}, max positions {}",
      m.preset.empty() ? "(inline)" : m.preset, m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads,
      m.num_query_groups, m.kv_channels, vocab, m.max_position_embeddings);
}

std::string describe_schedule(const TrainingArgs& t) {
  return fmt::format(
      "{} iters, micro batch {}, global batch {}, seq length {}, lr {} -> {} ({}, warmup {}, decay over {}), "
      "seed {}",
      t.train_iters, t.micro_batch_size, t.global_batch_size, t.seq_length, t.lr, t.min_lr, t.lr_decay_style,
      t.lr_warmup_iters, t.lr_decay_iters, t.seed);
}

std::string describe_data(const TrainingArgs& t) {
  std::string source = t.mock_data ? "mock data" : t.data_path.empty() ? "none" : join(t.data_path, ", ");
  if (!t.mock_data && t.data_path.size() > 3) {
    source = fmt::format("{} paths: {}, {}, ..., {}", t.data_path.size(), t.data_path[0], t.data_path[1],
                         t.data_path.back());
  }
  return fmt::format("{} (tokenizer {}, split {})", source, t.tokenizer_type, t.split);
}

std::string describe_checkpoints(const ExperimentConfig& config) {
  const TrainingArgs& t = config.train;
  std::string save = t.save.empty() ? config.run_dir() + "/checkpoints" : t.save;
  std::string when = t.save_interval > 0 ? fmt::format("every {} iters and at the end", t.save_interval) : "at the end";
  std::string resume = t.load.empty() ? save : t.load;
  std::string report = fmt::format("save to {} {}; resume from the latest in {}", save, when, resume);
  if (!t.pretrained_checkpoint.empty()) report += "; start from weights " + t.pretrained_checkpoint;
  return report;
}

}  // namespace

void print_dry_run(const LaunchOptions& launch, const std::string& config_path,
                   const std::vector<std::string>& overrides, const LoadedConfig* loaded) {
  if (launch.plan != nullptr) {
    launch.plan->config_path = config_path;
    if (loaded != nullptr) launch.plan->config = loaded->config;
    if (!launch.plan->print) return;
  }
  fmt::print("primus-cli dry run: nothing was started\n");
  line("mode", launch.mode);
  line("command", shown_command_line(launch.command_words));
  if (!config_path.empty()) line("config", config_path + (loaded != nullptr ? " (valid)" : ""));
  if (!config_path.empty()) line("overrides", overrides.empty() ? "none" : shown_command_line(overrides));
  line("log file", launch.log_file.empty() ? "none (console only)" : launch.log_file + " (not created in a dry run)");
  if (loaded == nullptr) return;
  const ExperimentConfig& config = loaded->config;
  line("run dir", config.run_dir());
  std::vector<std::string> env;
  for (const auto& [key, value] : config.env) env.push_back(key + "=" + shown_value(key, value));
  line("env", env.empty() ? "none" : join(env, " "));
  line("model", describe_model(config.model, config.train));
  line("training", describe_schedule(config.train));
  line("data", describe_data(config.train));
  line("checkpoints", describe_checkpoints(config));
  line("device", config.train.device);
  std::fflush(stdout);
}

}  // namespace primus::cli
