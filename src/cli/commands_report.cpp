// `primus-cli -- report RUN_DIR [--output FILE]`: a self-contained HTML page of a run's charts, config and
// device (observe/report.h builds it).
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "cli/cli.h"
#include "core/file_io.h"
#include "observe/report.h"

namespace primus::cli {
namespace {

constexpr const char* kReportFooter =
    R"(Reads RUN_DIR/metrics.jsonl (required), RUN_DIR/config.yaml and RUN_DIR/logs/train.log, as written by
'train pretrain' into <workspace>/<exp_name>/, and writes one HTML file with inline CSS and SVG charts (loss
and eval loss, learning rate, tokens/s, TFLOP/s, gradient norm, step time; MFU and peak memory when logged),
the config summary and the device. It loads nothing from the network and runs no scripts.
A missing directory or metrics.jsonl, or a malformed line (named FILE:LINE), exits 2.

Examples:
  primus-cli -- report output/tiny_cpu
  primus-cli -- report output/tiny_cpu --output /tmp/tiny.html)";

struct ReportArguments {
  std::string run_dir;
  std::string output;  // empty: RUN_DIR/report.html
};

int run_report(const ReportArguments& arguments) {
  RunReport report = load_run_report(arguments.run_dir);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  char stamp[32] = "";
  if (localtime_r(&now, &local) != nullptr) std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  report.generated_at = stamp;
  const std::filesystem::path output = arguments.output.empty()
                                           ? std::filesystem::path(arguments.run_dir) / "report.html"
                                           : std::filesystem::path(arguments.output);
  if (output.has_parent_path()) {
    std::error_code error;
    std::filesystem::create_directories(output.parent_path(), error);
    if (error) {
      throw UsageError(fmt::format("--output {}: cannot create folder {}: {}", output.string(),
                                   output.parent_path().string(), error.message()));
    }
  }
  write_file_atomic(output.string(), render_report_html(report));
  const std::vector<MetricsRecord>& records = report.metrics.records;
  fmt::print("wrote {}: {} charts from {} metric records (steps {} to {})\n", output.string(),
             report_charts(report.metrics).size(), records.size(), records.front().step, records.back().step);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void add_report_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  auto arguments = std::make_shared<ReportArguments>();
  CLI::App* report = root.add_subcommand(
      "report",
      "Write a self-contained HTML report of a run directory: loss, lr and throughput charts, config, device");
  report->add_option("run_dir", arguments->run_dir, "Run directory (<workspace>/<exp_name>/ of 'train pretrain')")
      ->required()
      ->type_name("RUN_DIR");
  report->add_option("--output,-o", arguments->output, "HTML file to write (default RUN_DIR/report.html)")
      ->type_name("FILE");
  report->footer(kReportFooter);
  report->final_callback([&launch, &action, arguments] {
    action = [&launch, arguments] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
        return static_cast<int>(kExitOk);
      }
      return run_report(*arguments);
    };
  });
}

}  // namespace primus::cli
