#include "core/error.h"

namespace primus {

void throw_check_failure(const char* expr, const char* file, int line, const std::string& message) {
  throw RuntimeError(fmt::format("{} (check `{}` failed at {}:{})", message, expr, file, line));
}

}  // namespace primus
