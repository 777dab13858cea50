// nccl_versions through nccl.h.
#include "parallel/nccl/nccl_version.h"

#include <fmt/format.h>
#include <nccl.h>

namespace primus {

NcclVersions nccl_versions() {
  NcclVersions v;
  v.build = NCCL_VERSION_CODE;
  int runtime = 0;
  if (ncclGetVersion(&runtime) == ncclSuccess) v.runtime = runtime;
  return v;
}

std::string format_nccl_version(int code) {
  if (code <= 0) return "unknown";
  if (code < 10000) return fmt::format("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
}

}  // namespace primus
