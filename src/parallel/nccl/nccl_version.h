// NCCL's version: the one the build's nccl.h declares and the one of the library loaded now, for
// `primus-cli preflight` and `primus-cli --version`. Plain C++ (no NCCL header); CUDA builds only.
#pragma once

#include <string>

namespace primus {

struct NcclVersions {
  int build = 0;    // NCCL_VERSION_CODE: 22803 = 2.28.3
  int runtime = 0;  // ncclGetVersion; 0 when it failed
};

NcclVersions nccl_versions();
// "2.28.3" from 22803 (and from the pre-2.9 encoding 2708 = 2.7.8); "unknown" for 0.
std::string format_nccl_version(int code);

}  // namespace primus
