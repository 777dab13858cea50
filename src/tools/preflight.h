// `primus-cli preflight`: checks that a node (or every node of a job) is fit for a long training run, as
// AMD Primus's preflight does. Every rank runs it (a world of one without torchrun's variables):
//   host     CPU model and cores, memory, NUMA nodes, kernel, open-file and locked-memory limits, free disk in the
//            workspace (one rank per node: LOCAL_RANK 0)
//   gpu      count, model, free memory, processes holding each GPU, driver/runtime/NCCL/cuDNN versions (LOCAL_RANK 0)
//   network  NCCL_SOCKET_IFNAME names interfaces that exist (getifaddrs); NCCL_IB_HCA names devices under
//            /sys/class/infiniband (LOCAL_RANK 0)
//   perf     a GEMM (values checked against the host) and a device-to-device copy on the rank's device, against
//            thresholds for the detected GPU (H100, H200); on the CPU the timings are info, not pass/fail
//   comm     with several ranks: an all-reduce over the world communicator and its bus bandwidth (comm_benchmark)
// Each check is pass, info, warn or fail; the run passes when no check fails. Rank 0 gathers every rank's checks,
// prints the table and writes the reports. A check that throws becomes a failed check naming the error, so a broken
// GPU or driver is reported rather than crashing the run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/communicator.h"

namespace primus {

enum class CheckStatus { kPass, kInfo, kWarn, kFail };
const char* check_status_name(CheckStatus status);  // "pass", "info", "warn", "fail"

struct PreflightCheck {
  std::string group;  // host, gpu, network, perf, comm
  std::string name;   // e.g. "cpu", "free disk", "gemm bf16 8192^3"
  CheckStatus status = CheckStatus::kInfo;
  std::string value;   // what was found, for people: "Intel Xeon ... (16 cores)"
  std::string detail;  // the threshold or why it failed; may be empty
  double measured = 0.0;      // the number behind value where there is one (TFLOP/s, GB/s, GiB), else 0
  std::string unit;           // its unit ("TFLOP/s", "GB/s", "GiB"); empty when there is no number
  int rank = 0;               // the rank that ran it
  std::string host;           // that rank's host name
};

struct PreflightOptions {
  std::string workspace = ".";      // the free-disk check's directory (the run directory's parent)
  double min_free_disk_gib = 1.0;   // below this the disk check fails
  double min_memlock_gib = 0.0;     // locked-memory limit below this warns (0: warn only when not unlimited)
  int64_t min_open_files = 1024;    // open-file limit below this warns
  int expected_gpus = -1;           // > 0: fewer visible GPUs fails; -1: any count
  std::string device = "auto";      // cpu, cuda or auto (the GPU LOCAL_RANK where there is one)
  double min_gemm_tflops = -1.0;    // < 0: the detected GPU's threshold (none on the CPU)
  double min_copy_gbps = -1.0;      // < 0: the detected GPU's threshold (none on the CPU)
  double min_allreduce_busbw_gbps = -1.0;  // < 0: the bus bandwidth is info
  int64_t allreduce_bytes = int64_t{64} << 20;
  DistributedTimeout timeout = std::chrono::minutes(5);
};

// Thresholds for a GPU, from the ceilings measured on the H200 (790 TFLOP/s bf16 GEMM 8192^3, 4.26 TB/s
// device-to-device copy counted as read + write; docs/cli.md has the table) with a 25% margin; the H100 (SXM, same
// compute, 3.35 of the H200's 4.8 TB/s) scaled. Zero for a GPU without a table entry: its numbers are info.
struct GpuThresholds {
  std::string matched;  // the table row ("H200", "H100"), empty when none
  double min_gemm_tflops = 0.0;
  double min_copy_gbps = 0.0;
};
GpuThresholds gpu_thresholds(const std::string& gpu_name);

struct PreflightReport {
  std::vector<PreflightCheck> checks;  // every rank's, in rank order
  int world_size = 1;
  std::string started_utc;  // ISO 8601
  std::string version;      // primus-cli version and build line
  bool passed() const;      // no check failed
  int count(CheckStatus status) const;
};

// Runs every check on this rank; with several ranks (torchrun's variables), also the rendezvous, the all-reduce
// and the gathering of checks to every rank. Collective: every rank calls it with the same options. Throws
// UsageError for bad options or environment, RuntimeError when the ranks cannot meet within options.timeout.
PreflightReport run_preflight(const PreflightOptions& options);

// The console table: one line a check, then a summary line ("preflight: PASS (12 pass, 3 info)" / FAIL).
std::string format_preflight_table(const PreflightReport& report);
std::string preflight_markdown(const PreflightReport& report);
// {"version", "started_utc", "world_size", "result": "pass"|"fail", "counts": {...},
//  "checks": [{"group", "name", "status", "value", "detail", "measured", "unit", "rank", "host"}]}
nlohmann::json preflight_json(const PreflightReport& report);
// Writes DIR/preflight.md and DIR/preflight.json (DIR created); throws UsageError naming DIR when it cannot.
void write_preflight_reports(const PreflightReport& report, const std::string& dir);

}  // namespace primus
