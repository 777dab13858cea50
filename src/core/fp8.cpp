// Names of the fp8 formats (core/fp8.h), as configs and docs spell them.
#include "core/fp8.h"

#include <fmt/format.h>

#include "core/error.h"

namespace primus {

const char* fp8_format_name(Fp8Format format) {
  switch (format) {
    case Fp8Format::kE4M3: return "e4m3";
    case Fp8Format::kE5M2: return "e5m2";
    case Fp8Format::kE4M3Fnuz: return "e4m3fnuz";
    case Fp8Format::kE5M2Fnuz: return "e5m2fnuz";
  }
  return "?";
}

Fp8Format fp8_format_from_name(std::string_view name) {
  for (Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2, Fp8Format::kE4M3Fnuz, Fp8Format::kE5M2Fnuz}) {
    if (name == fp8_format_name(format)) return format;
  }
  throw UsageError(fmt::format("unknown fp8 format '{}' (e4m3, e5m2, e4m3fnuz or e5m2fnuz)", name));
}

}  // namespace primus
