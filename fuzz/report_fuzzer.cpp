// The run-directory reader of `primus-cli report`: load_run_report over metrics.jsonl (JSON lines, torn last
// line), config.yaml (the config summary) and logs/train.log (the run summary), then the whole HTML page with
// its SVG charts.
//
// Input: metrics.jsonl [\n@@\n config.yaml [\n@@\n logs/train.log]]
#include <vector>

#include "fuzz_input.h"
#include "observe/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts = primus::fuzz::split_parts(input, 3);
  const std::string dir = primus::fuzz::fresh_scratch_dir("run");
  primus::fuzz::write_scratch("run/metrics.jsonl", parts[0]);
  if (parts.size() > 1) primus::fuzz::write_scratch("run/config.yaml", parts[1]);
  if (parts.size() > 2) {
    primus::fuzz::fresh_scratch_dir("run/logs");
    primus::fuzz::write_scratch("run/logs/train.log", parts[2]);
  }
  primus::fuzz::expect_clean_errors([&] {
    primus::RunReport report = primus::load_run_report(dir);
    (void)primus::render_report_html(report);
  });
  return 0;
}
