// Parsing YAML files into ConfigNode trees (with file and line on every value), ${VAR} substitution,
// `extends` resolution and deep merging. yaml-cpp exceptions never leave this file: they become UsageError
// naming the file and line.
#include "config/config_tree.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace primus::config {

namespace fs = std::filesystem;

std::string Origin::source() const {
  switch (kind) {
    case OriginKind::kDefault:
      return "default";
    case OriginKind::kDerived:
      return "derived";
    case OriginKind::kFile:
      return fmt::format("{}:{}", file, line);
    case OriginKind::kCommandLine:
      return "command line";
  }
  return "default";
}

Origin Origin::with_path(std::string new_path) const {
  Origin o = *this;
  o.path = std::move(new_path);
  return o;
}

void config_error(const Origin& where, const std::string& what) {
  std::string place;
  if (where.kind == OriginKind::kFile) {
    place = fmt::format("{}:{}: ", where.file, where.line);
  } else if (where.kind == OriginKind::kCommandLine) {
    place = "command line: ";
  }
  if (!where.path.empty()) place += where.path + ": ";
  throw UsageError("[config] " + place + what);
}

ConfigNode::ConfigNode() = default;
ConfigNode::ConfigNode(const ConfigNode&) = default;
ConfigNode::ConfigNode(ConfigNode&&) noexcept = default;
ConfigNode& ConfigNode::operator=(const ConfigNode&) = default;
ConfigNode& ConfigNode::operator=(ConfigNode&&) noexcept = default;
ConfigNode::~ConfigNode() = default;

ConfigNode ConfigNode::map(const Origin& origin) {
  ConfigNode n;
  n.kind = Kind::kMap;
  n.origin = origin;
  return n;
}

const ConfigNode* ConfigNode::find(std::string_view key) const {
  for (const auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

ConfigNode* ConfigNode::find(std::string_view key) {
  for (auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ConfigNode::erase(std::string_view key) {
  std::erase_if(fields, [&](const auto& f) { return f.first == key; });
}

ConfigNode& ConfigNode::set(const std::string& key, ConfigNode value) {
  if (ConfigNode* existing = find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  fields.emplace_back(key, std::move(value));
  return fields.back().second;
}

std::string ConfigNode::kind_name() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kScalar:
      return quoted ? fmt::format("the string \"{}\"", text) : fmt::format("'{}'", text);
    case Kind::kList:
      return "a list";
    case Kind::kMap:
      return "a map";
  }
  return "null";
}

std::string display_path(const fs::path& path) {
  fs::path p = path.lexically_normal();
  std::error_code ec;
  fs::path cwd = fs::current_path(ec);
  if (!ec && p.is_absolute()) {
    fs::path rel = p.lexically_relative(cwd);
    if (!rel.empty() && *rel.begin() != "..") return rel.string();
  }
  return p.string();
}

std::string substitute_env(const std::string& text, const Origin& where, bool* substituted) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 3;
      continue;
    }
    if (text.compare(i, 2, "${") != 0) {
      out += text[i++];
      continue;
    }
    size_t close = text.find('}', i + 2);
    if (close == std::string::npos) config_error(where, fmt::format("unterminated '${{' in '{}'", text));
    std::string body = text.substr(i + 2, close - i - 2);
    size_t colon = body.find(':');
    std::string name = body.substr(0, colon);
    bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                 std::all_of(name.begin(), name.end(),
                             [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!valid) config_error(where, fmt::format("invalid variable name '{}' in '{}'", name, text));
    if (const char* value = std::getenv(name.c_str())) {
      out += value;
    } else if (colon != std::string::npos) {
      out += body.substr(colon + 1);
    } else {
      config_error(where, fmt::format("environment variable '{}' is not set (write ${{{}:default}} to give a default)",
                                      name, name));
    }
    if (substituted) *substituted = true;
    i = close + 1;
  }
  return out;
}

namespace {

std::string child_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

Origin file_origin(const std::string& file, const YAML::Mark& mark, const std::string& path) {
  return Origin{OriginKind::kFile, file, mark.line >= 0 ? mark.line + 1 : 1, path};
}

// yaml-cpp shares an anchored node among its aliases, so a few hundred bytes of aliases of aliases ("billion
// laughs") describe billions of values; converting them all would exhaust memory. Values beyond this many, reached
// again through an alias, are refused. Real configs reuse a block or a list a few times.
constexpr int64_t kMaxAliasValues = 100'000;

// One YAML document's conversion: the values seen so far by their position in the text (a position seen before
// means an alias reached it again).
struct Conversion {
  std::unordered_set<int> positions_seen;
  int64_t alias_values = 0;
};

// A key inside an anchor that names the anchor itself (`d: &d {k: *d}`) makes a cycle that the conversion would
// follow until the stack overflows; real configs nest a few levels.
constexpr int kMaxDepth = 64;

void count_value(Conversion& conversion, const YAML::Node& node, const Origin& origin) {
  if (conversion.positions_seen.insert(node.Mark().pos).second) return;
  if (++conversion.alias_values > kMaxAliasValues) {
    config_error(origin, fmt::format("YAML aliases expand to more than {} values (an alias bomb?); write the "
                                     "values out or reuse fewer",
                                     kMaxAliasValues));
  }
}

// yaml-cpp node -> ConfigNode. `origin` is where the node's key was written (or the node itself for list items).
ConfigNode convert(const YAML::Node& node, const Origin& origin, Conversion& conversion, int depth = 0) {
  if (depth > kMaxDepth) {
    config_error(origin, fmt::format("nested more than {} levels deep (an alias inside its own anchor?)", kMaxDepth));
  }
  count_value(conversion, node, origin);
  ConfigNode out;
  out.origin = origin;
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out.kind = ConfigNode::Kind::kNull;
      break;
    case YAML::NodeType::Scalar: {
      out.kind = ConfigNode::Kind::kScalar;
      out.quoted = node.Tag() != "?";
      out.text = node.Scalar();
      bool substituted = false;
      out.text = substitute_env(out.text, origin, &substituted);
      // A substituted value is typed by its content, so "${ITERS:4}" can fill an integer key.
      if (substituted) out.quoted = false;
      break;
    }
    case YAML::NodeType::Sequence: {
      out.kind = ConfigNode::Kind::kList;
      size_t index = 0;
      for (const YAML::Node& item : node) {
        Origin item_origin = origin.kind == OriginKind::kFile
                                 ? file_origin(origin.file, item.Mark(), fmt::format("{}[{}]", origin.path, index))
                                 : origin.with_path(fmt::format("{}[{}]", origin.path, index));
        out.items.push_back(convert(item, item_origin, conversion, depth + 1));
        ++index;
      }
      break;
    }
    case YAML::NodeType::Map: {
      out.kind = ConfigNode::Kind::kMap;
      // Key -> index in out.fields, for finding duplicates without a scan per key (quadratic in big maps).
      std::unordered_map<std::string, size_t> seen;
      for (const auto& pair : node) {
        YAML::Node key = pair.first;  // a copy: the iterator's pair is a temporary
        Origin key_origin =
            origin.kind == OriginKind::kFile ? file_origin(origin.file, key.Mark(), origin.path) : origin;
        if (!key.IsScalar()) config_error(key_origin, "keys must be plain names, not a list or map");
        std::string name = key.Scalar();
        key_origin.path = child_path(origin.path, name);
        auto [previous, inserted] = seen.try_emplace(name, out.fields.size());
        if (!inserted) {
          config_error(key_origin, fmt::format("duplicate key '{}' (first written at {})", name,
                                               out.fields[previous->second].second.origin.source()));
        }
        out.fields.emplace_back(name, convert(pair.second, key_origin, conversion, depth + 1));
      }
      break;
    }
  }
  return out;
}

// For messages: the absolute form of `path`, or `path` itself when there is none (fs::absolute throws for "").
std::string absolute_path(const fs::path& path) {
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  return ec ? path.string() : absolute.lexically_normal().string();
}

ConfigNode parse_file(const fs::path& path, const std::string& shown, const Origin& included_from) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    config_error(included_from, fmt::format("file '{}' not found (resolved to {})", shown, absolute_path(path)));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) config_error(included_from, fmt::format("cannot read '{}'", shown));
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    throw UsageError(
        fmt::format("[config] {}:{}: invalid YAML: {}", shown, e.mark.line >= 0 ? e.mark.line + 1 : 1, e.msg));
  }
  Origin root_origin{OriginKind::kFile, shown, 1, ""};
  try {
    Conversion conversion;
    ConfigNode tree = convert(root, root_origin, conversion);
    if (tree.kind == ConfigNode::Kind::kNull) return ConfigNode::map(root_origin);
    if (tree.kind != ConfigNode::Kind::kMap) {
      config_error(root_origin, fmt::format("expected a map of keys at the top level, got {}", tree.kind_name()));
    }
    return tree;
  } catch (const YAML::Exception& e) {
    throw UsageError(
        fmt::format("[config] {}:{}: invalid YAML: {}", shown, e.mark.line >= 0 ? e.mark.line + 1 : 1, e.msg));
  }
}

// At most this many distinct files in one extends tree (so also at most this deep): real configs use a handful.
constexpr size_t kMaxExtendsFiles = 64;

// One load_config_file call: the chain of files being resolved (for cycles) and every file resolved so far, so
// that a file reached along several paths (diamonds) is read and merged once, not once per path: with each
// level naming two files that extend the next, that is 2^depth loads.
struct ExtendsTree {
  std::vector<fs::path> chain;
  std::vector<std::string> shown_chain;
  std::map<fs::path, ConfigNode> resolved;
};

fs::path canonical_path(const fs::path& path) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(path, ec);
  return ec ? fs::path(absolute_path(path)) : canonical;
}

// The entries of `extends` as file-name nodes (none when absent).
std::vector<const ConfigNode*> extends_entries(const ConfigNode& body) {
  const ConfigNode* extends = body.find("extends");
  std::vector<const ConfigNode*> bases;
  if (extends == nullptr) return bases;
  if (extends->kind == ConfigNode::Kind::kScalar) {
    bases.push_back(extends);
  } else if (extends->kind == ConfigNode::Kind::kList) {
    for (const ConfigNode& item : extends->items) {
      if (item.kind != ConfigNode::Kind::kScalar) {
        config_error(item.origin, fmt::format("expected a file name, got {}", item.kind_name()));
      }
      bases.push_back(&item);
    }
  } else if (extends->kind == ConfigNode::Kind::kMap) {
    config_error(extends->origin, "expected a file name or a list of file names, got a map");
  }
  return bases;
}

const ConfigNode& load_in_tree(const fs::path& path, const Origin& included_from, ExtendsTree& tree) {
  if (path.empty()) config_error(included_from, "the file name is empty");
  std::string shown = display_path(path);
  fs::path canonical = canonical_path(path);
  if (std::find(tree.chain.begin(), tree.chain.end(), canonical) != tree.chain.end()) {
    std::string cycle;
    for (const std::string& s : tree.shown_chain) cycle += s + " -> ";
    config_error(included_from, fmt::format("extends cycle: {}{}", cycle, shown));
  }
  if (auto done = tree.resolved.find(canonical); done != tree.resolved.end()) return done->second;
  if (tree.resolved.size() + tree.chain.size() >= kMaxExtendsFiles) {
    config_error(included_from, fmt::format("more than {} files in one extends tree", kMaxExtendsFiles));
  }

  ConfigNode body = parse_file(path, shown, included_from);
  std::vector<const ConfigNode*> bases = extends_entries(body);
  tree.chain.push_back(canonical);
  tree.shown_chain.push_back(shown);
  ConfigNode merged = ConfigNode::map(body.origin);
  for (const ConfigNode* base : bases) {
    fs::path base_path = fs::path(base->text).is_absolute() ? fs::path(base->text) : path.parent_path() / base->text;
    std::error_code ec;
    if (!fs::is_regular_file(base_path, ec)) {
      config_error(base->origin,
                   fmt::format("file '{}' not found (resolved to {})", base->text, absolute_path(base_path)));
    }
    merge_into(merged, load_in_tree(base_path, base->origin, tree));
  }
  tree.chain.pop_back();
  tree.shown_chain.pop_back();

  body.erase("extends");
  merge_into(merged, body);
  return tree.resolved.emplace(canonical, std::move(merged)).first->second;
}

}  // namespace

ConfigNode load_config_file(const fs::path& path, const Origin& included_from) {
  ExtendsTree tree;
  return load_in_tree(path, included_from, tree);
}

void merge_into(ConfigNode& base, const ConfigNode& over) {
  if (base.kind != ConfigNode::Kind::kMap || over.kind != ConfigNode::Kind::kMap) {
    base = over;
    return;
  }
  // Key -> index in base.fields: a find per key would make merging big maps quadratic.
  std::unordered_map<std::string, size_t> index;
  index.reserve(base.fields.size());
  for (size_t i = 0; i < base.fields.size(); ++i) index.emplace(base.fields[i].first, i);
  for (const auto& [key, value] : over.fields) {
    auto [existing, inserted] = index.try_emplace(key, base.fields.size());
    if (inserted) {
      base.fields.emplace_back(key, value);
    } else {
      merge_into(base.fields[existing->second].second, value);
    }
  }
}

ConfigNode parse_override_value(const std::string& text, const Origin& origin) {
  ConfigNode out;
  out.origin = origin;
  if (text.empty()) {
    out.kind = ConfigNode::Kind::kScalar;
    out.quoted = true;
    return out;
  }
  if (text == "null" || text == "~") return out;
  char first = text.front();
  if (first == '[' || first == '{' || first == '"' || first == '\'') {
    try {
      Conversion conversion;
      return convert(YAML::Load(text), origin, conversion);
    } catch (const YAML::Exception& e) {
      config_error(origin, fmt::format("invalid YAML value '{}': {}", text, e.msg));
    }
  }
  out.kind = ConfigNode::Kind::kScalar;
  bool substituted = false;
  out.text = substitute_env(text, origin, &substituted);
  return out;
}

}  // namespace primus::config
