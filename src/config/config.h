// Public entry points of the config layer: load an experiment file into a validated ExperimentConfig, show
// where every effective value came from, and render the schema as Markdown. See docs/config-reference.md.
#pragma once

#include <string>
#include <vector>

#include "config/experiment.h"

namespace primus {

// One effective value and where it came from. key_path is the bare module key ("lr") for module keys and a
// dotted path for the rest ("exp_name", "env.OMP_NUM_THREADS", "modules.pre_trainer.framework").
// source: "default", "derived", "<file>:<line>" or "command line".
struct ConfigEntry {
  std::string key_path;
  std::string value;
  std::string source;
};

struct LoadedConfig {
  ExperimentConfig config;
  std::vector<ConfigEntry> entries;  // top-level keys first, then every module key in schema order
};

// Loads the experiment file, resolves `extends`, ${VAR} and the model preset, applies the command-line
// overrides ("key=value", "--key=value", "a.b.c=value") and validates everything. Throws UsageError
// "[config] <file>:<line>: <key.path>: <what is wrong>".
LoadedConfig load_experiment_config(const std::string& path, const std::vector<std::string>& overrides);

// A table of key, value and source: top-level keys, then the module keys grouped as model and training.
std::string format_config_show(const LoadedConfig& loaded);

// The Markdown reference of every key (the content of docs/config-reference.md).
std::string schema_markdown();

// True for a Slurm time limit: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
// DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS, or UNLIMITED / INFINITE (as sbatch --time reads them).
bool is_slurm_time(const std::string& text);

// The configs/ directory (holding models/): $PRIMUS_CONFIGS_DIR, else next to the executable
// (../configs, ../../configs, ../share/primus/configs), else the source tree's configs/.
std::string find_configs_dir();

}  // namespace primus
