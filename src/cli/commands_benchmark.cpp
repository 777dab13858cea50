// `primus-cli -- benchmark train`: time the training step of an experiment config on synthetic tokens.
#include <fmt/format.h>

#include <cstdio>

#include "cli/cli.h"
#include "config/config.h"
#include "train/benchmark.h"

namespace primus::cli {

void add_benchmark_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* benchmark = root.add_subcommand("benchmark", "Micro-benchmarks: train (the whole training step)");
  benchmark->require_subcommand(1);
  CLI::App* train = benchmark->add_subcommand(
      "train", "Time warm-up plus N training steps of a config on random tokens; prints a table and a JSON line");
  auto config_path = std::make_shared<std::string>();
  auto options = std::make_shared<BenchmarkOptions>();
  train->add_option("--config", *config_path, "Experiment YAML file")->required()->type_name("FILE");
  train->add_option("--warmup", options->warmup_steps, "Untimed steps first (default 3)")->check(CLI::NonNegativeNumber);
  train->add_option("--steps", options->timed_steps, "Timed steps (default 10)")->check(CLI::PositiveNumber);
  train->allow_extras();
  train->footer(
      "Overrides: KEY=VALUE as for 'train pretrain' (e.g. micro_batch_size=8). data_path is ignored: the\n"
      "benchmark draws random tokens. FLOPs per token = 6 x matmul parameters (output layer included) +\n"
      "12 x layers x seq x heads x head_dim; MFU is against 989 TFLOP/s (H100/H200 dense bf16). The memory\n"
      "estimate is logged first; out of device memory exits 3 with it and what to try. Progress bars go to\n"
      "stderr on a terminal (else a line every 5 s; PRIMUS_PROGRESS=0: none).\n\n"
      "Examples:\n  primus-cli -- benchmark train --config configs/examples/default_cpu.yaml --steps 5");
  train->final_callback([&launch, &action, train, config_path, options] {
    action = [&launch, train, config_path, options] {
      std::vector<std::string> overrides = normalize_overrides(train->remaining());
      LoadedConfig loaded = load_experiment_config(*config_path, overrides);
      if (launch.dry_run) {
        print_dry_run(launch, *config_path, overrides, &loaded);
        return static_cast<int>(kExitOk);
      }
      options->progress = ProgressOutput::standard_error();
      fmt::print("{}", format_benchmark(loaded.config, run_benchmark_train(loaded.config, *options)));
      std::fflush(stdout);
      return static_cast<int>(kExitOk);
    };
  });
}

}  // namespace primus::cli
