// Command-line overrides in the forms Primus users type (key=value, --key=value, --key value, --flag),
// normalised to "key=value" for the config loader, which parses and validates the values.
#include <fmt/format.h>

#include "cli/cli.h"

namespace primus::cli {
namespace {

// After "--key", the next word is its value unless it is another option or a key=value override.
bool is_option_value(const std::string& word) { return !word.starts_with("--") && word.find('=') == std::string::npos; }

}  // namespace

std::vector<std::string> normalize_overrides(const std::vector<std::string>& args) {
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word.starts_with("--")) {
      std::string body = word.substr(2);
      if (body.empty() || body.starts_with("=")) throw UsageError(fmt::format("override '{}' has no key", word));
      if (body.find('=') != std::string::npos) {
        overrides.push_back(body);
      } else if (i + 1 < args.size() && is_option_value(args[i + 1])) {
        overrides.push_back(body + "=" + args[++i]);
      } else {
        overrides.push_back(body + "=true");
      }
      continue;
    }
    if (word.starts_with("-")) {
      throw UsageError(fmt::format("unknown option '{}' (overrides are key=value or --key=value)", word));
    }
    size_t equals = word.find('=');
    if (equals == std::string::npos || equals == 0) {
      throw UsageError(fmt::format("unexpected argument '{}' (overrides are key=value or --key=value)", word));
    }
    overrides.push_back(word);
  }
  return overrides;
}

}  // namespace primus::cli
