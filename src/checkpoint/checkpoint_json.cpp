// Checked reads of a checkpoint's JSON files (checkpoint_json.h).
#include "checkpoint/checkpoint_json.h"

#include <utility>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

using json = nlohmann::json;

json read_json_object(const std::string& path) {
  const std::string text = read_file(path, FileKinds::kRegularOnly);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double's range
    throw RuntimeError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  if (!j.is_object()) throw RuntimeError(fmt::format("{}: expected a JSON object, found a {}", path, j.type_name()));
  return j;
}

JsonFields::JsonFields(const json& object, const std::string& file, std::string prefix)
    : object_(object), file_(file), prefix_(std::move(prefix)) {}

const json& JsonFields::required(const std::string& key) const {
  if (!object_.is_object()) {
    throw RuntimeError(fmt::format("{}: {} must be a JSON object, found {}", file_,
                                   prefix_.empty() ? "the top level" : prefix_.substr(0, prefix_.size() - 1),
                                   object_.type_name()));
  }
  const auto it = object_.find(key);
  if (it == object_.end()) fail(key, "is required but missing");
  return *it;
}

int64_t JsonFields::integer(const std::string& key, int64_t min, int64_t max, const std::string& why) const {
  const json& v = required(key);
  // is_number_integer is also true of a non-negative value nlohmann stores unsigned, which may exceed int64.
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    fail(key, fmt::format("must be a JSON integer that fits in 64 bits, found {}", v.dump()));
  }
  const int64_t value = v.get<int64_t>();
  if (value < min || value > max) {
    const std::string range = max == INT64_MAX ? fmt::format(">= {}", min) : fmt::format("in [{}, {}]", min, max);
    fail(key, fmt::format("is {}, expected {}{}", value, range, why.empty() ? "" : " (" + why + ")"));
  }
  return value;
}

std::string JsonFields::string(const std::string& key) const {
  const json& v = required(key);
  if (!v.is_string()) fail(key, fmt::format("must be a string, found {}", v.dump()));
  return v.get<std::string>();
}

const json& JsonFields::object(const std::string& key) const {
  const json& v = required(key);
  if (!v.is_object()) fail(key, fmt::format("must be a JSON object, found {}", v.type_name()));
  return v;
}

void JsonFields::fail(const std::string& key, const std::string& what) const {
  throw RuntimeError(fmt::format("{}: {}{} {}", file_, prefix_, key, what));
}

}  // namespace primus
