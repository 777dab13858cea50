// Shared helpers for tests: fresh random tensors, comparisons, paths to test data.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "core/rng.h"
#include "core/tensor.h"

namespace primus::testing {

// A tensor of N(0, scale²) values from a generator seeded per test; never zeros.
Tensor random_tensor(const Shape& shape, Rng& rng, float scale = 1.0f);
// Random token ids in [0, vocab).
Tensor random_ids(const Shape& shape, int64_t vocab, Rng& rng);
// ||a - b|| / max(||b||, tiny): the relative error of a whole tensor.
double relative_error(const Tensor& a, const Tensor& b);
// max |a - b|
double max_abs_diff(const Tensor& a, const Tensor& b);
// A copy on the host in f32, from any device (bf16 widened, i32 indices converted).
Tensor host_f32(const Tensor& t);
// ||got − want|| / max(||want||, floor) ≤ tol (gtest expectation), both on any device and in any float dtype, every
// element finite; prints the error. A floor makes the check absolute for values that are zero in exact arithmetic.
void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double tol, double floor = 1e-30);
// Same bytes, wherever the tensors live.
bool same_bits(const Tensor& a, const Tensor& b);
// ../shared/data/tinyshakespeare.txt (the corpus shipped beside the checkout), or $PRIMUS_TEST_DATA_DIR/...
std::string shakespeare_path();
std::string assets_dir();
// A fresh empty directory under the system temp dir, removed at process exit.
std::string temp_dir(const std::string& label);
// A loopback TCP port nobody listens on now (the kernel's pick for port 0), for one test job's MASTER_PORT.
int free_port();
// Empty when a CUDA GPU is usable, else why not (GPU tests skip with it).
std::string why_no_gpu();

// Fixture of the GPU op tests: skips, saying why, where there is no GPU, else starts device 0 (its allocator exists
// only once the backend has started).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// Sets an environment variable for its lifetime, then restores it (or unsets it if it was not set).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// The message of the E that f throws; a test failure when it throws nothing or something else.
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another kind of error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

}  // namespace primus::testing

// Skips the current test when no GPU is usable; GTEST_SKIP must run in the test body (or SetUp) itself.
#define PRIMUS_SKIP_WITHOUT_GPU()                                                                  \
  if (const std::string primus_no_gpu = ::primus::testing::why_no_gpu(); !primus_no_gpu.empty()) { \
    GTEST_SKIP() << primus_no_gpu;                                                                 \
  }
