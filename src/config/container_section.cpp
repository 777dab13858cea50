// The `container:` section of an experiment file (see ContainerSettings in experiment.h). Only its shape is
// checked here (known keys, scalars or lists of scalars); what the values mean (a valid image reference, an
// existing volume source, a runtime that is installed) is checked by `primus-cli container`, which knows the
// machine it runs on.
#include <fmt/format.h>

#include <algorithm>

#include "config/loader_steps.h"
#include "core/secrets.h"

namespace primus::config {
namespace {

// Run options passed on as `--NAME=VALUE` (a list gives one option per entry).
const std::vector<std::string>& passed_options() {
  static const std::vector<std::string> names = {"ipc",    "network",   "shm-size", "cpus",
                                                 "memory", "device",    "cap-add",  "security-opt",
                                                 "ulimit", "group-add", "gpus",     "privileged"};
  return names;
}

const std::vector<std::string>& section_keys() {
  static const std::vector<std::string> names = {"runtime", "image", "volume", "env", "options"};
  return names;
}

std::string where(const ConfigNode& node, const std::string& path) {
  return fmt::format("{}: {}", node.origin.source(), path);
}

const ConfigNode& scalar(const ConfigNode& node, const std::string& path) {
  if (node.kind != ConfigNode::Kind::kScalar) {
    config_error(node.origin.with_path(path), fmt::format("expected a string, got {}", node.kind_name()));
  }
  return node;
}

// A scalar or a list of scalars, as Primus accepts for its cumulative options.
std::vector<SourcedValue> scalars(const ConfigNode& node, const std::string& path) {
  std::vector<SourcedValue> values;
  if (node.kind == ConfigNode::Kind::kNull) return values;
  if (node.kind == ConfigNode::Kind::kScalar) return {{node.text, where(node, path)}};
  if (node.kind != ConfigNode::Kind::kList) {
    config_error(node.origin.with_path(path), fmt::format("expected a string or a list, got {}", node.kind_name()));
  }
  for (size_t i = 0; i < node.items.size(); ++i) {
    std::string item_path = fmt::format("{}[{}]", path, i);
    values.push_back({scalar(node.items[i], item_path).text, where(node.items[i], item_path)});
  }
  return values;
}

// env: a list of "NAME=VALUE" (Primus's form) or a map NAME: VALUE.
std::vector<SourcedValue> env_entries(const ConfigNode& node, const std::string& path) {
  if (node.kind != ConfigNode::Kind::kMap) return scalars(node, path);
  std::vector<SourcedValue> values;
  for (const auto& [name, value] : node.fields) {
    std::string entry_path = path + "." + name;
    values.push_back({name + "=" + scalar(value, entry_path).text, where(value, entry_path)});
  }
  return values;
}

void read_key(const std::string& key, const ConfigNode& value, const std::string& path, ContainerSettings& settings,
              std::vector<ConfigEntry>& entries) {
  if (key == "image") {
    settings.image = SourcedValue{scalar(value, path).text, where(value, path)};
    entries.push_back({path, yaml_string(value.text), value.origin.source()});
  } else if (key == "runtime") {
    settings.runtime = SourcedValue{scalar(value, path).text, where(value, path)};
    entries.push_back({path, yaml_string(value.text), value.origin.source()});
  } else if (key == "volume") {
    for (SourcedValue& volume : scalars(value, path)) {
      entries.push_back({path, yaml_string(volume.value), value.origin.source()});
      settings.volumes.push_back(std::move(volume));
    }
  } else if (key == "env") {
    for (SourcedValue& entry : env_entries(value, path)) {
      size_t equals = entry.value.find('=');
      std::string name = entry.value.substr(0, equals);
      std::string shown =
          equals == std::string::npos ? name : name + "=" + shown_value(name, entry.value.substr(equals + 1));
      entries.push_back({path, yaml_string(shown), value.origin.source()});
      settings.env.push_back(std::move(entry));
    }
  } else if (key == "privileged") {
    // A flag: true adds --privileged, false leaves it out.
    const std::string& text = scalar(value, path).text;
    if (text != "true" && text != "false") {
      config_error(value.origin.with_path(path), fmt::format("expected true or false, got {}", value.kind_name()));
    }
    if (text == "true") settings.options.push_back({key, {"", where(value, path)}});
    entries.push_back({path, text, value.origin.source()});
  } else {
    for (SourcedValue& option : scalars(value, path)) {
      entries.push_back({path, yaml_string(option.value), value.origin.source()});
      settings.options.push_back({key, std::move(option)});
    }
  }
}

void reject_unknown(const std::string& key, const ConfigNode& value, const std::string& path,
                    const std::vector<std::string>& known) {
  if (key == "debug" || key == "dry_run") {
    config_error(value.origin.with_path(path),
                 fmt::format("not read from the config: give primus-cli's global --{} flag instead",
                             key == "debug" ? "debug" : "dry-run"));
  }
  if (key == "name") {
    config_error(value.origin.with_path(path),
                 "primus-cli names each container itself (primus-<pid>-<time>) so that it can remove it; leave "
                 "this key out");
  }
  config_error(value.origin.with_path(path), fmt::format("unknown key '{}'{}", key, did_you_mean(key, known)));
}

}  // namespace

void read_container_section(const ConfigNode& root, ContainerSettings& settings, std::vector<ConfigEntry>& entries) {
  const ConfigNode* section = root.find("container");
  if (section == nullptr || section->kind == ConfigNode::Kind::kNull) return;
  if (section->kind != ConfigNode::Kind::kMap) {
    config_error(section->origin.with_path("container"), fmt::format("expected a map, got {}", section->kind_name()));
  }
  std::vector<std::string> option_keys = {"image", "volume", "env"};
  option_keys.insert(option_keys.end(), passed_options().begin(), passed_options().end());
  for (const auto& [key, value] : section->fields) {
    std::string path = "container." + key;
    if (key == "options") {
      if (value.kind == ConfigNode::Kind::kNull) continue;
      if (value.kind != ConfigNode::Kind::kMap) {
        config_error(value.origin.with_path(path), fmt::format("expected a map, got {}", value.kind_name()));
      }
      for (const auto& [option, option_value] : value.fields) {
        std::string option_path = path + "." + option;
        if (std::find(option_keys.begin(), option_keys.end(), option) == option_keys.end()) {
          reject_unknown(option, option_value, option_path, option_keys);
        }
        read_key(option, option_value, option_path, settings, entries);
      }
      continue;
    }
    if (std::find(section_keys().begin(), section_keys().end(), key) == section_keys().end()) {
      reject_unknown(key, value, path, section_keys());
    }
    read_key(key, value, path, settings, entries);
  }
}

}  // namespace primus::config
