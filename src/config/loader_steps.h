// The steps of load_experiment_config after the YAML is merged: model preset lookup, cross-key checks,
// resolution into ExperimentConfig, and the effective YAML. Internal to the config layer.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/schema.h"

namespace primus::config {

// Every module key in schema order with its effective (merged, typed) value.
using ModuleKeys = std::vector<ModuleKey>;

// The preset file named by modules.<m>.model: a path relative to the file that names it (or absolute), else
// <configs>/models/<name>[.yaml]. The error lists the available presets.
std::filesystem::path find_model_preset(const ConfigNode& model);

// Reads the optional `container:` section (keys at its top or under `options:`, as Primus writes them) and
// appends one entry per value, secrets in `env` masked.
void read_container_section(const ConfigNode& root, ContainerSettings& settings, std::vector<ConfigEntry>& entries);

// Checks between keys (divisibility, ordering, data source). `module_origin` locates keys that kept defaults.
void check_module_keys(const ModuleKeys& keys, const Origin& module_origin);

// Writes every key into config (deriving num_query_groups, kv_channels, lr_decay_iters, global_batch_size)
// and appends one entry per module key.
void resolve_module_keys(const ModuleKeys& keys, ExperimentConfig& config, std::vector<ConfigEntry>& entries);

// The `slurm:` section into config.slurm, one entry per given key (slurm_section.cpp).
void read_slurm_section(const ConfigNode& root, ExperimentConfig& config, std::vector<ConfigEntry>& entries);
// The section as YAML ("" when empty), for the effective config.
std::string render_slurm_yaml(const SlurmSettings& settings);

// The merged config as YAML that loads back to the same ExperimentConfig: top-level keys and every module
// key under overrides (unset optional keys as null). The model preset's keys are copied, so no `model:` key.
std::string render_effective_yaml(const ExperimentConfig& config, const ModuleKeys& keys);

}  // namespace primus::config
