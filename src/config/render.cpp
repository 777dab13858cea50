// Text renderings of configs: the `config show` table, the effective YAML written into every run, and the
// Markdown reference generated from the schema (docs/config-reference.md).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "config/loader_steps.h"
#include "core/secrets.h"

namespace primus {

namespace config {
namespace {

// The container: section in the shape Primus writes it (everything under options:), secret values masked.
std::string render_container_section(const ContainerSettings& container) {
  std::string out;
  if (container.runtime) out += fmt::format("  runtime: {}\n", yaml_string(container.runtime->value));
  std::string options;
  if (container.image) options += fmt::format("    image: {}\n", yaml_string(container.image->value));
  if (!container.volumes.empty()) {
    options += "    volume:\n";
    for (const SourcedValue& volume : container.volumes)
      options += fmt::format("      - {}\n", yaml_string(volume.value));
  }
  if (!container.env.empty()) {
    options += "    env:\n";
    for (const SourcedValue& entry : container.env) {
      size_t equals = entry.value.find('=');
      std::string name = entry.value.substr(0, equals);
      std::string shown =
          equals == std::string::npos ? name : name + "=" + shown_value(name, entry.value.substr(equals + 1));
      options += fmt::format("      - {}\n", yaml_string(shown));
    }
  }
  // A repeated option (device, cap-add, ...) was a list: written back as one.
  std::vector<std::pair<std::string, std::vector<std::string>>> grouped;
  for (const auto& [name, option] : container.options) {
    auto same =
        std::find_if(grouped.begin(), grouped.end(), [&name = name](const auto& group) { return group.first == name; });
    if (same == grouped.end()) same = grouped.insert(grouped.end(), {name, {}});
    same->second.push_back(option.value.empty() ? "true" : yaml_string(option.value));
  }
  for (const auto& [name, values] : grouped) {
    if (values.size() == 1) {
      options += fmt::format("    {}: {}\n", name, values.front());
      continue;
    }
    options += fmt::format("    {}:\n", name);
    for (const std::string& value : values) options += fmt::format("      - {}\n", value);
  }
  if (!options.empty()) out += "  options:\n" + options;
  return out.empty() ? "" : "container:\n" + out;
}

}  // namespace

std::string render_effective_yaml(const ExperimentConfig& config, const ModuleKeys& keys) {
  std::string out = fmt::format(
      "# Effective config of experiment {}: every module key is spelled out, so this file alone reproduces the run.\n",
      yaml_string(config.exp_name));
  if (!config.model.preset.empty()) {
    out += fmt::format("# Model preset {} (its keys are copied under overrides).\n", yaml_string(config.model.preset));
  }
  out += fmt::format("work_group: {}\nuser_name: {}\nexp_name: {}\nworkspace: {}\n", yaml_string(config.work_group),
                     yaml_string(config.user_name), yaml_string(config.exp_name), yaml_string(config.workspace));
  if (config.env.empty()) {
    out += "env: {}\n";
  } else {
    out += "env:\n";
    for (const auto& [name, value] : config.env) {
      out += fmt::format("  {}: {}\n", name, yaml_string(shown_value(name, value)));
    }
  }
  out += render_container_section(config.container);
  out += render_slurm_yaml(config.slurm);
  out += fmt::format("modules:\n  {}:\n    framework: {}\n    overrides:\n", config.module_name,
                     yaml_string(config.framework));
  for (KeyGroup group : {KeyGroup::kModel, KeyGroup::kTraining}) {
    out += fmt::format("      # {}\n", group_name(group));
    for (const ModuleKey& key : keys) {
      if (key.spec->group == group)
        out += fmt::format("      {}: {}\n", key.spec->name, format_value(*key.spec, key.value));
    }
  }
  return out;
}

}  // namespace config

std::string format_config_show(const LoadedConfig& loaded) {
  using namespace config;
  struct Row {
    std::string key, value, source;
  };
  std::vector<std::pair<std::string, std::vector<Row>>> sections = {{"top level", {}}, {"model", {}}, {"training", {}}};
  for (const ConfigEntry& e : loaded.entries) {
    const KeySpec* spec = find_key_spec(e.key_path);
    size_t section = spec == nullptr ? 0 : spec->group == KeyGroup::kModel ? 1 : 2;
    sections[section].second.push_back({e.key_path, e.value, e.source});
  }
  size_t key_width = 3, value_width = 5;
  for (const auto& [name, rows] : sections) {
    for (const Row& r : rows) {
      key_width = std::max(key_width, r.key.size());
      value_width = std::max(value_width, r.value.size());
    }
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {}\n", "key", key_width, "value", value_width, "source");
  for (const auto& [name, rows] : sections) {
    out += fmt::format("# {}\n", name);
    for (const Row& r : rows)
      out += fmt::format("{:<{}}  {:<{}}  {}\n", r.key, key_width, r.value, value_width, r.source);
  }
  return out;
}

namespace {

// Markdown table cells must not contain a raw '|'; outside code spans '<' and '>' would read as HTML.
std::string cell(const std::string& text, bool code) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (!code && c == '<') {
      out += "&lt;";
    } else if (!code && c == '>') {
      out += "&gt;";
    } else {
      out += c;
    }
  }
  return out;
}

// The help text, plus why a key is limited when the help does not say so already.
std::string help_text(const config::KeySpec& spec) {
  std::string help = spec.help;
  std::string why = spec.why;
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  };
  if (why.empty() || lower(help).find(lower(why)) != std::string::npos) return help;
  if (help.ends_with(".")) help.pop_back();
  return fmt::format("{} ({}).", help, why);
}

constexpr const char* kIntroduction = R"(# Config reference

<!-- Generated from src/config/schema.cpp by primus::schema_markdown(); do not edit by hand.
     Regenerate: PRIMUS_REGENERATE_DOCS=1 <build>/tests/config_schema_test -->

An experiment file names the run and holds one trainer module. Everything is validated before any model code
runs: unknown keys (with a did-you-mean), wrong types, values out of range and inconsistent combinations are
errors that name the file, the line and the key, and exit with code 2.

```yaml
extends: [base.yaml]            # optional: string or list, relative to this file
work_group: ${PRIMUS_TEAM:amd}
user_name: ${PRIMUS_USER:root}
exp_name: my_exp                # required: the run directory is <workspace>/<exp_name>
workspace: ./output
env: {OMP_NUM_THREADS: 2}       # set in the process environment before the run
slurm: {nodes: 2, time: "4:00:00"}  # optional: primus-cli slurm's settings (flags win)
modules:
  pre_trainer:                  # the only module for now
    framework: megatron         # the only framework for now
    model: llama3.2_1B.yaml     # preset under configs/models/ (with or without .yaml), or a path
    overrides: {train_iters: 100, lr: 3.0e-4, mock_data: true}
```

## Top-level keys

| key | type | default | notes |
|---|---|---|---|
| `extends` | string or list | none | files merged first, in order (later wins); this file's body wins over all; maps merge deeply, lists and scalars replace; a file reached twice (a diamond) is read once; at most 64 files in all |
| `work_group` | string | `""` | informational |
| `user_name` | string | `""` | informational |
| `exp_name` | string | required | a single directory name |
| `workspace` | string | `./output` | parent of the run directory |
| `env` | map of scalars | `{}` | environment variables for the run; names containing TOKEN, KEY, SECRET or PASSWORD are shown as `***` by `config show`, dry runs and the run's `config.yaml` |
| `container` | map | none | for `primus-cli container` (flags win): `runtime` (podman or docker) and, at its top or under `options:` as Primus writes them, `image`, `volume` (list of `SRC[:DST[:ro]]`), `env` (list of `NAME=VALUE`, or a map) and the run options `ipc`, `network`, `shm-size`, `cpus`, `memory`, `device`, `cap-add`, `security-opt`, `ulimit`, `group-add`, `gpus`, `privileged`; see docs/cli.md |
| `slurm` | map | `{}` | `primus-cli slurm` settings, each optional (flags on its command line win): `nodes` (>= 1), `partition`, `time` (Slurm's format: `4:00:00`, `2-00:00:00`, `90`), `job_name`, `account`, `gpus_per_node` (>= 0; also the workers per node), `output`, `error`; `job-name` and `gpus-per-node` are the same keys; other Slurm flags go on the command line |
| `modules` | map | required | holds `pre_trainer` (`post_trainer` is not supported yet) |
| `modules.pre_trainer.framework` | string | required | `megatron` |
| `modules.pre_trainer.model` | string | none | model preset: a path relative to the file naming it, else `<configs>/models/<name>[.yaml]` |
| `modules.pre_trainer.overrides` | map | `{}` | module keys (below) |

## How values combine

- Module keys, low to high priority: schema default < model preset < `overrides` < command line.
  Model and training keys share one flat namespace, so `overrides` and the command line may set model keys.
- `${VAR}` and `${VAR:default}` are replaced in every string value before typing (an unset `${VAR}` is an
  error); a substituted value is typed by its content, so `train_iters: "${ITERS:4}"` is the integer 4.
  `$${` writes a literal `${`.
- Quoted values are strings: `lr: "1e-4"` is rejected, `lr: 1e-4` is a float. `null` resets a key to its
  default (or to "not given").
- Command line: `key=value` or `--key=value` sets `modules.pre_trainer.overrides.key` (the top-level keys
  `work_group`, `user_name`, `exp_name`, `workspace` are set directly); `a.b.c=value` sets that path. The
  value is a YAML scalar, or a flow list/map when it starts with `[` or `{`: `data_path=[a.txt,b.txt]`.
- The configs directory is `$PRIMUS_CONFIGS_DIR`, else `configs/` beside the installed binary, else the
  source tree's `configs/`.
- Each run writes its effective config (every key spelled out) to `<workspace>/<exp_name>/config.yaml`;
  loading that file gives the same configuration (the model preset's name survives only as a comment, since
  its keys are copied under `overrides`).
- Checks between keys: `num_query_groups` divides `num_attention_heads` (and is required when
  `group_query_attention` is true); `hidden_size` is a multiple of `num_attention_heads` unless `kv_channels`
  is given; `global_batch_size` is a multiple of `micro_batch_size` x data-parallel size (1 for now);
  `min_lr <= lr`; `lr_warmup_iters <= lr_decay_iters`; `seq_length <= max_position_embeddings`; and an empty
  `data_path` requires `mock_data: true` (there is no silent fallback to mock data).
- YAML anchors and aliases work, but aliases that expand to more than 100,000 values in one file (an "alias
  bomb") are refused naming the file and line.
)";

}  // namespace

std::string schema_markdown() {
  using namespace config;
  std::string out = kIntroduction;
  for (KeyGroup group : {KeyGroup::kModel, KeyGroup::kTraining}) {
    out += fmt::format("\n## {} keys\n\n| key | type | default | range / choices | help |\n|---|---|---|---|---|\n",
                       group == KeyGroup::kModel ? "Model" : "Training");
    for (const KeySpec& spec : module_key_specs()) {
      if (spec.group != group) continue;
      std::string def = spec.presence == Presence::kRequired ? "required"
                        : spec.presence == Presence::kOptional
                            ? "none"
                            : fmt::format("`{}`", format_value(spec, default_value(spec)));
      std::string limits = describe_limits(spec);
      out += fmt::format("| `{}` | {} | {} | {} | {} |\n", spec.name, type_name(spec.type), cell(def, true),
                         limits.empty() ? std::string() : fmt::format("`{}`", cell(limits, true)),
                         cell(help_text(spec), false));
    }
  }
  return out;
}

}  // namespace primus
