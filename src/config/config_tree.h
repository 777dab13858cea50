// The untyped config tree: YAML parsed into nodes that remember the file and line they were written on, so
// that after `extends` merging and command-line overrides every error and `config show` can name a source.
// Internal to the config layer.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primus::config {

enum class OriginKind { kDefault, kDerived, kFile, kCommandLine };

// Where a value was written. path is the key path inside its own document ("modules.pre_trainer.overrides.lr",
// "hidden_size" in a model preset) or the key as typed on the command line.
struct Origin {
  OriginKind kind = OriginKind::kDefault;
  std::string file;  // display path, for kFile
  int line = 0;      // 1-based, for kFile
  std::string path;

  // "default" | "derived" | "<file>:<line>" | "command line"
  std::string source() const;
  Origin with_path(std::string new_path) const;
};

// Throws UsageError "[config] <file>:<line>: <path>: <what>" (or "[config] command line: <path>: <what>").
[[noreturn]] void config_error(const Origin& where, const std::string& what);

struct ConfigNode {
  enum class Kind { kNull, kScalar, kList, kMap };

  Kind kind = Kind::kNull;
  std::string text;               // kScalar
  bool quoted = false;            // kScalar written quoted or tagged: a string even if it looks like a number
  std::vector<ConfigNode> items;  // kList
  std::vector<std::pair<std::string, ConfigNode>> fields;  // kMap, in file order
  Origin origin;                                           // for a map value: where its key was written

  // Out of line: clang (the fuzz build) instantiates the implicit ones while ConfigNode is still incomplete, and
  // std::pair<std::string, ConfigNode> then fails to compile.
  ConfigNode();
  ConfigNode(const ConfigNode&);
  ConfigNode(ConfigNode&&) noexcept;
  ConfigNode& operator=(const ConfigNode&);
  ConfigNode& operator=(ConfigNode&&) noexcept;
  ~ConfigNode();

  static ConfigNode map(const Origin& origin);
  const ConfigNode* find(std::string_view key) const;
  ConfigNode* find(std::string_view key);
  void erase(std::string_view key);
  ConfigNode& set(const std::string& key, ConfigNode value);  // replaces or appends
  std::string kind_name() const;                              // "a map", "a list", "null", "'abc'"
};

// Reads a YAML file into a tree: substitutes ${VAR} in scalars, then resolves `extends` (relative to the file,
// later entries win, the file's own body wins over all). The root must be a map (an empty file is an empty map).
// `included_from` is the origin of the reference to this file (the extends entry or model key), used when the
// file is missing. Each file of the extends tree is read once however many files extend it; a tree of more than
// 64 files, and YAML aliases that expand to more than 100,000 values, are refused naming file and line.
ConfigNode load_config_file(const std::filesystem::path& path, const Origin& included_from);

// Deep merge: maps merge key by key, everything else (lists, scalars, null) replaces.
void merge_into(ConfigNode& base, const ConfigNode& over);

// A command-line value: "[..]"/"{..}" and quoted text are parsed as YAML flow; "null"/"~" is null; an empty
// value is the empty string; anything else is a plain scalar taken verbatim. ${VAR} is substituted.
ConfigNode parse_override_value(const std::string& text, const Origin& origin);

// Replaces ${VAR} and ${VAR:default}; "$${" stands for a literal "${". Sets *substituted when anything was.
std::string substitute_env(const std::string& text, const Origin& where, bool* substituted);

// A path for messages: relative to the working directory when below it, else as is.
std::string display_path(const std::filesystem::path& path);

}  // namespace primus::config
