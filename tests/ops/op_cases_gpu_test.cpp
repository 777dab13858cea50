// Every op's case (support/op_cases.cpp) on the CUDA backend against the CPU backend on the same inputs, in f32 and
// bf16 (inputs rounded to bf16 first), forward and every gradient, at the case's sizes and its larger device sizes.
// One ctest test per case, dtype and size: Ops/OpCaseOnDevice.MatchesCpu/<case>_cuda_<dtype>_<size>. The tolerances
// are the case's (op_cases.cpp explains them). Without a usable CUDA device every test skips with the reason.
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "support/op_cases.h"
#include "support/op_harness.h"
#include "support/test_support.h"

namespace primus::testing {
namespace {

class OpCaseOnDevice : public ::testing::TestWithParam<OpTestParam> {
 protected:
  void SetUp() override {
    PRIMUS_SKIP_WITHOUT_GPU();
    ops::start_device(GetParam().device);
  }
};

TEST_P(OpCaseOnDevice, MatchesCpu) { check_against_cpu(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Ops, OpCaseOnDevice,
                         ::testing::ValuesIn(device_op_tests(all_op_cases(), Device{DeviceType::kCuda, 0})),
                         [](const ::testing::TestParamInfo<OpTestParam>& info) { return op_test_name(info.param); });

}  // namespace
}  // namespace primus::testing
