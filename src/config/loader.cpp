// load_experiment_config: experiment file -> merged tree (extends, ${VAR}) -> command-line overrides ->
// structural validation of top-level and module keys -> model preset -> typed module keys -> cross-key
// checks -> ExperimentConfig. Every rejection is a UsageError naming file, line and key path.
#include <algorithm>
#include <cctype>

#include "config/loader_steps.h"
#include "core/error.h"
#include "core/secrets.h"

namespace primus {

namespace config {
namespace {

constexpr const char* kModule = "pre_trainer";
constexpr const char* kOverridesPath = "modules.pre_trainer.overrides";

bool contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

// "key=value" | "--key=value" | "a.b.c=value". A bare name is a module key unless it is a top-level key.
void apply_override(ConfigNode& root, const std::string& argument) {
  std::string text = argument.starts_with("--") ? argument.substr(2) : argument;
  size_t eq = text.find('=');
  Origin origin{OriginKind::kCommandLine, "", 0, argument};
  if (eq == std::string::npos || eq == 0) config_error(origin, "expected key=value");
  std::string key = text.substr(0, eq);
  origin.path = key;
  std::vector<std::string> segments;
  if (key.find('.') == std::string::npos) {
    if (key == "extends") config_error(origin, "extends cannot be set on the command line");
    if (!contains(top_level_keys(), key)) segments = {"modules", kModule, "overrides"};
    segments.push_back(key);
  } else {
    size_t start = 0;
    while (true) {
      size_t dot = key.find('.', start);
      segments.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (segments.back().empty()) config_error(origin, "empty name in the dotted key");
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  }
  ConfigNode* node = &root;
  std::string prefix;
  for (size_t i = 0; i + 1 < segments.size(); ++i) {
    prefix += (i ? "." : "") + segments[i];
    ConfigNode* child = node->find(segments[i]);
    if (child == nullptr || child->kind == ConfigNode::Kind::kNull) {
      child = &node->set(segments[i], ConfigNode::map(origin));
    } else if (child->kind != ConfigNode::Kind::kMap) {
      config_error(origin,
                   fmt::format("cannot set a key inside '{}': it is {}, not a map", prefix, child->kind_name()));
    }
    node = child;
  }
  node->set(segments.back(), parse_override_value(text.substr(eq + 1), origin));
}

// A string-valued top-level key; absent or null gives `fallback`.
std::string top_string(const ConfigNode& root, const char* key, const std::string& fallback,
                       std::vector<ConfigEntry>& entries) {
  const ConfigNode* node = root.find(key);
  if (node == nullptr || node->kind == ConfigNode::Kind::kNull) {
    entries.push_back({key, yaml_string(fallback), "default"});
    return fallback;
  }
  if (node->kind != ConfigNode::Kind::kScalar) {
    config_error(node->origin, fmt::format("expected a string, got {}", node->kind_name()));
  }
  entries.push_back({key, yaml_string(node->text), node->origin.source()});
  return node->text;
}

void read_top_level(const ConfigNode& root, ExperimentConfig& config, std::vector<ConfigEntry>& entries) {
  for (const auto& [key, value] : root.fields) {
    if (contains(top_level_keys(), key)) continue;
    if (find_key_spec(key) != nullptr) {
      config_error(value.origin,
                   fmt::format("unknown top-level key '{}' (module keys go under {})", key, kOverridesPath));
    }
    config_error(value.origin, fmt::format("unknown top-level key '{}'{}", key, did_you_mean(key, top_level_keys())));
  }
  config.work_group = top_string(root, "work_group", "", entries);
  config.user_name = top_string(root, "user_name", "", entries);
  config.exp_name = top_string(root, "exp_name", "", entries);
  const ConfigNode* exp_name = root.find("exp_name");
  Origin exp_origin = exp_name ? exp_name->origin : root.origin.with_path("exp_name");
  if (config.exp_name.empty()) config_error(exp_origin, "required: the run directory is <workspace>/<exp_name>");
  if (config.exp_name.find('/') != std::string::npos || config.exp_name == "." || config.exp_name == "..") {
    config_error(exp_origin, fmt::format("'{}' must be a single directory name", config.exp_name));
  }
  config.workspace = top_string(root, "workspace", "./output", entries);
  const ConfigNode* workspace = root.find("workspace");
  if (config.workspace.empty()) config_error(workspace->origin, "must not be empty");

  const ConfigNode* env = root.find("env");
  if (env == nullptr || env->kind == ConfigNode::Kind::kNull) return;
  if (env->kind != ConfigNode::Kind::kMap)
    config_error(env->origin, fmt::format("expected a map of variables, got {}", env->kind_name()));
  for (const auto& [name, value] : env->fields) {
    bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                 std::all_of(name.begin(), name.end(),
                             [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!valid) config_error(value.origin, fmt::format("'{}' is not a valid environment variable name", name));
    if (value.kind != ConfigNode::Kind::kScalar) {
      config_error(value.origin,
                   fmt::format("expected a scalar value (write \"\" for an empty string), got {}", value.kind_name()));
    }
    config.env[name] = value.text;
    entries.push_back({"env." + name, yaml_string(shown_value(name, value.text)), value.origin.source()});
  }
}

// modules: exactly the pre_trainer module, with framework, model and overrides.
const ConfigNode& find_module(const ConfigNode& root) {
  const ConfigNode* modules = root.find("modules");
  if (modules == nullptr || modules->kind == ConfigNode::Kind::kNull) {
    config_error(root.origin.with_path("modules"), "required: a map holding the pre_trainer module");
  }
  if (modules->kind != ConfigNode::Kind::kMap)
    config_error(modules->origin, fmt::format("expected a map, got {}", modules->kind_name()));
  for (const auto& [name, value] : modules->fields) {
    if (name == kModule) continue;
    if (name == "post_trainer")
      config_error(value.origin, "module 'post_trainer' is not supported yet (only pre_trainer)");
    config_error(value.origin,
                 fmt::format("unknown module '{}'{}", name, did_you_mean(name, {kModule, "post_trainer"})));
  }
  const ConfigNode* module = modules->find(kModule);
  if (module == nullptr) config_error(modules->origin.with_path("modules.pre_trainer"), "required");
  if (module->kind != ConfigNode::Kind::kMap)
    config_error(module->origin, fmt::format("expected a map, got {}", module->kind_name()));
  for (const auto& [key, value] : module->fields) {
    if (contains(module_section_keys(), key)) continue;
    if (key == "config")
      config_error(value.origin, "module presets are not supported yet; put the keys under overrides");
    if (find_key_spec(key) != nullptr) {
      config_error(value.origin, fmt::format("unknown key '{}' (module keys go under {})", key, kOverridesPath));
    }
    config_error(value.origin, fmt::format("unknown key '{}'{}", key, did_you_mean(key, module_section_keys())));
  }
  return *module;
}

// A map whose keys must all be module keys (the overrides section or a model preset).
void check_module_key_names(const ConfigNode& map) {
  for (const auto& [key, value] : map.fields) {
    if (find_key_spec(key) != nullptr) continue;
    std::string hint = did_you_mean_module_key(key);
    if (hint.empty() && (contains(top_level_keys(), key) || contains(module_section_keys(), key))) {
      hint = " (it is not a module key; move it out of here)";
    }
    config_error(value.origin, fmt::format("unknown key '{}'{}", key, hint));
  }
}

ModuleKeys collect_module_keys(const ConfigNode* preset, const ConfigNode* overrides, const Origin& module_origin) {
  ModuleKeys keys;
  std::vector<std::string> missing;
  for (const KeySpec& spec : module_key_specs()) {
    const ConfigNode* node = overrides ? overrides->find(spec.name) : nullptr;
    if (node == nullptr && preset != nullptr) node = preset->find(spec.name);
    ModuleKey key{&spec, {}, Origin{}};
    if (node != nullptr) {
      key.value = type_value(spec, *node);
      key.origin = node->origin;
    } else {
      key.value = default_value(spec);
    }
    if (spec.presence == Presence::kRequired && !key.value.is_set) missing.push_back(spec.name);
    keys.push_back(std::move(key));
  }
  if (missing.size() == 1) {
    config_error(module_origin.with_path(fmt::format("{}.{}", kOverridesPath, missing[0])),
                 "required key is missing; set it in the model preset or under overrides");
  }
  if (!missing.empty()) {
    std::string names;
    for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m;
    config_error(module_origin.with_path(kOverridesPath),
                 fmt::format("required keys are missing: {}; set them in the model preset or under overrides", names));
  }
  return keys;
}

}  // namespace
}  // namespace config

LoadedConfig load_experiment_config(const std::string& path, const std::vector<std::string>& overrides) {
  using namespace config;
  LoadedConfig loaded;
  ExperimentConfig& cfg = loaded.config;
  cfg.source_path = path;
  cfg.module_name = kModule;

  ConfigNode root = load_config_file(path, Origin{OriginKind::kDefault, "", 0, "experiment file"});
  for (const std::string& o : overrides) apply_override(root, o);
  read_top_level(root, cfg, loaded.entries);
  read_container_section(root, cfg.container, loaded.entries);
  read_slurm_section(root, cfg, loaded.entries);

  const ConfigNode& module = find_module(root);
  const ConfigNode* framework = module.find("framework");
  if (framework == nullptr || framework->kind == ConfigNode::Kind::kNull) {
    config_error(module.origin.with_path("modules.pre_trainer.framework"), "required (allowed: megatron)");
  }
  if (framework->kind != ConfigNode::Kind::kScalar || framework->text != "megatron") {
    config_error(framework->origin, fmt::format("{} is not supported yet; allowed: megatron", framework->kind_name()));
  }
  cfg.framework = framework->text;
  loaded.entries.push_back({"modules.pre_trainer.framework", cfg.framework, framework->origin.source()});

  ConfigNode preset_tree;
  const ConfigNode* preset = nullptr;
  const ConfigNode* model = module.find("model");
  if (model != nullptr && model->kind != ConfigNode::Kind::kNull) {
    if (model->kind != ConfigNode::Kind::kScalar || model->text.empty()) {
      config_error(model->origin, fmt::format("expected a model preset name or path, got {}", model->kind_name()));
    }
    preset_tree = load_config_file(find_model_preset(*model), model->origin);
    check_module_key_names(preset_tree);
    preset = &preset_tree;
    cfg.model.preset = model->text;
    loaded.entries.push_back({"modules.pre_trainer.model", yaml_string(model->text), model->origin.source()});
  }

  const ConfigNode* overrides_node = module.find("overrides");
  if (overrides_node != nullptr && overrides_node->kind == ConfigNode::Kind::kNull) overrides_node = nullptr;
  if (overrides_node != nullptr && overrides_node->kind != ConfigNode::Kind::kMap) {
    config_error(overrides_node->origin,
                 fmt::format("expected a map of module keys, got {}", overrides_node->kind_name()));
  }
  if (overrides_node != nullptr) check_module_key_names(*overrides_node);

  ModuleKeys keys = collect_module_keys(preset, overrides_node, module.origin);
  check_module_keys(keys, module.origin);
  resolve_module_keys(keys, cfg, loaded.entries);
  cfg.effective_yaml = render_effective_yaml(cfg, keys);
  return loaded;
}

}  // namespace primus
