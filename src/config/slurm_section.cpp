// The `slurm:` section of an experiment file: the Slurm settings of `primus-cli slurm` (nodes, partition,
// time, job name, account, GPUs per node, output and error paths), typed and checked when the file loads so that
// a bad value exits 2 naming file, line and key before anything is submitted. Keys are written as Primus users
// write them: snake_case (gpus_per_node) or as the sbatch flag (job-name); both spellings mean the same key.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "config/loader_steps.h"

namespace primus {

namespace config {
namespace {

enum class SlurmKeyType { kCount, kText };

struct SlurmKey {
  const char* name;  // canonical, snake_case
  SlurmKeyType type;
  int64_t min;                       // kCount only
  std::string SlurmSettings::*text;  // kText only
};

const std::vector<SlurmKey>& slurm_keys() {
  static const std::vector<SlurmKey> keys = {
      {"nodes", SlurmKeyType::kCount, 1, nullptr},
      {"partition", SlurmKeyType::kText, 0, &SlurmSettings::partition},
      {"time", SlurmKeyType::kText, 0, &SlurmSettings::time},
      {"job_name", SlurmKeyType::kText, 0, &SlurmSettings::job_name},
      {"account", SlurmKeyType::kText, 0, &SlurmSettings::account},
      {"gpus_per_node", SlurmKeyType::kCount, 0, nullptr},
      {"output", SlurmKeyType::kText, 0, &SlurmSettings::output},
      {"error", SlurmKeyType::kText, 0, &SlurmSettings::error},
  };
  return keys;
}

std::optional<int64_t>& count_field(SlurmSettings& settings, std::string_view name) {
  return name == "nodes" ? settings.nodes : settings.gpus_per_node;
}

const std::optional<int64_t>& count_field(const SlurmSettings& settings, std::string_view name) {
  return name == "nodes" ? settings.nodes : settings.gpus_per_node;
}

std::string canonical_name(std::string key) {
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "a:b:c" split at ':'; each part must be digits.
bool digit_fields(std::string_view text, size_t min_parts, size_t max_parts) {
  size_t parts = 0;
  size_t start = 0;
  while (true) {
    size_t colon = text.find(':', start);
    std::string_view part =
        text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start);
    if (!all_digits(part)) return false;
    ++parts;
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  return parts >= min_parts && parts <= max_parts;
}

}  // namespace

void read_slurm_section(const ConfigNode& root, ExperimentConfig& config, std::vector<ConfigEntry>& entries) {
  const ConfigNode* section = root.find("slurm");
  if (section == nullptr || section->kind == ConfigNode::Kind::kNull) return;
  if (section->kind != ConfigNode::Kind::kMap) {
    config_error(section->origin, fmt::format("expected a map of Slurm settings, got {}", section->kind_name()));
  }
  std::vector<std::string> names;
  for (const SlurmKey& key : slurm_keys()) names.emplace_back(key.name);
  SlurmSettings& settings = config.slurm;
  for (const auto& [written, value] : section->fields) {
    const std::string name = canonical_name(written);
    auto key =
        std::find_if(slurm_keys().begin(), slurm_keys().end(), [&](const SlurmKey& k) { return name == k.name; });
    if (key == slurm_keys().end()) {
      std::string hint = did_you_mean(name, names);
      if (hint.empty()) {
        hint =
            " (allowed: nodes, partition, time, job_name, account, gpus_per_node, output, error; other Slurm "
            "flags go on the command line: primus-cli slurm sbatch --FLAG ... -- ...)";
      }
      config_error(value.origin, fmt::format("unknown key '{}' in the slurm section{}", written, hint));
    }
    if (settings.sources.contains(name)) {
      config_error(value.origin, fmt::format("slurm.{} is given twice (as {} and another spelling)", name, written));
    }
    if (value.kind == ConfigNode::Kind::kNull) continue;
    if (value.kind != ConfigNode::Kind::kScalar) {
      config_error(value.origin, fmt::format("expected a single value, got {}", value.kind_name()));
    }
    const std::string& text = value.text;
    if (key->type == SlurmKeyType::kCount) {
      int64_t number = 0;
      auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
      if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
        config_error(value.origin, fmt::format("expected a whole number, got {}", value.kind_name()));
      }
      if (number < key->min) config_error(value.origin, fmt::format("must be >= {}, got {}", key->min, number));
      count_field(settings, name) = number;
    } else {
      if (text.empty()) config_error(value.origin, "must not be empty (leave the key out instead)");
      if (name == "time" && !is_slurm_time(text)) {
        config_error(value.origin, fmt::format("'{}' is not a Slurm time: write MINUTES, HOURS:MINUTES:SECONDS, "
                                               "DAYS-HOURS[:MINUTES[:SECONDS]] or UNLIMITED (e.g. \"4:00:00\")",
                                               text));
      }
      settings.*(key->text) = text;
    }
    settings.sources[name] = value.origin.source();
    entries.push_back({"slurm." + name, yaml_string(text), value.origin.source()});
  }
}

std::string render_slurm_yaml(const SlurmSettings& settings) {
  if (settings.empty()) return "";
  std::string out = "slurm:\n";
  for (const SlurmKey& key : slurm_keys()) {
    if (!settings.sources.contains(key.name)) continue;
    if (key.type == SlurmKeyType::kCount) {
      out += fmt::format("  {}: {}\n", key.name, *count_field(settings, key.name));
    } else {
      out += fmt::format("  {}: {}\n", key.name, yaml_string(settings.*(key.text)));
    }
  }
  return out;
}

}  // namespace config

bool is_slurm_time(const std::string& text) {
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper == "UNLIMITED" || upper == "INFINITE") return true;
  size_t dash = text.find('-');
  if (dash == std::string::npos) return config::digit_fields(text, 1, 3);  // M, M:S, H:M:S
  return config::all_digits(std::string_view(text).substr(0, dash)) &&
         config::digit_fields(std::string_view(text).substr(dash + 1), 1, 3);  // D-H, D-H:M, D-H:M:S
}

}  // namespace primus
