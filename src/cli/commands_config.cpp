// `primus-cli -- config show|validate|schema`: inspect experiment configs without training.
#include <fmt/format.h>

#include <cstdio>

#include "cli/cli.h"
#include "config/config.h"

namespace primus::cli {
namespace {

constexpr const char* kOverridesHelp =
    R"(Overrides: KEY=VALUE, --KEY=VALUE, --KEY VALUE or --FLAG, as for 'train pretrain'.)";

struct ConfigArguments {
  std::string path;
  CLI::App* command = nullptr;  // its remaining() words are the overrides
};

// A config subcommand taking --config FILE and overrides; `run` gets the loaded config.
CLI::App* add_config_subcommand(CLI::App& config, const std::string& name, const std::string& help,
                                const std::string& examples, const LaunchOptions& launch, Action& action,
                                std::function<int(const std::string&, const LoadedConfig&)> run) {
  CLI::App* command = config.add_subcommand(name, help);
  auto arguments = std::make_shared<ConfigArguments>();
  arguments->command = command;
  command->add_option("--config", arguments->path, "Experiment YAML file")->required()->type_name("FILE");
  command->allow_extras();
  command->footer(std::string(kOverridesHelp) + "\n\nExamples:\n" + examples);
  command->final_callback([&launch, &action, arguments, run] {
    action = [&launch, arguments, run] {
      std::vector<std::string> overrides = normalize_overrides(arguments->command->remaining());
      LoadedConfig loaded = load_experiment_config(arguments->path, overrides);
      if (launch.dry_run) {
        print_dry_run(launch, arguments->path, overrides, &loaded);
        return static_cast<int>(kExitOk);
      }
      return run(arguments->path, loaded);
    };
  });
  return command;
}

}  // namespace

void add_config_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* config = root.add_subcommand("config", "Inspect experiment configs: show, validate, schema");
  config->require_subcommand(1);
  config->footer(
      "Examples:\n  primus-cli -- config validate --config exp.yaml\n  primus-cli -- config schema > keys.md");

  add_config_subcommand(*config, "show", "Print the effective config: every key, its value and where it came from",
                        "  primus-cli -- config show --config exp.yaml\n"
                        "  primus-cli -- config show --config exp.yaml lr=1e-3",
                        launch, action, [](const std::string&, const LoadedConfig& loaded) {
                          fmt::print("{}", format_config_show(loaded));
                          std::fflush(stdout);
                          return static_cast<int>(kExitOk);
                        });
  add_config_subcommand(*config, "validate", "Check a config: print 'OK: FILE' (exit 0) or the first error (exit 2)",
                        "  primus-cli -- config validate --config exp.yaml\n"
                        "  primus-cli -- config validate --config exp.yaml seq_length=4096",
                        launch, action, [](const std::string& path, const LoadedConfig&) {
                          fmt::print("OK: {}\n", path);
                          std::fflush(stdout);
                          return static_cast<int>(kExitOk);
                        });

  CLI::App* schema = config->add_subcommand("schema", "Print the reference of every config key (type, default, help)");
  schema->add_flag("--markdown")->description("Markdown output (the default, and for now the only format)");
  schema->footer("Examples:\n  primus-cli -- config schema --markdown > docs/config-reference.md");
  schema->final_callback([&launch, &action] {
    action = [&launch] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
      } else {
        fmt::print("{}", schema_markdown());
        std::fflush(stdout);
      }
      return static_cast<int>(kExitOk);
    };
  });
}

}  // namespace primus::cli
