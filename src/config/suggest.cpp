// Did-you-mean suggestions for unknown keys: the closest known name by edit distance, also matching the names
// other frameworks use for the same option (the schema's aliases).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "config/schema.h"

namespace primus::config {

namespace {

// Optimal-string-alignment distance: edits plus adjacent transpositions, case-insensitive.
size_t edit_distance(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Closest of (candidate, suggestion) pairs within a distance that grows with the key's length.
std::string closest(std::string_view key, const std::vector<std::pair<std::string, std::string>>& candidates) {
  size_t limit = key.size() <= 3 ? 1 : key.size() <= 8 ? 2 : 3;
  size_t best = limit + 1;
  std::string suggestion;
  for (const auto& [candidate, suggest] : candidates) {
    size_t d = edit_distance(key, candidate);
    if (d < best) {
      best = d;
      suggestion = suggest;
    }
  }
  return suggestion.empty() ? "" : fmt::format(" (did you mean '{}'?)", suggestion);
}

}  // namespace

std::string did_you_mean(std::string_view key, const std::vector<std::string>& candidates) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const std::string& c : candidates) pairs.emplace_back(c, c);
  return closest(key, pairs);
}

std::string did_you_mean_module_key(std::string_view key) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const KeySpec& spec : module_key_specs()) {
    pairs.emplace_back(spec.name, spec.name);
    for (const std::string& alias : spec.aliases) pairs.emplace_back(alias, spec.name);
  }
  return closest(key, pairs);
}

}  // namespace primus::config
