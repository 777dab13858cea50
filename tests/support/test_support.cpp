#include "support/test_support.h"

#include <execinfo.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "ops/ops.h"

#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace primus::testing {

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) {
    old_ = old;
    had_ = true;
  }
  ::setenv(name, value, 1);
}

ScopedEnv::~ScopedEnv() {
  if (had_) {
    ::setenv(name_.c_str(), old_.c_str(), 1);
  } else {
    ::unsetenv(name_.c_str());
  }
}

namespace {

// A test binary that dies of a signal prints the stack before dying, so a crash on the GPU machine (which has no
// debugger) names its function: resolve the addresses with `addr2line -Cfe TEST_BINARY ADDRESS` here. The
// sanitizers' own handlers report more, so they are left alone there.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_UNDEFINED__)
void print_stack_and_die(int signal_number) {
  const char header[] = "\n*** test process killed by a signal; stack:\n";
  (void)!write(STDERR_FILENO, header, sizeof header - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

const bool stack_printer_installed = [] {
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(s, print_stack_and_die);
  return true;
}();
#endif

}  // namespace

Tensor random_tensor(const Shape& shape, Rng& rng, float scale) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.normal()) * scale;
  return t;
}

Tensor random_ids(const Shape& shape, int64_t vocab, Rng& rng) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  int32_t* p = t.i32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return t;
}

double relative_error(const Tensor& a, const Tensor& b) {
  PRIMUS_CHECK(a.numel() == b.numel(), "relative_error: {} vs {}", a.describe(), b.describe());
  double diff = 0, ref = 0;
  const float* pa = a.f32();
  const float* pb = b.f32();
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = static_cast<double>(pa[i]) - pb[i];
    diff += d * d;
    ref += static_cast<double>(pb[i]) * pb[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  PRIMUS_CHECK(a.numel() == b.numel(), "max_abs_diff: {} vs {}", a.describe(), b.describe());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(a.f32()[i]) - b.f32()[i]));
  return m;
}

Tensor host_f32(const Tensor& t) {
  const Tensor h = ops::to_device(t, kCpuDevice);
  if (h.dtype() == DType::kF32) return h;
  Tensor f = Tensor::empty(h.shape(), DType::kF32);
  if (h.dtype() == DType::kI32) {  // indices, exact in f32 below 2^24
    for (int64_t i = 0; i < h.numel(); ++i) f.f32()[i] = static_cast<float>(h.i32()[i]);
    return f;
  }
  ops::cast(f, h);
  return f;
}

void expect_close(const std::string& what, const Tensor& got_any, const Tensor& want_any, double tol, double floor) {
  const Tensor got = host_f32(got_any), want = host_f32(want_any);
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.f32()[i];
    const double w = want.f32()[i];
    ASSERT_TRUE(std::isfinite(g)) << what << ": element " << i << " is " << g;
    diff += (g - w) * (g - w);
    ref += w * w;
  }
  const double err = std::sqrt(diff) / std::max(std::sqrt(ref), floor);
  std::printf("  %-70s rel err %.2e (tol %.0e)\n", what.c_str(), err, tol);
  EXPECT_LE(err, tol) << what;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = ops::to_device(a, kCpuDevice), hb = ops::to_device(b, kCpuDevice);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.data(), hb.data(), ha.nbytes()) == 0;
}

std::string shakespeare_path() {
  // PRIMUS_TEST_DATA_DIR: where test binaries built elsewhere (e.g. carried to the GPU machine) find the corpus.
  const char* dir = std::getenv("PRIMUS_TEST_DATA_DIR");
  return (dir != nullptr ? std::string(dir) : std::string(PRIMUS_TEST_SHARED_DIR) + "/data") + "/tinyshakespeare.txt";
}
std::string assets_dir() { return PRIMUS_TEST_ASSETS_DIR; }

namespace {
struct TempDirs {
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs g_temp_dirs;
}  // namespace

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  PRIMUS_CHECK(fd >= 0, "socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  PRIMUS_CHECK(ok, "no free loopback port");
  return ntohs(addr.sin_port);
}

std::string temp_dir(const std::string& label) {
  std::string pattern = (std::filesystem::temp_directory_path() / ("primus-" + label + "-XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  PRIMUS_CHECK(mkdtemp(buf.data()) != nullptr, "mkdtemp failed for {}", pattern);
  g_temp_dirs.dirs.emplace_back(buf.data());
  return buf.data();
}

std::string why_no_gpu() {
#if PRIMUS_WITH_CUDA
  std::string why;
  return cuda_device_count(&why) > 0 ? "" : "no CUDA device: " + why;
#else
  return "no CUDA device: this build has no CUDA backend (PRIMUS_CUDA=OFF or no CUDA compiler found)";
#endif
}

void GpuTest::SetUp() {
  const std::string why = why_no_gpu();
  if (!why.empty()) GTEST_SKIP() << why;
  ops::start_device(Device{DeviceType::kCuda, 0});
}

}  // namespace primus::testing
