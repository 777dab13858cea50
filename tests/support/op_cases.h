// Every op's test case for the harness (support/op_harness.h). Adding an op means adding its case to
// op_cases.cpp (docs/add-an-op.md); the CPU and device test binaries pick it up from this list.
#pragma once

#include <vector>

#include "support/op_harness.h"

namespace primus::testing {

// Every case, in a fixed order, built once.
const std::vector<OpCase>& all_op_cases();

// The mixture-of-experts ops' cases (moe_op_cases.cpp), part of all_op_cases().
std::vector<OpCase> moe_op_cases();

// The fp8 quantisation ops' cases (fp8_op_cases.cpp), part of all_op_cases().
std::vector<OpCase> fp8_op_cases();

// The fp8 GEMM's cases (fp8_gemm_op_cases.cpp), part of fp8_op_cases().
std::vector<OpCase> fp8_gemm_op_cases();

}  // namespace primus::testing
