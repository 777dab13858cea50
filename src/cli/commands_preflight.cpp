// `primus-cli -- preflight`: flags into PreflightOptions, run (tools/preflight.h), print rank 0's table, write
// the reports and turn the result into the exit code (0 all pass, 1 a check failed).
#include <fmt/format.h>

#include <cstdio>

#include "cli/cli.h"
#include "parallel/comm_benchmark.h"
#include "parallel/distributed_env.h"
#include "tools/preflight.h"

namespace primus::cli {

namespace {

constexpr const char* kPreflightFooter =
    R"(Checks (each pass, info, warn or fail; the run fails when any check fails):
  host     CPU model and cores, memory, NUMA nodes, kernel, open-file and locked-memory limits, /dev/shm,
           free disk in --workspace (fails below --min-free-disk-gib)
  gpu      count (fails below --expected-gpus), model, free memory, other processes holding each GPU,
           driver, runtime, cuDNN and NCCL versions; without a GPU it says so (info) and checks the CPU
  network  NCCL_SOCKET_IFNAME names interfaces that exist and are up; NCCL_IB_HCA names devices under
           /sys/class/infiniband with an ACTIVE port
  perf     GEMM (bf16 8192^3 on a GPU, f32 1024^3 on the CPU, sampled outputs checked) and a same-device copy;
           H100/H200: fail below 75% of the H200's measured ceilings (592 TFLOP/s, 3195 GB/s; H100 copy
           2230 GB/s); other GPUs and the CPU: info unless --min-gemm-tflops / --min-copy-gbps are given
  comm     with several ranks: all-reduce of --allreduce-bytes over all ranks, bus bandwidth (nccl-tests' formula)
Host, gpu and network checks run once per node (LOCAL_RANK 0), perf on every rank's own device.
Rank 0 prints the table and writes DIR/preflight.md and DIR/preflight.json with --report-dir.
Exit codes: 0 every check passed (warnings allowed), 1 a check failed, 2 bad flags, 3 runtime failure (e.g. the
ranks did not meet within --timeout-minutes).

Examples:
  primus-cli -- preflight --report-dir out/preflight
  primus-cli direct --nproc-per-node 8 -- preflight --expected-gpus 8 --report-dir out/preflight
  NCCL_SOCKET_IFNAME=eth0 primus-cli -- preflight)";

struct PreflightArguments {
  PreflightOptions options;
  std::string report_dir;
  std::string allreduce_bytes = "64M";
  double timeout_minutes = 5.0;
};

int run_preflight_command(PreflightArguments& a) {
  a.options.allreduce_bytes = parse_byte_size(a.allreduce_bytes, "--allreduce-bytes");
  if (!(a.timeout_minutes > 0)) {
    throw UsageError(fmt::format("--timeout-minutes must be positive (got {})", a.timeout_minutes));
  }
  a.options.timeout =
      std::chrono::duration_cast<DistributedTimeout>(std::chrono::duration<double>(a.timeout_minutes * 60.0));
  const DistributedEnv env = DistributedEnv::from_environment();
  const PreflightReport report = run_preflight(a.options);
  if (env.rank != 0) return static_cast<int>(kExitOk);  // rank 0 speaks for the job
  fmt::print("{}", format_preflight_table(report));
  if (!a.report_dir.empty()) {
    write_preflight_reports(report, a.report_dir);
    fmt::print("wrote {0}/preflight.md and {0}/preflight.json\n", a.report_dir);
  }
  std::fflush(stdout);
  return static_cast<int>(report.passed() ? kExitOk : kExitChecksFailed);
}

}  // namespace

void add_preflight_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  auto a = std::make_shared<PreflightArguments>();
  CLI::App* preflight = root.add_subcommand(
      "preflight", "Check this node (or every node of the job) before a long run: host, GPUs, network, GEMM, "
                   "memory bandwidth, all-reduce");
  PreflightOptions& o = a->options;
  preflight->add_option("--report-dir", a->report_dir, "Write preflight.md and preflight.json into DIR")
      ->type_name("DIR");
  preflight->add_option("--workspace", o.workspace, "Directory whose disk is checked (default .)")->type_name("DIR");
  preflight->add_option("--min-free-disk-gib", o.min_free_disk_gib, "Free disk below this fails (default 1)");
  preflight->add_option("--expected-gpus", o.expected_gpus, "Fewer visible GPUs on a node fails (default: any)")
      ->type_name("N");
  preflight->add_option("--device", o.device, "cpu, cuda or auto: the GPU LOCAL_RANK when there is one")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  preflight->add_option("--min-gemm-tflops", o.min_gemm_tflops, "GEMM threshold (default: the detected GPU's)");
  preflight->add_option("--min-copy-gbps", o.min_copy_gbps, "Copy threshold, GB/s (default: the detected GPU's)");
  preflight->add_option("--min-allreduce-busbw-gbps", o.min_allreduce_busbw_gbps,
                        "All-reduce bus bandwidth threshold, GB/s (default: none, info)");
  preflight->add_option("--allreduce-bytes", a->allreduce_bytes, "All-reduce buffer per rank (default 64M)")
      ->type_name("BYTES");
  preflight->add_option("--timeout-minutes", a->timeout_minutes,
                        "How long a rank waits for the others before failing (default 5)");
  preflight->footer(kPreflightFooter);
  preflight->final_callback([&launch, &action, a] {
    action = [&launch, a] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
        return static_cast<int>(kExitOk);
      }
      return run_preflight_command(*a);
    };
  });
}

}  // namespace primus::cli
