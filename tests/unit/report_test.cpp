// The HTML run report (observe/report.h) on metrics with known values: parsing metrics.jsonl, the charts and
// their points, escaping of text taken from files, and the errors that name file and line.
#include "observe/report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// The value of attribute `name` in the first element that contains `marker` (e.g. data-series="loss").
std::string attribute_of(const std::string& html, const std::string& marker, const std::string& name) {
  const size_t at = html.find(marker);
  if (at == std::string::npos) return "";
  const size_t element = html.rfind('<', at);
  const size_t value = html.find(" " + name + "=\"", element);
  if (value == std::string::npos || value > html.find('>', at)) return "";
  const size_t begin = value + name.size() + 3;
  return html.substr(begin, html.find('"', begin) - begin);
}

// The number of "x,y" pairs in the points attribute of the polyline of `series`.
size_t polyline_points(const std::string& html, const std::string& series) {
  const std::string points = attribute_of(html, "data-series=\"" + series + "\"", "points");
  return points.empty() ? 0 : count(points, ",");
}

// Five logged steps of a run that evaluates at steps 4 and 10; the lines are out of order on purpose.
constexpr const char* kMetrics =
    R"({"step":2,"loss":5.5,"lr":0.001,"grad_norm":1.5,"tokens_per_s":1000,"tflops_per_gpu":0.5,"step_ms":10})"
    "\n"
    R"({"step":4,"loss":4.5,"lr":0.002,"grad_norm":1.2,"tokens_per_s":1200,"tflops_per_gpu":0.6,"step_ms":9,"eval_loss":4.25})"
    "\n\n"
    R"({"step":8,"loss":3.5,"lr":0.0015,"grad_norm":0.9,"tokens_per_s":null,"tflops_per_gpu":0.7,"step_ms":8})"
    "\n"
    R"({"step":6,"loss":4.0,"lr":0.0018,"grad_norm":1.0,"tokens_per_s":1100,"tflops_per_gpu":0.65,"step_ms":8.5,"note":"x"})"
    "\n"
    R"({"step":10,"loss":3.0,"lr":0.001,"grad_norm":0.8,"tokens_per_s":1300,"tflops_per_gpu":0.8,"step_ms":7,"eval_loss":3.125})"
    "\n";

constexpr const char* kConfig = R"(# Effective config of experiment "a<b>&'c'": every module key is spelled out.
# Model preset tiny_llama (its keys are copied under overrides).
exp_name: "a<b>&'c'"
workspace: /tmp/ws
modules:
  pre_trainer:
    framework: megatron
    overrides:
      num_layers: 2
      hidden_size: 64
      train_iters: 10
      lr: 0.002
      vocab_size: null
      data_path: [/data/a, "/data/<b>"]
      sample_prompt: "<script>alert(1)</script>"
)";

constexpr const char* kLog =
    "[2026-01-31 12:00:00.000] [primus] [info] run directory: /tmp/ws/run\n"
    "[2026-01-31 12:00:00.001] [primus] [info] device: cpu (2 OpenMP threads)\n"
    "[2026-01-31 12:00:00.002] [primus] [info] model: 2 layers, hidden 64, 141632 parameters\n"
    "[2026-01-31 12:00:01.000] [primus] [info] sample after 10 iterations:\n"
    "The <sample> text\n"
    "[2026-01-31 12:00:02.000] [primus] [info] done: 10 iterations in 2.0 s; run directory /tmp/ws/run\n";

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string error_of(const std::function<void()>& body, int* exit_code = nullptr) {
  try {
    body();
  } catch (const Error& error) {
    if (exit_code != nullptr) *exit_code = error.exit_code();
    return error.what();
  }
  return "(no error)";
}

TEST(RunReport, ParsesMetricsSortedByStepSkippingNullsAndNonNumbers) {
  MetricsFile metrics = parse_metrics_jsonl(kMetrics, "m.jsonl");
  ASSERT_EQ(metrics.records.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(metrics.records[i].step, static_cast<int64_t>(2 * i + 2));
  EXPECT_DOUBLE_EQ(metrics.records[1].values.at("eval_loss"), 4.25);
  EXPECT_EQ(metrics.records[3].values.count("tokens_per_s"), 0u);  // null
  EXPECT_EQ(metrics.records[2].values.count("note"), 0u);          // a string
  EXPECT_TRUE(metrics.notes.empty());
}

TEST(RunReport, MalformedMetricsLinesNameFileAndLineAndExitTwo) {
  int exit_code = 0;
  std::string message = error_of(
      [] {
        parse_metrics_jsonl("{\"step\":1,\"loss\":2}\n\n{\"step\":2,\"loss\":\n{\"step\":3}\n", "run/metrics.jsonl");
      },
      &exit_code);
  EXPECT_EQ(exit_code, kExitUsage);
  EXPECT_CONTAINS(message, "run/metrics.jsonl:3:");
  EXPECT_CONTAINS(message, "malformed JSON");

  EXPECT_CONTAINS(error_of([] { parse_metrics_jsonl("{\"step\":1}\n[1, 2]\n", "m.jsonl"); }),
                  "m.jsonl:2: expected a JSON object, got array");
  EXPECT_CONTAINS(error_of([] { parse_metrics_jsonl("{\"loss\":1.5}\n", "m.jsonl"); }),
                  "m.jsonl:1: the record has no integer \"step\"");
  EXPECT_CONTAINS(error_of([] { parse_metrics_jsonl("{\"step\":\"4\"}\n", "m.jsonl"); }), "m.jsonl:1:");
  // Found by fuzz/report_fuzzer: a number past a double's range escaped as nlohmann's out_of_range (exit 3, no
  // file named). As the last, unterminated line it is a torn write like any other.
  message =
      error_of([] { parse_metrics_jsonl("{\"step\":1}\n{\"step\":2,\"loss\":-1e3085}\n", "m.jsonl"); }, &exit_code);
  EXPECT_EQ(exit_code, kExitUsage);
  EXPECT_CONTAINS(message, "m.jsonl:2: a number outside the range of a double");
  EXPECT_EQ(parse_metrics_jsonl("{\"step\":1}\n{\"step\":2,\"loss\":1e999", "m.jsonl").notes.size(), 1u);
}

TEST(RunReport, TornLastLineOfAKilledRunIsSkippedWithANote) {
  MetricsFile metrics = parse_metrics_jsonl("{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo", "m.jsonl");
  ASSERT_EQ(metrics.records.size(), 1u);
  ASSERT_EQ(metrics.notes.size(), 1u);
  EXPECT_CONTAINS(metrics.notes[0], "m.jsonl:2: skipped an incomplete last line");
  // The same line with its newline was written whole, so it is an error.
  EXPECT_CONTAINS(error_of([] { parse_metrics_jsonl("{\"step\":1}\n{\"step\":2,\"lo\n", "m.jsonl"); }), "m.jsonl:2:");
}

TEST(RunReport, ChartsHaveOneSeriesPerLoggedFieldWithItsPoints) {
  std::vector<Chart> charts = report_charts(parse_metrics_jsonl(kMetrics, "m.jsonl"));
  std::vector<std::string> titles;
  for (const Chart& chart : charts) titles.push_back(chart.title);
  // No mfu and no mem_peak_gib in these metrics (a CPU run): those charts are left out.
  EXPECT_EQ(titles,
            (std::vector<std::string>{"Loss", "Learning rate", "Throughput", "Compute", "Gradient norm", "Step time"}));
  ASSERT_EQ(charts[0].series.size(), 2u);
  EXPECT_EQ(charts[0].series[0].key, "loss");
  EXPECT_EQ(charts[0].series[0].points.size(), 5u);
  EXPECT_EQ(charts[0].series[1].key, "eval_loss");
  EXPECT_EQ(charts[0].series[1].points, (std::vector<std::pair<double, double>>{{4, 4.25}, {10, 3.125}}));
  EXPECT_EQ(charts[2].series[0].points.size(), 4u);  // one tokens_per_s was null
}

TEST(RunReport, SvgChartDrawsEveryPointAndThinsLongSeries) {
  Chart chart{"Loss <&>", "loss", {{"loss", "train loss", "#123456", {}}, {"eval_loss", "eval", "#654321", {}}}};
  for (int step = 1; step <= 7; ++step) chart.series[0].points.emplace_back(step, 10.0 / step);
  chart.series[1].points = {{3, 4.0}, {6, 2.0}};
  const std::string svg = render_svg_chart(chart);
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_CONTAINS(svg, "<title>Loss &lt;&amp;&gt;</title>");
  EXPECT_EQ(attribute_of(svg, "data-series=\"loss\"", "data-points"), "7");
  EXPECT_EQ(polyline_points(svg, "loss"), 7u);
  EXPECT_EQ(polyline_points(svg, "eval_loss"), 2u);
  EXPECT_EQ(count(svg, "<circle"), 9u);  // short series: a marker per point
  EXPECT_CONTAINS(svg, "<title>step 3: eval 4</title>");

  Chart long_chart{"Loss", "loss", {{"loss", "train loss", "#123456", {}}}};
  for (int step = 1; step <= 5000; ++step) long_chart.series[0].points.emplace_back(step, step % 97 == 0 ? 50.0 : 1.0);
  const std::string long_svg = render_svg_chart(long_chart);
  EXPECT_EQ(attribute_of(long_svg, "data-series=\"loss\"", "data-points"), "5000");
  const size_t drawn = polyline_points(long_svg, "loss");
  EXPECT_GT(drawn, 1000u);
  EXPECT_LE(drawn, 2000u);
  EXPECT_EQ(count(long_svg, "<circle"), 0u);
  // Every spike is a bucket's maximum, so all 5000 / 97 = 51 of them are still drawn (at the smallest y).
  std::istringstream points(attribute_of(long_svg, "data-series=\"loss\"", "points"));
  std::vector<double> ys;
  for (std::string point; points >> point;) ys.push_back(std::stod(point.substr(point.find(',') + 1)));
  EXPECT_EQ(std::count(ys.begin(), ys.end(), *std::min_element(ys.begin(), ys.end())), 51);
}

TEST(RunReport, SvgChartOfConstantOrHugeValuesStillHasAnAxis) {
  for (double value : {0.0, 45.5, -3.0, 1e16}) {
    Chart chart{"Memory", "GiB", {{"mem_peak_gib", "peak GiB", "#123456", {{1, value}, {2, value}, {3, value + 1}}}}};
    const std::string svg = render_svg_chart(chart);
    EXPECT_EQ(polyline_points(svg, "mem_peak_gib"), 3u) << value;
    EXPECT_EQ(svg.find("nan"), std::string::npos) << value;
    EXPECT_EQ(svg.find("inf"), std::string::npos) << value;
  }
}

TEST(RunReport, ConfigSummaryPicksTheMainKeysAndNamesBadYamlLines) {
  KeyValues rows = summarize_config(kConfig, "run/config.yaml");
  KeyValues expected{{"exp_name", "a<b>&'c'"},
                     {"model preset", "tiny_llama"},
                     {"framework", "megatron"},
                     {"num_layers", "2"},
                     {"hidden_size", "64"},
                     {"vocab_size", "null"},
                     {"train_iters", "10"},
                     {"lr", "0.002"},
                     {"data_path", "[/data/a, /data/<b>]"}};
  std::sort(rows.begin(), rows.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(rows, expected);

  int exit_code = 0;
  std::string message = error_of([] { summarize_config("a: 1\nb: [2, 3\nc: 4\n", "run/config.yaml"); }, &exit_code);
  EXPECT_EQ(exit_code, kExitUsage);
  EXPECT_CONTAINS(message, "run/config.yaml:");
  EXPECT_CONTAINS(message, "malformed YAML");
}

// Found by fuzz/report_fuzzer: a value that contains itself through an alias overflowed the stack, and aliases of
// aliases made a cell of gigabytes. Cells stop at 8 levels and about 200 characters.
TEST(RunReport, ConfigSummaryCellsOfRecursiveOrExplodingAliasesStayShort) {
  KeyValues rows = summarize_config("exp_name: &a [x, *a]\n", "run/config.yaml");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].second, "[x, [x, [x, [x, [x, [x, [x, [x, ...]]]]]]]]");
  std::string bomb = "exp_name: [&a [x, x, x, x, x, x, x, x, x, x]";
  for (char level = 'b'; level <= 'i'; ++level) {
    bomb += fmt::format(", &{0} [*{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}]", level,
                        static_cast<char>(level - 1));
  }
  rows = summarize_config(bomb + "]\n", "run/config.yaml");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_LT(rows[0].second.size(), 400u);
  EXPECT_TRUE(rows[0].second.ends_with(", ...]")) << rows[0].second;
}

TEST(RunReport, RunSummaryReadsTheDeviceAndProgressFromTheLog) {
  MetricsFile metrics = parse_metrics_jsonl(
      "{\"step\":1,\"mem_peak_gib\":3.5,\"mfu\":0.4}\n"
      "{\"step\":2,\"mem_peak_gib\":4.25,\"mfu\":0.5}\n",
      "m.jsonl");
  KeyValues rows = run_summary(kLog, metrics);
  KeyValues expected{
      {"device", "cpu (2 OpenMP threads)"},   {"model", "2 layers, hidden 64, 141632 parameters"},
      {"started", "2026-01-31 12:00:00.000"}, {"finished", "10 iterations in 2.0 s; run directory /tmp/ws/run"},
      {"peak device memory", "4.25 GiB"},     {"MFU (median)", "0.500"}};
  EXPECT_EQ(rows, expected);

  // A resumed run that has not finished its second session.
  std::string resumed = std::string(kLog) +
                        "[2026-01-31 13:00:00.000] [primus] [info] run directory: /tmp/ws/run\n"
                        "[2026-01-31 13:00:00.001] [primus] [info] device: cuda:0\n"
                        "[2026-01-31 13:00:00.002] [primus] [info] resumed from /tmp/ws/run/checkpoints/iter_0000010 "
                        "at iteration 10 (160 samples consumed)\n";
  rows = run_summary(resumed, MetricsFile{});
  EXPECT_EQ(rows[0], (std::pair<std::string, std::string>{"device", "cpu (2 OpenMP threads); cuda:0"}));
  EXPECT_CONTAINS(rows[3].second, "2 (last resumed from /tmp/ws/run/checkpoints/iter_0000010");
  EXPECT_CONTAINS(rows[4].second, "no: the last session has no 'done' line");

  EXPECT_CONTAINS(run_summary("", MetricsFile{})[0].second, "not recorded");
}

TEST(RunReport, PageHasAnSvgPerChartAndEscapesTextFromFiles) {
  const fs::path dir = testing::temp_dir("report");
  write(dir / "metrics.jsonl", kMetrics);
  write(dir / "config.yaml", kConfig);
  write(dir / "logs" / "train.log", kLog);
  RunReport report = load_run_report(dir.string());
  EXPECT_EQ(report.title, "a<b>&'c'");
  EXPECT_TRUE(report.notes.empty());
  const std::string html = render_report_html(report);

  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  EXPECT_EQ(count(html, "<svg"), 6u);
  EXPECT_EQ(count(html, "<svg"), report_charts(report.metrics).size());
  EXPECT_EQ(polyline_points(html, "loss"), 5u);
  EXPECT_EQ(polyline_points(html, "eval_loss"), 2u);
  EXPECT_EQ(polyline_points(html, "lr"), 5u);
  EXPECT_EQ(polyline_points(html, "tokens_per_s"), 4u);
  EXPECT_EQ(polyline_points(html, "tflops_per_gpu"), 5u);

  // Text from config.yaml, metrics and the log is escaped wherever it appears; nothing can open a tag.
  EXPECT_CONTAINS(html, "<title>Run report: a&lt;b&gt;&amp;&#39;c&#39;</title>");
  EXPECT_CONTAINS(html, "<td>[/data/a, /data/&lt;b&gt;]</td>");
  EXPECT_CONTAINS(html, "&lt;script&gt;alert(1)&lt;/script&gt;");  // the whole config, folded
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // no link but the SVG namespace
  EXPECT_EQ(html.find("https://"), std::string::npos);

  EXPECT_CONTAINS(html, "<td>cpu (2 OpenMP threads)</td>");
  EXPECT_CONTAINS(html, "last logged step of 10");
  EXPECT_CONTAINS(html, "<div class=\"value\">3.1250</div><div class=\"label\">best eval loss (step 10)</div>");
}

TEST(RunReport, MissingRunFilesExitTwoNamingThePath) {
  const fs::path dir = testing::temp_dir("report");
  int exit_code = 0;
  std::string message = error_of([&] { load_run_report((dir / "nope").string()); }, &exit_code);
  EXPECT_EQ(exit_code, kExitUsage);
  EXPECT_CONTAINS(message, "run directory " + (dir / "nope").string() + " does not exist");

  message = error_of([&] { load_run_report(dir.string()); }, &exit_code);
  EXPECT_EQ(exit_code, kExitUsage);
  EXPECT_CONTAINS(message, (dir / "metrics.jsonl").string() + " not found");

  write(dir / "metrics.jsonl", "");
  EXPECT_CONTAINS(error_of([&] { load_run_report(dir.string()); }), "has no metric records");

  write(dir / "metrics.jsonl", "{\"step\":1,\"loss\":2}\n{\"step\":2,,}\n");
  EXPECT_CONTAINS(error_of([&] { load_run_report(dir.string()); }), (dir / "metrics.jsonl").string() + ":2:");

  // config.yaml and the log are optional: the page says what is missing.
  write(dir / "metrics.jsonl", "{\"step\":1,\"loss\":2}\n");
  RunReport report = load_run_report(dir.string());
  ASSERT_EQ(report.notes.size(), 2u);
  EXPECT_CONTAINS(report.notes[0], "config.yaml not found");
  EXPECT_CONTAINS(report.notes[1], "train.log not found");
  EXPECT_EQ(report.title, dir.filename().string());
  EXPECT_EQ(count(render_report_html(report), "<svg"), 1u);

  write(dir / "config.yaml", "exp_name: x\nmodules: [\n");
  EXPECT_CONTAINS(error_of([&] { load_run_report(dir.string()); }), (dir / "config.yaml").string() + ":");
}

}  // namespace
}  // namespace primus
