// What this binary is: its version and the CUDA, cuDNN and NCCL versions it was built against, for
// `primus-cli --version` and the preflight reports.
#pragma once

#include <string>

namespace primus {

// "primus-cli 0.1.0 (built with CUDA 13.0, cuDNN 9.19.0, NCCL 2.28.9)" or "primus-cli 0.1.0 (built without CUDA)".
std::string version_text();

}  // namespace primus
