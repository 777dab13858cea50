// The module-key schema: every key a trainer module accepts is declared once in schema.cpp with its type,
// default, limits, help text and the ExperimentConfig field it fills. Also the typed value of a key and the
// conversions between YAML text and typed values. Internal to the config layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config_tree.h"
#include "config/experiment.h"

namespace primus::config {

enum class KeyType { kBool, kInt, kFloat, kString, kStringList };
enum class KeyGroup { kModel, kTraining };

// kDefault: default_yaml applies when absent. kRequired: absent is an error. kOptional: absent means "none"
// (the loader derives a value or the consumer treats it as unset).
enum class Presence { kDefault, kRequired, kOptional };

// A parsed value. is_set is false for an absent optional key or an explicit null.
struct TypedValue {
  bool is_set = false;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<std::string> list;
};

struct KeySpec {
  const char* name = "";
  KeyType type = KeyType::kString;
  KeyGroup group = KeyGroup::kTraining;
  Presence presence = Presence::kDefault;
  const char* default_yaml = "";  // YAML text of the default, parsed like user input (kDefault only)
  std::optional<double> min = std::nullopt;
  std::optional<double> max = std::nullopt;
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::vector<std::string> choices = {};  // allowed values of string and bool keys; empty: anything
  const char* why = "";                   // why a limit exists; appended to range and choice errors
  const char* help = "";
  std::vector<std::string> aliases = {};  // the same option's name elsewhere (HF, torchtitan); only for did-you-mean
  void (*apply)(const TypedValue&, ExperimentConfig&) = nullptr;  // stores a set value in its field
  std::string (*check)(const TypedValue&) = nullptr;              // format check: an error text or ""
};

// Every module key, model keys first, in a stable order (the order of `config show` and the reference).
const std::vector<KeySpec>& module_key_specs();
const KeySpec* find_key_spec(std::string_view name);

// The top-level keys of an experiment file and the keys of a module, for validation and suggestions.
const std::vector<std::string>& top_level_keys();
const std::vector<std::string>& module_section_keys();

// " (did you mean 'x'?)" when a candidate is close to `key` by edit distance, else "".
std::string did_you_mean(std::string_view key, const std::vector<std::string>& candidates);
// The same over module keys, also matching their aliases ("learning_rate" suggests 'lr').
std::string did_you_mean_module_key(std::string_view key);

const char* type_name(KeyType type);
const char* group_name(KeyGroup group);

// Types a node against a spec and checks range, choices and format; errors name the node's origin.
// A null node gives the default (or an unset value).
TypedValue type_value(const KeySpec& spec, const ConfigNode& node);
TypedValue default_value(const KeySpec& spec);

// YAML text of a value ("null" when unset), readable and loading back to the same value.
std::string format_value(const KeySpec& spec, const TypedValue& value);
// A string as a YAML scalar: plain when unambiguous, else double-quoted; "${" is written as "$${".
std::string yaml_string(const std::string& text);
// "[0, 1)", ">= 1", "rope | yarn" or "" for the reference and error messages.
std::string describe_limits(const KeySpec& spec);

// One effective module key: its spec, value, and where the value came from.
struct ModuleKey {
  const KeySpec* spec;
  TypedValue value;
  Origin origin;
};

}  // namespace primus::config
