// Preflight's GPU inventory (through backend/cuda's device_info and NCCL's version; "built without CUDA" otherwise)
// and the perf checks of one device: a GEMM whose sampled outputs are checked against the host, and a
// device-to-device copy, timed with the backend's marks (CUDA events on a GPU, the host clock on the CPU).
#include <dirent.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "core/bf16.h"
#include "ops/ops.h"
#include "tools/preflight_checks.h"

#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "parallel/nccl/nccl_version.h"
#endif

namespace primus::preflight {

namespace fs = std::filesystem;

namespace {

#if PRIMUS_WITH_CUDA
// The parent pid of a process (field 4 of /proc/PID/stat, after the parenthesised name), or -1.
long parent_of(long pid) {
  const std::string stat = read_file_text(fmt::format("/proc/{}/stat", pid));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  char state = 0;
  long ppid = -1;
  if (std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) return -1;
  return ppid;
}

// Processes (other than this one and, in a launched job, its sibling ranks) holding /dev/nvidiaN open, by N.
// Only processes whose /proc/PID/fd this user may read are seen: the check says so.
std::map<int, std::vector<std::string>> gpu_holders() {
  std::map<int, std::vector<std::string>> holders;
  const long self = getpid();
  const char* launched = std::getenv("PRIMUS_LAUNCHED");
  const long parent = launched != nullptr && std::string(launched) == "1" ? getppid() : -2;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    const long pid = std::stol(name);
    if (pid == self || parent_of(pid) == parent) continue;
    std::set<int> minors;
    std::error_code fd_ec;
    for (const auto& fd : fs::directory_iterator(entry.path() / "fd", fd_ec)) {
      std::error_code link_ec;
      const std::string target = fs::read_symlink(fd.path(), link_ec).string();
      if (link_ec || !target.starts_with("/dev/nvidia")) continue;
      const std::string suffix = target.substr(11);
      if (!suffix.empty() && std::all_of(suffix.begin(), suffix.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        minors.insert(std::stoi(suffix));
      }
    }
    std::string comm = read_file_text(fmt::format("/proc/{}/comm", pid));
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    for (int minor : minors) holders[minor].push_back(fmt::format("{} ({})", pid, comm));
  }
  return holders;
}

// The /dev/nvidiaN minor of a GPU, from the driver's /proc entry for its PCI bus id; -1 when not listed.
int device_minor(const std::string& pci_bus_id) {
  const std::string text = read_file_text("/proc/driver/nvidia/gpus/" + pci_bus_id + "/information");
  const size_t at = text.find("Device Minor:");
  if (at == std::string::npos) return -1;
  return std::atoi(text.c_str() + at + 13);
}
#endif

// C = A · Bᵀ (A [n, n], B [n, n] so that row j of B is column j of Bᵀ), checked at sampled entries against a
// double-precision dot product of the same (rounded) inputs.
struct GemmResult {
  double tflops = 0.0;
  double worst_error = 0.0;  // |c - reference| / (||a_i|| ||b_j||), worst over the samples
};

// The row `row` of an [n, n] tensor on any device, as host floats (bf16 widened).
std::vector<float> host_row(const Tensor& t, int64_t n, int64_t row) {
  Tensor host = ops::to_device(t.slice_elements(row * n, {n}), kCpuDevice);
  std::vector<float> out(static_cast<size_t>(n));
  if (host.dtype() == DType::kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(host.data());
    for (int64_t k = 0; k < n; ++k) out[k] = bf16_to_f32(p[k]);
  } else {
    const float* p = static_cast<const float*>(host.data());
    std::copy(p, p + n, out.begin());
  }
  return out;
}

GemmResult run_gemm(Device device, DType dtype, int64_t n, int warmup, int iters) {
  Tensor a32 = ops::zeros({n, n}, DType::kF32, device), b32 = ops::zeros({n, n}, DType::kF32, device);
  ops::fill_normal(a32, 1234, 1.0);
  ops::fill_normal(b32, 5678, 1.0);
  Tensor a = a32, b = b32;
  if (dtype != DType::kF32) {
    a = ops::zeros({n, n}, dtype, device);
    b = ops::zeros({n, n}, dtype, device);
    ops::cast(a, a32);
    ops::cast(b, b32);
  }
  Tensor c = ops::zeros({n, n}, dtype, device);
  GemmArgs args;
  args.a = &a;
  args.b = &b;
  args.c = &c;
  args.trans_b = true;
  for (int i = 0; i < warmup; ++i) ops::gemm(args);
  // Poison the output before the timed (and checked) runs: a GEMM that writes nothing leaves NaNs.
  Tensor poison = ops::zeros({n, n}, DType::kF32, device);
  ops::fill(poison, std::nanf(""));
  if (dtype == DType::kF32) {
    ops::copy(c, poison);
  } else {
    ops::cast(c, poison);
  }
  poison = Tensor();
  Backend& backend = backend_for(device);
  ops::synchronize(device);
  std::unique_ptr<DeviceMark> start = backend.mark();
  for (int i = 0; i < iters; ++i) ops::gemm(args);
  std::unique_ptr<DeviceMark> stop = backend.mark();
  const double ms = backend.elapsed_ms(*start, *stop);
  ops::synchronize(device);
  GemmResult result;
  result.tflops = ms > 0 ? 2.0 * static_cast<double>(n) * n * n * iters / (ms * 1e-3) / 1e12 : 0.0;
  for (int s = 0; s < 8; ++s) {
    const int64_t i = (s * 7919 + 13) % n, j = (s * 104729 + 71) % n;
    const std::vector<float> ai = host_row(a, n, i), bj = host_row(b, n, j);
    const std::vector<float> ci = host_row(c, n, i);
    double ref = 0.0, na = 0.0, nb = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      ref += static_cast<double>(ai[k]) * bj[k];
      na += static_cast<double>(ai[k]) * ai[k];
      nb += static_cast<double>(bj[k]) * bj[k];
    }
    const double err = std::fabs(static_cast<double>(ci[j]) - ref) / std::max(std::sqrt(na * nb), 1e-30);
    result.worst_error = std::isfinite(err) ? std::max(result.worst_error, err) : INFINITY;
  }
  return result;
}

// GB/s (1e9 B/s) of a same-device copy of `bytes`, counted as read + write (2 x bytes a copy).
double run_copy(Device device, int64_t bytes, int warmup, int iters) {
  const int64_t elements = bytes / static_cast<int64_t>(sizeof(float));
  Tensor src = ops::zeros({elements}, DType::kF32, device), dst = ops::zeros({elements}, DType::kF32, device);
  ops::fill(src, 1.5f);
  for (int i = 0; i < warmup; ++i) ops::copy(dst, src);
  Backend& backend = backend_for(device);
  ops::synchronize(device);
  std::unique_ptr<DeviceMark> start = backend.mark();
  for (int i = 0; i < iters; ++i) ops::copy(dst, src);
  std::unique_ptr<DeviceMark> stop = backend.mark();
  const double ms = backend.elapsed_ms(*start, *stop);
  ops::synchronize(device);
  return ms > 0 ? 2.0 * static_cast<double>(elements) * sizeof(float) * iters / (ms * 1e-3) / 1e9 : 0.0;
}

CheckStatus against(double value, double minimum) {
  if (minimum <= 0) return CheckStatus::kInfo;
  return value >= minimum ? CheckStatus::kPass : CheckStatus::kFail;
}

}  // namespace

void add_gpu_inventory_checks(const PreflightOptions& options, Checks& out) {
#if PRIMUS_WITH_CUDA
  std::string why;
  const int count = cuda_device_count(&why);
  const bool too_few = options.expected_gpus > 0 && count < options.expected_gpus;
  if (count == 0) {
    out.push_back(make_check("gpu", "gpus", too_few ? CheckStatus::kFail : CheckStatus::kInfo,
                             fmt::format("no GPU: {}", why),
                             too_few ? fmt::format("expected {} (--expected-gpus)", options.expected_gpus)
                                     : "GPU checks skipped; the CPU is checked instead"));
  } else {
    out.push_back(make_check("gpu", "gpus", too_few ? CheckStatus::kFail : CheckStatus::kPass,
                             fmt::format("{} visible", count),
                             options.expected_gpus > 0 ? fmt::format("expected {}", options.expected_gpus) : ""));
  }
  const std::map<int, std::vector<std::string>> holders = count > 0 ? gpu_holders() : decltype(gpu_holders()){};
  for (int index = 0; index < count; ++index) {
    const std::string name = fmt::format("gpu {}", index);
    CudaDeviceInfo info;
    std::string failure;
    if (!cuda_device_info(index, &info, &failure)) {
      out.push_back(make_check("gpu", name, CheckStatus::kFail, "not usable", failure));
      continue;
    }
    PreflightCheck c = make_check(
        "gpu", name, CheckStatus::kPass,
        fmt::format("{}, sm_{}{}, {} SMs, {} free of {}, PCI {}", info.name, info.compute_major, info.compute_minor,
                    info.multiprocessors, format_gib(static_cast<double>(info.free_bytes)),
                    format_gib(static_cast<double>(info.total_bytes)), info.pci_bus_id));
    c.measured = static_cast<double>(info.free_bytes) / (1024.0 * 1024.0 * 1024.0);
    c.unit = "GiB";
    // Less than 90% free: something else holds memory on it (this process's context takes a few hundred MiB).
    if (info.free_bytes < info.total_bytes * 9 / 10) {
      c.status = CheckStatus::kWarn;
      c.detail = "under 90% of its memory is free: another process may be using it";
    }
    out.push_back(c);
    const int minor = device_minor(info.pci_bus_id);
    auto held = holders.find(minor);
    if (minor >= 0 && held != holders.end()) {
      out.push_back(make_check("gpu", name + " processes", CheckStatus::kWarn,
                               fmt::format("/dev/nvidia{} held by {}", minor, fmt::join(held->second, ", ")),
                               "other processes on this GPU slow the run or take its memory"));
    } else {
      out.push_back(make_check("gpu", name + " processes", CheckStatus::kPass,
                               minor >= 0 ? fmt::format("no other process holds /dev/nvidia{}", minor)
                                          : "no /proc/driver/nvidia entry for this GPU: holders not checked",
                               "processes of other users are seen only when run as root"));
    }
  }
  const CudaLibraryVersions v = cuda_library_versions();
  const NcclVersions nccl = nccl_versions();
  CheckStatus status = CheckStatus::kPass;
  std::string detail;
  if (v.driver == 0) {
    status = count == 0 ? CheckStatus::kInfo : CheckStatus::kFail;
    detail = "no CUDA driver";
  } else if (v.driver < v.runtime_build) {
    status = CheckStatus::kFail;
    detail = fmt::format("the driver supports CUDA up to {}, older than the {} this build needs",
                         format_cuda_version(v.driver), format_cuda_version(v.runtime_build));
  } else if (v.cudnn / 10000 != v.cudnn_build / 10000 || nccl.runtime / 10000 != nccl.build / 10000) {
    status = CheckStatus::kWarn;
    detail = "a loaded library's major version differs from the one built against";
  }
  out.push_back(make_check(
      "gpu", "versions", status,
      fmt::format("driver CUDA {}, runtime {} (built {}), cuDNN {} (built {}), NCCL {} (built {})",
                  v.driver == 0 ? "none" : format_cuda_version(v.driver), format_cuda_version(v.runtime),
                  format_cuda_version(v.runtime_build), format_cudnn_version(v.cudnn),
                  format_cudnn_version(v.cudnn_build), format_nccl_version(nccl.runtime),
                  format_nccl_version(nccl.build)),
      detail));
#else
  const bool expected = options.expected_gpus > 0;
  out.push_back(make_check("gpu", "gpus", expected ? CheckStatus::kFail : CheckStatus::kInfo,
                           "no GPU: this primus-cli was built without CUDA",
                           expected ? fmt::format("expected {} (--expected-gpus)", options.expected_gpus)
                                    : "GPU checks skipped; the CPU is checked instead"));
#endif
}

void add_device_perf_checks(const PreflightOptions& options, Device device, Checks& out) {
  const bool gpu = !device.is_cpu();
  GpuThresholds thresholds;
  std::string where = "cpu";
#if PRIMUS_WITH_CUDA
  if (gpu) {
    CudaDeviceInfo info;
    std::string why;
    if (cuda_device_info(device.index, &info, &why)) thresholds = gpu_thresholds(info.name);
    where = fmt::format("{} ({})", device.str(), info.name.empty() ? "unknown" : info.name);
  }
#endif
  auto rate_text = [](double tflops) {
    return tflops >= 1.0 ? fmt::format("{:.1f} TFLOP/s", tflops) : fmt::format("{:.1f} GFLOP/s", tflops * 1e3);
  };
  const double min_gemm = options.min_gemm_tflops >= 0 ? options.min_gemm_tflops : thresholds.min_gemm_tflops;
  const double min_copy = options.min_copy_gbps >= 0 ? options.min_copy_gbps : thresholds.min_copy_gbps;
  auto threshold_text = [&](double minimum, const char* unit, const char* flag) {
    if (minimum <= 0) return std::string(gpu ? "no threshold for this GPU (info)" : "on the CPU: info, no threshold");
    const bool given = (std::string(flag) == "--min-gemm-tflops" ? options.min_gemm_tflops : options.min_copy_gbps) >= 0;
    return fmt::format("at least {:g} {} ({})", minimum, unit,
                       given ? flag : fmt::format("{} ceiling x 0.75", thresholds.matched));
  };
  // A GPU: bf16 8192^3 as the ceiling was measured; the CPU: f32 1024^3 (OpenBLAS), a timing only.
  const int64_t n = gpu ? 8192 : 1024;
  const DType dtype = gpu ? DType::kBF16 : DType::kF32;
  const std::string gemm_name = fmt::format("gemm {} {}^3", dtype_name(dtype), n);
  guarded(out, "perf", gemm_name, [&] {
    const GemmResult r = run_gemm(device, dtype, n, gpu ? 5 : 1, gpu ? 20 : 3);
    // fp32 accumulation of exact products; a bf16 output rounds to 2^-9 relative.
    const double tolerance = gpu ? 1e-3 : 1e-5;
    if (!(r.worst_error <= tolerance)) {
      out.push_back(make_check("perf", gemm_name, CheckStatus::kFail, fmt::format("{} on {}", rate_text(r.tflops), where),
                               fmt::format("wrong results: sampled error {:.3g} of |a||b| (limit {:g})",
                                           r.worst_error, tolerance)));
      return;
    }
    PreflightCheck c = make_check("perf", gemm_name, against(r.tflops, min_gemm),
                                  fmt::format("{} on {}", rate_text(r.tflops), where),
                                  threshold_text(min_gemm, "TFLOP/s", "--min-gemm-tflops"));
    c.measured = r.tflops;
    c.unit = "TFLOP/s";
    out.push_back(c);
  });
  const int64_t copy_bytes = gpu ? int64_t{1} << 30 : int64_t{256} << 20;
  const std::string copy_name = fmt::format("memory copy {} MiB", copy_bytes >> 20);
  guarded(out, "perf", copy_name, [&] {
    const double gbps = run_copy(device, copy_bytes, gpu ? 5 : 1, gpu ? 20 : 3);
    PreflightCheck c = make_check("perf", copy_name, against(gbps, min_copy),
                                  fmt::format("{:.0f} GB/s (read + write) on {}", gbps, where),
                                  threshold_text(min_copy, "GB/s", "--min-copy-gbps"));
    c.measured = gbps;
    c.unit = "GB/s";
    out.push_back(c);
  });
}

}  // namespace primus::preflight

namespace primus {

GpuThresholds gpu_thresholds(const std::string& gpu_name) {
  constexpr double kMargin = 0.75;  // pass at 75% of the ceiling: clocks, power caps and neighbours vary
  GpuThresholds t;
  if (gpu_name.find("H200") != std::string::npos) {
    t.matched = "H200";
    t.min_gemm_tflops = kMargin * 790.0;
    t.min_copy_gbps = kMargin * 4260.0;
  } else if (gpu_name.find("H100") != std::string::npos && gpu_name.find("PCIe") == std::string::npos) {
    t.matched = "H100";
    t.min_gemm_tflops = kMargin * 790.0;
    t.min_copy_gbps = kMargin * 4260.0 * 3.35 / 4.8;
  }
  return t;
}

}  // namespace primus
