// Typing of config values: YAML scalars to bool/int/float/string/string_list by the schema, limit checks,
// and the reverse (values back to YAML text that loads to the same value). Numbers are parsed from the
// scalar text, so "1e-4" and "3.0e-4" are floats even though YAML 1.2 would call them strings.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "config/schema.h"

namespace primus::config {

namespace {

// The text of a scalar node for a non-string key; lists, maps and quoted strings are type errors.
const std::string& number_text(const ConfigNode& node, const char* expected) {
  if (node.kind != ConfigNode::Kind::kScalar)
    config_error(node.origin, fmt::format("expected {}, got {}", expected, node.kind_name()));
  if (node.quoted) {
    config_error(node.origin,
                 fmt::format("expected {}, got the string \"{}\" (write it without quotes)", expected, node.text));
  }
  return node.text;
}

bool is_digits(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

int64_t parse_int(const ConfigNode& node) {
  const std::string& text = number_text(node, "an integer");
  std::string_view digits = text;
  if (!digits.empty() && (digits.front() == '+' || digits.front() == '-')) digits.remove_prefix(1);
  if (!is_digits(digits)) config_error(node.origin, fmt::format("expected an integer, got '{}'", text));
  int64_t value = 0;
  std::string_view body = text.front() == '+' ? std::string_view(text).substr(1) : std::string_view(text);
  auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value);
  if (ec != std::errc() || end != body.data() + body.size()) {
    config_error(node.origin, fmt::format("'{}' does not fit in a 64-bit integer", text));
  }
  return value;
}

// Decimal numbers only: [+-] digits [. digits] [e [+-] digits], or .digits; no hex, inf or nan.
bool is_decimal_number(std::string_view s) {
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) s.remove_prefix(1);
  size_t e = s.find_first_of("eE");
  std::string_view mantissa = s.substr(0, e);
  size_t dot = mantissa.find('.');
  std::string_view whole = mantissa.substr(0, dot);
  std::string_view frac = dot == std::string_view::npos ? std::string_view() : mantissa.substr(dot + 1);
  bool ok_mantissa =
      (is_digits(whole) || whole.empty()) && (is_digits(frac) || frac.empty()) && (!whole.empty() || !frac.empty());
  if (!ok_mantissa) return false;
  if (e == std::string_view::npos) return true;
  std::string_view exponent = s.substr(e + 1);
  if (!exponent.empty() && (exponent.front() == '+' || exponent.front() == '-')) exponent.remove_prefix(1);
  return is_digits(exponent);
}

double parse_float(const ConfigNode& node) {
  const std::string& text = number_text(node, "a number");
  if (!is_decimal_number(text)) config_error(node.origin, fmt::format("expected a number, got '{}'", text));
  std::string_view body = text.front() == '+' ? std::string_view(text).substr(1) : std::string_view(text);
  double value = 0;
  auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value);
  if (ec != std::errc() || end != body.data() + body.size() || !std::isfinite(value)) {
    config_error(node.origin, fmt::format("'{}' is out of the range of a double", text));
  }
  return value;
}

bool parse_bool(const ConfigNode& node) {
  const std::string& text = number_text(node, "true or false");
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  config_error(node.origin, fmt::format("expected true or false, got '{}'", text));
}

std::string string_text(const ConfigNode& node) {
  if (node.kind != ConfigNode::Kind::kScalar)
    config_error(node.origin, fmt::format("expected a string, got {}", node.kind_name()));
  return node.text;
}

// Shortest text that reads back to the same double, always with a '.' in the mantissa ("1.0e-05", "8.0") so
// that YAML 1.1 readers such as PyYAML also see a float.
std::string number_string(double v) {
  std::string s = fmt::format("{}", v);
  size_t e = s.find_first_of("eE");
  if (s.substr(0, e).find('.') == std::string::npos) s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

void check_limits(const KeySpec& spec, const TypedValue& v, const Origin& where) {
  std::string why = *spec.why ? fmt::format(" ({})", spec.why) : "";
  if (spec.type == KeyType::kInt || spec.type == KeyType::kFloat) {
    double x = spec.type == KeyType::kInt ? static_cast<double>(v.i) : v.f;
    bool low = spec.min && (spec.min_exclusive ? x <= *spec.min : x < *spec.min);
    bool high = spec.max && (spec.max_exclusive ? x >= *spec.max : x > *spec.max);
    if (low || high) {
      config_error(where,
                   fmt::format("{} is out of range; allowed: {}{}", format_value(spec, v), describe_limits(spec), why));
    }
  }
  if (!spec.choices.empty()) {
    std::string text = spec.type == KeyType::kBool ? (v.b ? "true" : "false") : v.s;
    if (std::find(spec.choices.begin(), spec.choices.end(), text) == spec.choices.end()) {
      config_error(where, fmt::format("'{}' is not allowed; allowed: {}{}", text, describe_limits(spec), why));
    }
  }
  if (spec.check) {
    std::string problem = spec.check(v);
    if (!problem.empty()) config_error(where, problem);
  }
}

bool looks_special(const std::string& s) {
  static const char* kReserved[] = {"true", "True", "TRUE", "false", "False", "FALSE", "null", "Null",
                                    "NULL", "yes",  "no",   "on",    "off",   "y",     "n",    "~"};
  for (const char* r : kReserved) {
    if (s == r) return true;
  }
  return is_decimal_number(s);
}

}  // namespace

TypedValue type_value(const KeySpec& spec, const ConfigNode& node) {
  if (node.kind == ConfigNode::Kind::kNull) return default_value(spec);
  TypedValue v;
  v.is_set = true;
  switch (spec.type) {
    case KeyType::kBool:
      v.b = parse_bool(node);
      break;
    case KeyType::kInt:
      v.i = parse_int(node);
      break;
    case KeyType::kFloat:
      v.f = parse_float(node);
      break;
    case KeyType::kString:
      v.s = string_text(node);
      break;
    case KeyType::kStringList:
      if (node.kind == ConfigNode::Kind::kScalar) {
        v.list.push_back(node.text);
      } else if (node.kind == ConfigNode::Kind::kList) {
        for (const ConfigNode& item : node.items) v.list.push_back(string_text(item));
      } else {
        config_error(node.origin, fmt::format("expected a list of strings, got {}", node.kind_name()));
      }
      break;
  }
  check_limits(spec, v, node.origin);
  return v;
}

TypedValue default_value(const KeySpec& spec) {
  if (spec.presence != Presence::kDefault) return TypedValue{};
  Origin origin{OriginKind::kDefault, "", 0, std::string("default of ") + spec.name};
  return type_value(spec, parse_override_value(spec.default_yaml, origin));
}

std::string yaml_string(const std::string& text) {
  bool plain =
      !text.empty() && !looks_special(text) && text.find("${") == std::string::npos &&
      (std::isalnum(static_cast<unsigned char>(text.front())) || text.front() == '_' || text.front() == '.' ||
       text.front() == '/') &&
      std::all_of(text.begin(), text.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' || c == '-' || c == '+';
      });
  if (plain) return text;
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else if (c == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      out += "$$";  // a literal "${" must not be substituted when the file is loaded again
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string format_value(const KeySpec& spec, const TypedValue& value) {
  if (!value.is_set) return "null";
  switch (spec.type) {
    case KeyType::kBool:
      return value.b ? "true" : "false";
    case KeyType::kInt:
      return std::to_string(value.i);
    case KeyType::kFloat:
      return number_string(value.f);
    case KeyType::kString:
      return yaml_string(value.s);
    case KeyType::kStringList: {
      std::string out = "[";
      for (size_t i = 0; i < value.list.size(); ++i) out += (i ? ", " : "") + yaml_string(value.list[i]);
      return out + "]";
    }
  }
  return "null";
}

std::string describe_limits(const KeySpec& spec) {
  if (!spec.choices.empty()) {
    std::string out;
    for (const std::string& c : spec.choices) out += (out.empty() ? "" : " | ") + c;
    return out;
  }
  auto num = [](double x) { return fmt::format("{}", x); };
  if (spec.min && spec.max) {
    if (*spec.min == *spec.max) return num(*spec.min) + " only";
    return fmt::format("{}{}, {}{}", spec.min_exclusive ? "(" : "[", num(*spec.min), num(*spec.max),
                       spec.max_exclusive ? ")" : "]");
  }
  if (spec.min) return fmt::format("{} {}", spec.min_exclusive ? ">" : ">=", num(*spec.min));
  if (spec.max) return fmt::format("{} {}", spec.max_exclusive ? "<" : "<=", num(*spec.max));
  return "";
}

}  // namespace primus::config
