// run_preflight: this rank's checks (preflight_host.cpp, preflight_device.cpp), then with several ranks the
// rendezvous, the all-reduce bus bandwidth (parallel/comm_benchmark) and the gathering of every rank's checks;
// the console table and the markdown and JSON reports.
#include "tools/preflight.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/comm_benchmark.h"
#include "parallel/distributed_env.h"
#include "parallel/gather_text.h"
#include "tools/build_info.h"
#include "tools/preflight_checks.h"

namespace primus {

namespace fs = std::filesystem;
using preflight::Checks;

namespace preflight {

void guarded(Checks& out, const std::string& group, const std::string& name, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& error) {
    out.push_back(make_check(group, name, CheckStatus::kFail, "error", error.what()));
  }
}

PreflightCheck make_check(const std::string& group, const std::string& name, CheckStatus status, std::string value,
                          std::string detail) {
  PreflightCheck c;
  c.group = group;
  c.name = name;
  c.status = status;
  c.value = std::move(value);
  c.detail = std::move(detail);
  return c;
}

}  // namespace preflight

namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

nlohmann::json check_json(const PreflightCheck& c) {
  return {{"group", c.group},   {"name", c.name},         {"status", check_status_name(c.status)},
          {"value", c.value},   {"detail", c.detail},     {"measured", c.measured},
          {"unit", c.unit},     {"rank", c.rank},         {"host", c.host}};
}

PreflightCheck check_from_json(const nlohmann::json& j) {
  PreflightCheck c;
  c.group = j.at("group");
  c.name = j.at("name");
  const std::string status = j.at("status");
  for (CheckStatus s : {CheckStatus::kPass, CheckStatus::kInfo, CheckStatus::kWarn, CheckStatus::kFail}) {
    if (status == check_status_name(s)) c.status = s;
  }
  c.value = j.at("value");
  c.detail = j.at("detail");
  c.measured = j.at("measured");
  c.unit = j.at("unit");
  c.rank = j.at("rank");
  c.host = j.at("host");
  return c;
}

// nccl-tests' all-reduce over the world at one size (comm_benchmark), as one check.
PreflightCheck allreduce_check(Communicator& comm, const PreflightOptions& options) {
  CommBenchmarkOptions sweep;
  sweep.ops = {"all_reduce"};
  sweep.min_bytes = sweep.max_bytes = options.allreduce_bytes;
  sweep.warmup = 5;
  sweep.iters = 20;
  validate_comm_benchmark_options(sweep);
  const std::vector<CommBenchmarkRow> rows = run_comm_benchmark(comm, sweep);
  PRIMUS_CHECK(rows.size() == 1, "[preflight] the all-reduce sweep gave {} rows, not 1", rows.size());
  const CommBenchmarkRow& row = rows.front();
  const double minimum = options.min_allreduce_busbw_gbps;
  PreflightCheck c = preflight::make_check(
      "comm", fmt::format("all_reduce {} MiB", row.bytes >> 20),
      minimum < 0 ? CheckStatus::kInfo : (row.busbw_gbps >= minimum ? CheckStatus::kPass : CheckStatus::kFail),
      fmt::format("busbw {:.2f} GB/s, algbw {:.2f} GB/s, {:.0f} us ({} over {} ranks on {}, f32)", row.busbw_gbps,
                  row.algbw_gbps, row.time_us, comm.backend_name(), comm.size(), comm.device().str()),
      minimum < 0 ? "busbw = algbw x 2(n-1)/n (nccl-tests); no threshold (--min-allreduce-busbw-gbps)"
                  : fmt::format("at least {:g} GB/s (--min-allreduce-busbw-gbps)", minimum));
  c.measured = row.busbw_gbps;
  c.unit = "GB/s";
  return c;
}

void validate(const PreflightOptions& o) {
  if (!(o.min_free_disk_gib >= 0)) {
    throw UsageError(fmt::format("--min-free-disk-gib must not be negative (got {})", o.min_free_disk_gib));
  }
  if (o.expected_gpus == 0 || o.expected_gpus < -1) {
    throw UsageError(fmt::format("--expected-gpus must be at least 1 (got {})", o.expected_gpus));
  }
  if (o.allreduce_bytes < 4) {
    throw UsageError(fmt::format("--allreduce-bytes must be at least 4 (got {})", o.allreduce_bytes));
  }
  if (o.timeout.count() <= 0) throw UsageError("--timeout-minutes must be positive");
}

std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += "<br>";
    else out.push_back(c);
  }
  return out;
}

std::string summary(const PreflightReport& r) {
  return fmt::format("{} ({} pass, {} info, {} warn, {} fail)", r.passed() ? "PASS" : "FAIL", r.count(CheckStatus::kPass),
                     r.count(CheckStatus::kInfo), r.count(CheckStatus::kWarn), r.count(CheckStatus::kFail));
}

}  // namespace

const char* check_status_name(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass:
      return "pass";
    case CheckStatus::kInfo:
      return "info";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "fail";
  }
  return "?";
}

bool PreflightReport::passed() const { return count(CheckStatus::kFail) == 0; }

int PreflightReport::count(CheckStatus status) const {
  int n = 0;
  for (const PreflightCheck& c : checks) n += c.status == status ? 1 : 0;
  return n;
}

PreflightReport run_preflight(const PreflightOptions& options) {
  validate(options);
  const DistributedEnv env = DistributedEnv::from_environment();
  PreflightReport report;
  report.world_size = env.world_size;
  report.started_utc = utc_now();
  report.version = version_text();
  Checks mine;
  // Node-wide checks once per node; the device checks on every rank, each on its own GPU.
  if (env.local_rank == 0) {
    preflight::add_host_checks(options, mine);
    preflight::add_network_checks(mine);
    preflight::guarded(mine, "gpu", "gpus", [&] { preflight::add_gpu_inventory_checks(options, mine); });
  }
  Device device = kCpuDevice;
  try {
    device = select_comm_device(options.device, env.local_rank);
  } catch (const RuntimeError& error) {  // a GPU that does not start: reported, and the CPU used for the rest
    mine.push_back(preflight::make_check("perf", "device", CheckStatus::kFail, "cannot start the GPU", error.what()));
  }
  preflight::add_device_perf_checks(options, device, mine);
  const std::string host = host_name();
  for (PreflightCheck& c : mine) {
    c.rank = env.rank;
    c.host = host;
  }
  if (!env.is_multi_process()) {
    report.checks = std::move(mine);
    return report;
  }
  std::unique_ptr<Communicator> comm = make_world_communicator(env, device, options.timeout);
  nlohmann::json own = nlohmann::json::array();
  for (const PreflightCheck& c : mine) own.push_back(check_json(c));
  for (const std::string& text : all_gather_text(*comm, own.dump())) {
    for (const nlohmann::json& j : nlohmann::json::parse(text)) report.checks.push_back(check_from_json(j));
  }
  PreflightCheck allreduce = [&] {
    try {
      return allreduce_check(*comm, options);
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& error) {
      return preflight::make_check("comm", "all_reduce", CheckStatus::kFail, "error", error.what());
    }
  }();
  allreduce.rank = 0;
  allreduce.host = "all";
  report.checks.push_back(allreduce);
  comm->barrier();  // no rank closes its connections while another still reads
  return report;
}

std::string format_preflight_table(const PreflightReport& report) {
  const bool ranks = report.world_size > 1;
  size_t name_width = 5;
  for (const PreflightCheck& c : report.checks) name_width = std::max(name_width, c.group.size() + 1 + c.name.size());
  std::string out = fmt::format("{}\npreflight on {} rank{} at {}\n", report.version, report.world_size,
                                report.world_size == 1 ? "" : "s", report.started_utc);
  out += fmt::format("{:<6} {:<{}} {}{}\n", "status", "check", name_width, ranks ? "rank  " : "", "value");
  for (const PreflightCheck& c : report.checks) {
    std::string status = check_status_name(c.status);
    for (char& ch : status) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    out += fmt::format("{:<6} {:<{}} {}{}{}\n", status, c.group + "/" + c.name, name_width,
                       ranks ? fmt::format("{:<5} ", c.host == "all" ? std::string("all") : std::to_string(c.rank)) : "",
                       c.value, c.detail.empty() ? "" : "  [" + c.detail + "]");
  }
  out += fmt::format("preflight: {}\n", summary(report));
  return out;
}

std::string preflight_markdown(const PreflightReport& report) {
  std::string out = fmt::format("# Preflight report\n\n- result: **{}**\n- {}\n- started: {}\n- ranks: {}\n\n",
                                summary(report), report.version, report.started_utc, report.world_size);
  out += "| status | group | check | rank | host | value | detail |\n|---|---|---|---|---|---|---|\n";
  for (const PreflightCheck& c : report.checks) {
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", check_status_name(c.status), c.group,
                       escape_cell(c.name), c.host == "all" ? std::string("all") : std::to_string(c.rank),
                       escape_cell(c.host), escape_cell(c.value), escape_cell(c.detail));
  }
  return out;
}

nlohmann::json preflight_json(const PreflightReport& report) {
  nlohmann::json checks = nlohmann::json::array();
  for (const PreflightCheck& c : report.checks) checks.push_back(check_json(c));
  return {{"version", report.version},
          {"started_utc", report.started_utc},
          {"world_size", report.world_size},
          {"result", report.passed() ? "pass" : "fail"},
          {"counts",
           {{"pass", report.count(CheckStatus::kPass)},
            {"info", report.count(CheckStatus::kInfo)},
            {"warn", report.count(CheckStatus::kWarn)},
            {"fail", report.count(CheckStatus::kFail)}}},
          {"checks", checks}};
}

void write_preflight_reports(const PreflightReport& report, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UsageError(fmt::format("--report-dir {}: cannot create it: {}", dir, ec.message()));
  auto write = [&](const std::string& name, const std::string& text) {
    const fs::path path = fs::path(dir) / name;
    std::ofstream out(path, std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw UsageError(fmt::format("--report-dir {}: cannot write {}", dir, path.string()));
  };
  write("preflight.md", preflight_markdown(report));
  write("preflight.json", preflight_json(report).dump(2) + "\n");
}

}  // namespace primus
