// Every op's case (support/op_cases.cpp) on the CPU backend, the numerical spec: forward and gradients against the
// case's double-precision reference, and every gradient against central finite differences, at every size of the
// case. One ctest test per case and size: Ops/OpCaseOnCpu.MatchesReferenceAndFiniteDifferences/<case>_cpu_f32_<size>.
#include <gtest/gtest.h>

#include "support/op_cases.h"
#include "support/op_harness.h"

namespace primus::testing {
namespace {

class OpCaseOnCpu : public ::testing::TestWithParam<OpTestParam> {};

TEST_P(OpCaseOnCpu, MatchesReferenceAndFiniteDifferences) {
  check_against_reference(GetParam());
  check_finite_differences(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ops, OpCaseOnCpu, ::testing::ValuesIn(cpu_op_tests(all_op_cases())),
                         [](const ::testing::TestParamInfo<OpTestParam>& info) { return op_test_name(info.param); });

}  // namespace
}  // namespace primus::testing
