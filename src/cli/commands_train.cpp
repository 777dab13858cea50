// `primus-cli -- train pretrain|posttrain`: load and validate the experiment config, apply its env: section,
// then hand over to the trainer, whose return value (0 or 128+N after a signal) is the exit code.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "cli/cli.h"
#include "config/config.h"
#include "core/secrets.h"
#include "train/pretrain.h"
#include "train/signals.h"

namespace primus::cli {
namespace {

constexpr const char* kPretrainFooter = R"(Overrides (after the options, any number):
  KEY=VALUE, --KEY=VALUE, --KEY VALUE, or --FLAG (same as FLAG=true). KEY is a module key (lr, train_iters,
  seq_length, ...) or a dotted path (exp_name, modules.pre_trainer.overrides.lr). They win over the file.
  List every key with 'primus-cli -- config schema'.

The run writes <workspace>/<exp_name>/ (config.yaml, logs/, metrics.jsonl, checkpoints/) and resumes from the
latest complete checkpoint there. The config's env: section is set in the environment first and wins over
the shell. SIGINT/SIGTERM: checkpoint, then exit 128+N; a second signal exits at once.

Examples:
  primus-cli -- train pretrain --config exp.yaml
  primus-cli -- train pretrain --config exp.yaml train_iters=50 --lr 3e-4 --mock_data
  primus-cli --dry-run -- train pretrain --config exp.yaml)";

// Primus semantics: the experiment's env: entries override the shell, and are set before anything starts.
void apply_config_env(const ExperimentConfig& config) {
  for (const auto& [key, value] : config.env) {
    const char* previous = std::getenv(key.c_str());
    if (previous != nullptr && value != previous) {
      spdlog::info("env: {}={} (from the config; the shell had {})", key, shown_value(key, value),
                   shown_value(key, previous));
    } else {
      spdlog::debug("env: {}={}", key, shown_value(key, value));
    }
    if (::setenv(key.c_str(), value.c_str(), /*overwrite=*/1) != 0) {
      throw UsageError(
          fmt::format("[config] {}: env.{}: cannot set this environment variable", config.source_path, key));
    }
  }
}

int pretrain(const LaunchOptions& launch, const std::string& config_path, const std::vector<std::string>& extras) {
  std::vector<std::string> overrides = normalize_overrides(extras);
  spdlog::debug("overrides: {}", overrides.empty() ? "none" : fmt::format("{}", fmt::join(overrides, " ")));
  LoadedConfig loaded = load_experiment_config(config_path, overrides);
  if (launch.dry_run) {
    print_dry_run(launch, config_path, overrides, &loaded);
    return kExitOk;
  }
  apply_config_env(loaded.config);
  install_stop_handlers();
  spdlog::info("primus-cli {}: train pretrain, config {}, run dir {}", PRIMUS_VERSION, config_path,
               loaded.config.run_dir());
  RunOptions options;
  options.debug = launch.debug;
  options.progress = ProgressOutput::standard_error();
  return run_pretrain(loaded.config, options);
}

}  // namespace

void add_train_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* train =
      root.add_subcommand("train", "Train a model: pretrain, or posttrain (SFT/LoRA, not implemented yet)");
  train->require_subcommand(1);
  train->footer("Examples:\n  primus-cli -- train pretrain --config exp.yaml\n  primus-cli -- train pretrain --help");

  CLI::App* pretrain_command =
      train->add_subcommand("pretrain", "Pretrain a model described by an experiment YAML (resumes when it can)");
  auto config_path = std::make_shared<std::string>();
  pretrain_command->add_option("--config", *config_path, "Experiment YAML file")->required()->type_name("FILE");
  pretrain_command->allow_extras();
  pretrain_command->footer(kPretrainFooter);
  pretrain_command->final_callback([&launch, &action, pretrain_command, config_path] {
    // remaining() is read when the action runs: the parser has finished collecting the overrides by then.
    action = [&launch, pretrain_command, config_path] {
      return pretrain(launch, *config_path, pretrain_command->remaining());
    };
  });

  CLI::App* posttrain = train->add_subcommand("posttrain", "Supervised fine-tuning / LoRA (not implemented yet)");
  posttrain->allow_extras();
  posttrain->footer("Not implemented yet; train pretrain is available.");
  posttrain->final_callback([&action] {
    action = []() -> int { throw NotImplementedError("posttrain (SFT/LoRA) is not implemented yet"); };
  });
}

}  // namespace primus::cli
