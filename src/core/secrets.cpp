#include "core/secrets.h"

#include <algorithm>
#include <cctype>

namespace primus {

bool is_secret_name(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (const char* mark : {"TOKEN", "KEY", "SECRET", "PASSWORD"}) {
    if (upper.find(mark) != std::string::npos) return true;
  }
  return false;
}

std::string shown_value(std::string_view name, const std::string& value) {
  return is_secret_name(name) ? kMaskedValue : value;
}

}  // namespace primus
