// The HTML run report (see report.h): metrics.jsonl parsing, config and log summaries, SVG line charts and
// the page around them.
#include "observe/report.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxDrawnPoints = 2000;  // above this a series is drawn as per-bucket minimum and maximum
constexpr size_t kMaxMarkedPoints = 60;   // series this short get a circle (with a tooltip) per point

std::string_view trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t\r") - begin + 1);
}

// nlohmann's message says "parse error at line 1, column N: ..." about the one line it was given; keep what
// follows, since the caller names the file's line and column itself.
std::string parse_error_reason(const nlohmann::json::parse_error& error) {
  std::string message = error.what();
  const size_t column = message.find("column ");
  const size_t colon = column == std::string::npos ? std::string::npos : message.find(": ", column);
  return colon == std::string::npos ? message : message.substr(colon + 2);
}

// Numbers for axis ticks and tooltips: 4 significant digits, thousands as k/M/G.
std::string format_number(double value) {
  const double magnitude = std::abs(value);
  if (magnitude >= 1e9) return fmt::format("{:.3g}G", value / 1e9);
  if (magnitude >= 1e6) return fmt::format("{:.3g}M", value / 1e6);
  if (magnitude >= 1e4) return fmt::format("{:.3g}k", value / 1e3);
  return fmt::format("{:.4g}", value);
}

// A summary cell stays short however its value is written: with YAML aliases a value can contain itself (a
// cycle, which a plain walk follows until the stack overflows) or repeat a list a billion times in 400 bytes.
constexpr size_t kMaxCellChars = 200;
constexpr int kMaxCellDepth = 8;

void append_one_line(const YAML::Node& node, int depth, std::string& out) {
  if (!node.IsDefined() || node.IsNull()) {
    out += "null";
    return;
  }
  if (node.IsScalar()) {
    out += node.Scalar();
    return;
  }
  if (depth == kMaxCellDepth) {
    out += "...";
    return;
  }
  out += node.IsSequence() ? "[" : "{";
  bool first = true;
  for (const auto& item : node) {
    if (out.size() > kMaxCellChars) {
      out += ", ...";
      break;
    }
    out += first ? "" : ", ";
    first = false;
    if (node.IsSequence()) {
      append_one_line(item, depth + 1, out);
    } else {
      out += item.first.Scalar();
      out += ": ";
      append_one_line(item.second, depth + 1, out);
    }
  }
  out += node.IsSequence() ? "]" : "}";
}

// The text of a YAML value on one line: scalars as written, sequences as [a, b], maps as {k: v}; past 200
// characters or 8 levels the rest is "...".
std::string one_line(const YAML::Node& node) {
  std::string out;
  append_one_line(node, 0, out);
  return out;
}

std::vector<double> values_of(const MetricsFile& metrics, const std::string& key) {
  std::vector<double> values;
  for (const MetricsRecord& record : metrics.records) {
    auto it = record.values.find(key);
    if (it != record.values.end()) values.push_back(it->second);
  }
  return values;
}

std::optional<double> median_of(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle), values.end());
  return values[middle];
}

// --- charts ---

struct Axis {
  double lo = 0.0, hi = 1.0;
  std::vector<double> ticks;
};

// An axis over [lo, hi] widened to whole multiples of a 1-2-5 tick step (about five ticks).
Axis make_axis(double lo, double hi, bool whole_numbers) {
  if (!(hi > lo)) {
    const double pad = lo == 0.0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5.0;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / power;
  double step = (fraction <= 1.0 ? 1.0 : fraction <= 2.0 ? 2.0 : fraction <= 5.0 ? 5.0 : 10.0) * power;
  if (whole_numbers) step = std::max(step, 1.0);
  const double first = std::floor(lo / step), last = std::ceil(hi / step);
  // Where the values are too large for their spread to be resolved in doubles, keep the raw range.
  if (!(last * step > first * step) || last - first > 20.0) return Axis{lo, hi, {lo, hi}};
  Axis axis{first * step, last * step, {}};
  for (double k = first; k <= last; k += 1.0) axis.ticks.push_back(k * step);
  return axis;
}

// At most kMaxDrawnPoints points: the minimum and maximum of each of kMaxDrawnPoints / 2 buckets, in order.
std::vector<std::pair<double, double>> drawn_points(const std::vector<std::pair<double, double>>& points) {
  if (points.size() <= kMaxDrawnPoints) return points;
  std::vector<std::pair<double, double>> drawn;
  const size_t buckets = kMaxDrawnPoints / 2;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * points.size() / buckets, end = (b + 1) * points.size() / buckets;
    size_t low = begin, high = begin;
    for (size_t i = begin; i < end; ++i) {
      if (points[i].second < points[low].second) low = i;
      if (points[i].second > points[high].second) high = i;
    }
    drawn.push_back(points[std::min(low, high)]);
    if (low != high) drawn.push_back(points[std::max(low, high)]);
  }
  return drawn;
}

struct ChartSpec {
  const char* title;
  const char* y_label;
  std::vector<std::pair<const char*, const char*>> series;  // (metrics key, legend label)
};

const std::vector<ChartSpec>& chart_specs() {
  static const std::vector<ChartSpec> specs = {
      {"Loss", "loss", {{"loss", "train loss"}, {"eval_loss", "eval loss"}}},
      {"Learning rate", "learning rate", {{"lr", "lr"}}},
      {"Throughput", "tokens/s", {{"tokens_per_s", "tokens/s"}}},
      {"Compute", "TFLOP/s per GPU", {{"tflops_per_gpu", "TFLOP/s per GPU"}}},
      {"Model FLOPs utilisation", "MFU", {{"mfu", "MFU"}}},
      {"Gradient norm", "grad norm", {{"grad_norm", "grad norm"}}},
      {"Step time", "ms per step", {{"step_ms", "ms per step"}}},
      {"Peak device memory", "GiB", {{"mem_peak_gib", "peak GiB"}}},
  };
  return specs;
}

// The overrides keys of the config summary, in this order.
constexpr const char* kSummaryKeys[] = {
    "num_layers",    "hidden_size",    "ffn_hidden_size",  "num_attention_heads", "num_query_groups", "kv_channels",
    "vocab_size",    "seq_length",     "micro_batch_size", "global_batch_size",   "train_iters",      "lr",
    "min_lr",        "lr_decay_style", "lr_warmup_iters",  "lr_decay_iters",      "weight_decay",     "clip_grad",
    "seed",          "bf16",           "device",           "mock_data",           "data_path",        "tokenizer_type",
    "eval_interval", "eval_iters"};

constexpr const char* kSeriesColors[] = {"#2563eb", "#ea580c", "#16a34a", "#9333ea"};

// --- the page ---

constexpr const char* kStyle = R"(
:root { color-scheme: light; }
body { margin: 0; background: #f4f5f7; color: #1d2330;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1160px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 10px; }
.sub { color: #5b6475; margin: 0; word-break: break-all; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 12px; margin-top: 18px; }
.card { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 10px 14px; }
.card .value { font-size: 20px; font-weight: 600; }
.card .label { color: #5b6475; font-size: 12px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 14px; }
figure { margin: 0; background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 10px 12px; }
figcaption { font-weight: 600; }
svg.chart { display: block; width: 100%; height: auto; }
svg.chart text { font-size: 11px; fill: #5b6475; }
svg.chart .grid { stroke: #e8ebf0; }
svg.chart .frame { stroke: #9aa3b2; fill: none; }
.tables { display: grid; grid-template-columns: repeat(auto-fit, minmax(400px, 1fr)); gap: 14px; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid #dde1e8; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid #edf0f4; vertical-align: top; }
th { font-weight: 500; color: #5b6475; white-space: nowrap; width: 32%; }
td { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 13px; word-break: break-word; }
details { margin-top: 14px; }
summary { cursor: pointer; font-weight: 600; }
pre { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 12px; overflow: auto; font-size: 12px; }
.notes li { color: #8a5300; }
footer { color: #8a93a3; font-size: 12px; margin-top: 30px; }
)";

std::string table_html(const KeyValues& rows) {
  std::string out = "<table>\n";
  for (const auto& [key, value] : rows) {
    out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", html_escape(key), html_escape(value));
  }
  return out + "</table>\n";
}

std::string card_html(const std::string& value, const std::string& label) {
  return fmt::format("<div class=\"card\"><div class=\"value\">{}</div><div class=\"label\">{}</div></div>\n",
                     html_escape(value), html_escape(label));
}

std::string cards_html(const RunReport& report) {
  const std::vector<MetricsRecord>& records = report.metrics.records;
  std::string out = "<section class=\"cards\">\n";
  std::string of_iters;
  for (const auto& [key, value] : report.config_summary) {
    if (key == "train_iters") of_iters = " of " + value;
  }
  out += card_html(fmt::format("{}", records.back().step), "last logged step" + of_iters);
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (auto loss = it->values.find("loss"); loss != it->values.end()) {
      out += card_html(fmt::format("{:.4f}", loss->second), fmt::format("train loss at step {}", it->step));
      break;
    }
  }
  const MetricsRecord* best_eval = nullptr;
  for (const MetricsRecord& record : records) {
    auto eval = record.values.find("eval_loss");
    if (eval != record.values.end() && (best_eval == nullptr || eval->second < best_eval->values.at("eval_loss"))) {
      best_eval = &record;
    }
  }
  if (best_eval != nullptr) {
    out += card_html(fmt::format("{:.4f}", best_eval->values.at("eval_loss")),
                     fmt::format("best eval loss (step {})", best_eval->step));
  }
  if (auto tokens = median_of(values_of(report.metrics, "tokens_per_s"))) {
    out += card_html(fmt::format("{:.0f}", *tokens), "tokens/s (median)");
  }
  if (auto tflops = median_of(values_of(report.metrics, "tflops_per_gpu"))) {
    out += card_html(fmt::format("{:.3g}", *tflops), "TFLOP/s per GPU (median)");
  }
  return out + "</section>\n";
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '"') {
      out += "&quot;";
    } else if (c == '\'') {
      out += "&#39;";
    } else {
      out += c;
    }
  }
  return out;
}

MetricsFile parse_metrics_jsonl(std::string_view text, const std::string& path) {
  MetricsFile file;
  size_t begin = 0;
  for (int64_t line_number = 1; begin < text.size(); ++line_number) {
    size_t end = text.find('\n', begin);
    const bool terminated = end != std::string_view::npos;
    if (!terminated) end = text.size();
    const std::string_view line = trim(text.substr(begin, end - begin));
    begin = end + 1;
    if (line.empty()) continue;
    nlohmann::json record;
    std::string malformed;  // why the line does not parse; empty when it does
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      malformed = fmt::format("{}: malformed JSON: {}", error.byte, parse_error_reason(error));
    } catch (const nlohmann::json::out_of_range& error) {
      // A number past a double's range (1e999) is no parse error to nlohmann but out_of_range.406.
      malformed = fmt::format(" a number outside the range of a double: {}", error.what());
    }
    if (!malformed.empty()) {
      if (!terminated) {
        file.notes.push_back(fmt::format("{}:{}: skipped an incomplete last line (the run stopped while writing it)",
                                         path, line_number));
        break;
      }
      throw UsageError(fmt::format("{}:{}:{}", path, line_number, malformed));
    }
    if (!record.is_object()) {
      throw UsageError(fmt::format("{}:{}: expected a JSON object, got {}", path, line_number, record.type_name()));
    }
    auto step = record.find("step");
    if (step == record.end() || !step->is_number_integer()) {
      throw UsageError(fmt::format("{}:{}: the record has no integer \"step\"", path, line_number));
    }
    MetricsRecord parsed{step->get<int64_t>(), {}};
    for (const auto& [key, value] : record.items()) {
      if (key != "step" && value.is_number()) parsed.values[key] = value.get<double>();
    }
    file.records.push_back(std::move(parsed));
  }
  std::stable_sort(file.records.begin(), file.records.end(),
                   [](const MetricsRecord& a, const MetricsRecord& b) { return a.step < b.step; });
  return file;
}

KeyValues summarize_config(std::string_view yaml_text, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& error) {
    throw UsageError(fmt::format("{}:{}: malformed YAML: {}", path, error.mark.line + 1, error.msg));
  }
  KeyValues rows;
  if (!root.IsMap()) return rows;
  if (root["exp_name"]) rows.emplace_back("exp_name", one_line(root["exp_name"]));
  // render_effective_yaml names the preset in a comment, since its keys are copied under overrides.
  constexpr std::string_view kPresetComment = "# Model preset ";
  if (size_t at = yaml_text.find(kPresetComment); at != std::string_view::npos) {
    const std::string_view rest = yaml_text.substr(at + kPresetComment.size());
    rows.emplace_back("model preset", std::string(rest.substr(0, rest.find_first_of(" \n"))));
  }
  YAML::Node module;
  if (root["modules"] && root["modules"].IsMap() && root["modules"].size() > 0) {
    module = root["modules"].begin()->second;
  }
  if (!module.IsMap()) return rows;
  if (module["framework"]) rows.emplace_back("framework", one_line(module["framework"]));
  if (module["model"]) rows.emplace_back("model", one_line(module["model"]));
  const YAML::Node overrides = module["overrides"];
  if (!overrides.IsMap()) return rows;
  for (const char* key : kSummaryKeys) {
    if (overrides[key]) rows.emplace_back(key, one_line(overrides[key]));
  }
  return rows;
}

KeyValues run_summary(std::string_view log_text, const MetricsFile& metrics) {
  // Log lines look like "[2026-01-31 12:00:00.000] [primus] [info] message"; lines of a multi-line message
  // (the generated sample) have no brackets and are skipped.
  std::string started, model, data, resumed, done;
  std::vector<std::string> devices;
  int sessions = 0;
  size_t begin = 0;
  while (begin < log_text.size()) {
    size_t end = log_text.find('\n', begin);
    if (end == std::string_view::npos) end = log_text.size();
    std::string_view line = log_text.substr(begin, end - begin);
    begin = end + 1;
    if (!line.starts_with('[') || line.find("] ") == std::string_view::npos) continue;
    if (started.empty()) started = std::string(line.substr(1, line.find(']') - 1));
    for (int group = 0; group < 3 && line.starts_with('['); ++group) {
      const size_t close = line.find("] ");
      if (close == std::string_view::npos) break;
      line = line.substr(close + 2);
    }
    const std::string message(trim(line));
    if (message.starts_with("run directory: ")) {
      ++sessions;
      done.clear();
    } else if (message.starts_with("device: ")) {
      std::string device = message.substr(8);
      if (std::find(devices.begin(), devices.end(), device) == devices.end()) devices.push_back(device);
    } else if (message.starts_with("model: ")) {
      model = message.substr(7);
    } else if (message.starts_with("data: ")) {
      data = message.substr(6);
    } else if (message.starts_with("resumed from ")) {
      resumed = message.substr(13);
    } else if (message.starts_with("done: ")) {
      done = message.substr(6);
    }
  }
  KeyValues rows;
  std::string device_text;
  for (const std::string& device : devices) device_text += (device_text.empty() ? "" : "; ") + device;
  rows.emplace_back("device", devices.empty() ? "not recorded (no 'device:' line in the log)" : device_text);
  if (!model.empty()) rows.emplace_back("model", model);
  if (!data.empty()) rows.emplace_back("data", data);
  if (!started.empty()) rows.emplace_back("started", started);
  if (sessions > 1) rows.emplace_back("sessions", fmt::format("{} (last resumed from {})", sessions, resumed));
  if (sessions > 0) {
    rows.emplace_back("finished",
                      done.empty() ? "no: the last session has no 'done' line (stopped, failed or running)" : done);
  }
  std::vector<double> memory = values_of(metrics, "mem_peak_gib");
  if (!memory.empty()) {
    rows.emplace_back("peak device memory", fmt::format("{:.2f} GiB", *std::max_element(memory.begin(), memory.end())));
  }
  if (auto mfu = median_of(values_of(metrics, "mfu"))) rows.emplace_back("MFU (median)", fmt::format("{:.3f}", *mfu));
  return rows;
}

std::vector<Chart> report_charts(const MetricsFile& metrics) {
  std::vector<Chart> charts;
  for (const ChartSpec& spec : chart_specs()) {
    Chart chart{spec.title, spec.y_label, {}};
    for (size_t s = 0; s < spec.series.size(); ++s) {
      ChartSeries series{spec.series[s].first, spec.series[s].second, kSeriesColors[s % std::size(kSeriesColors)], {}};
      for (const MetricsRecord& record : metrics.records) {
        auto it = record.values.find(series.key);
        if (it != record.values.end()) series.points.emplace_back(static_cast<double>(record.step), it->second);
      }
      if (!series.points.empty()) chart.series.push_back(std::move(series));
    }
    if (!chart.series.empty()) charts.push_back(std::move(chart));
  }
  return charts;
}

std::string render_svg_chart(const Chart& chart) {
  // Plot area inside a 560 x 280 view box; the element scales with the page width.
  constexpr double kWidth = 560, kHeight = 280, kLeft = 64, kRight = 544, kTop = 34, kBottom = 236;
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const ChartSeries& series : chart.series) {
    for (const auto& [x, y] : series.points) {
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x), y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  }
  if (!(x_hi >= x_lo)) x_lo = x_hi = y_lo = y_hi = 0.0;  // no points at all: an empty frame
  const Axis x_axis = make_axis(x_lo, x_hi, /*whole_numbers=*/true);
  const Axis y_axis = make_axis(y_lo, y_hi, /*whole_numbers=*/false);
  auto px = [&](double x) { return kLeft + (x - x_axis.lo) / (x_axis.hi - x_axis.lo) * (kRight - kLeft); };
  auto py = [&](double y) { return kBottom - (y - y_axis.lo) / (y_axis.hi - y_axis.lo) * (kBottom - kTop); };

  std::string out = fmt::format(
      "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" role=\"img\">\n"
      "<title>{}</title>\n",
      kWidth, kHeight, html_escape(chart.title));
  for (double tick : y_axis.ticks) {
    out += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\"/>", kLeft, py(tick),
                       kRight, py(tick));
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", kLeft - 6, py(tick) + 4,
                       html_escape(format_number(tick)));
  }
  for (double tick : x_axis.ticks) {
    out += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\"/>", px(tick), kTop,
                       px(tick), kBottom);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(tick), kBottom + 16,
                       html_escape(format_number(tick)));
  }
  out += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", kLeft, kTop,
                     kRight - kLeft, kBottom - kTop);
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n", (kLeft + kRight) / 2, kHeight - 8);
  out += fmt::format("<text x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">{}</text>\n",
                     (kTop + kBottom) / 2, (kTop + kBottom) / 2, html_escape(chart.y_label));

  double legend_x = kLeft;
  for (const ChartSeries& series : chart.series) {
    const std::string color = html_escape(series.color);
    std::string points;
    for (const auto& [x, y] : drawn_points(series.points)) {
      points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", px(x), py(y));
    }
    out += fmt::format(
        "<polyline data-series=\"{}\" data-points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
        "stroke-linejoin=\"round\" points=\"{}\"/>\n",
        html_escape(series.key), series.points.size(), color, points);
    if (series.points.size() <= kMaxMarkedPoints) {
      for (const auto& [x, y] : series.points) {
        out += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.8\" fill=\"{}\"><title>step {}: {} {}</title></circle>\n", px(x),
            py(y), color, x, html_escape(series.label), html_escape(format_number(y)));
      }
    }
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"16\" x2=\"{:.1f}\" y2=\"16\" stroke=\"{}\" stroke-width=\"3\"/>",
                       legend_x, legend_x + 18, color);
    out += fmt::format("<text x=\"{:.1f}\" y=\"20\">{}</text>\n", legend_x + 24, html_escape(series.label));
    legend_x += 40 + 6.5 * static_cast<double>(series.label.size());
  }
  return out + "</svg>\n";
}

RunReport load_run_report(const std::string& run_dir) {
  const fs::path dir(run_dir);
  std::error_code error;
  if (!fs::exists(dir, error)) throw UsageError(fmt::format("run directory {} does not exist", run_dir));
  if (!fs::is_directory(dir, error)) throw UsageError(fmt::format("{} is not a directory", run_dir));
  const std::string metrics_path = (dir / "metrics.jsonl").string();
  if (!fs::exists(metrics_path, error)) {
    throw UsageError(fmt::format("{} not found: is {} a run directory written by 'primus-cli train pretrain'?",
                                 metrics_path, run_dir));
  }
  auto read_input = [](const std::string& path) {
    try {
      return read_file(path);
    } catch (const RuntimeError& e) {
      throw UsageError(e.what());
    }
  };

  RunReport report;
  report.run_dir = run_dir;
  report.metrics = parse_metrics_jsonl(read_input(metrics_path), metrics_path);
  if (report.metrics.records.empty()) {
    throw UsageError(
        fmt::format("{} has no metric records yet (the run writes one every log_interval steps)", metrics_path));
  }
  report.notes = report.metrics.notes;

  const std::string config_path = (dir / "config.yaml").string();
  if (fs::exists(config_path, error)) {
    report.config_yaml = read_input(config_path);
    report.config_summary = summarize_config(report.config_yaml, config_path);
  } else {
    report.notes.push_back(config_path + " not found: no config summary");
  }
  const std::string log_path = (dir / "logs" / "train.log").string();
  std::string log_text;
  if (fs::exists(log_path, error)) {
    log_text = read_input(log_path);
  } else {
    report.notes.push_back(log_path + " not found: the device is unknown");
  }
  report.run_info = run_summary(log_text, report.metrics);

  report.title = fs::absolute(dir).lexically_normal().filename().string();
  if (report.title.empty()) report.title = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  for (const auto& [key, value] : report.config_summary) {
    if (key == "exp_name") report.title = value;
  }
  return report;
}

std::string render_report_html(const RunReport& report) {
  const std::vector<MetricsRecord>& records = report.metrics.records;
  PRIMUS_CHECK(!records.empty(), "[report] no metric records to show");
  const std::string title = html_escape(report.title);
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>Run report: {}</title>\n<style>{}</style>\n</head>\n<body>\n<main>\n",
      title, kStyle);
  out += fmt::format("<h1>Run report: {}</h1>\n<p class=\"sub\">{} &middot; {} metric records, steps {} to {}{}</p>\n",
                     title, html_escape(report.run_dir), records.size(), records.front().step, records.back().step,
                     report.generated_at.empty() ? "" : " &middot; generated " + html_escape(report.generated_at));
  out += cards_html(report);

  out += "<h2>Charts</h2>\n<section class=\"charts\">\n";
  for (const Chart& chart : report_charts(report.metrics)) {
    out += fmt::format("<figure>\n<figcaption>{}</figcaption>\n{}</figure>\n", html_escape(chart.title),
                       render_svg_chart(chart));
  }
  out += "</section>\n";

  out += "<section class=\"tables\">\n<div>\n<h2>Run and hardware</h2>\n" + table_html(report.run_info) + "</div>\n";
  out += "<div>\n<h2>Config summary</h2>\n";
  out += report.config_summary.empty() ? "<p>No config.yaml in the run directory.</p>\n"
                                       : table_html(report.config_summary);
  out += "</div>\n</section>\n";
  if (!report.config_yaml.empty()) {
    out += "<details>\n<summary>Effective config (config.yaml)</summary>\n<pre>" + html_escape(report.config_yaml) +
           "</pre>\n</details>\n";
  }
  if (!report.notes.empty()) {
    out += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const std::string& note : report.notes) out += "<li>" + html_escape(note) + "</li>\n";
    out += "</ul>\n";
  }
  out += fmt::format(
      "<footer>Written by primus-cli report {} from metrics.jsonl, config.yaml and logs/train.log.</footer>\n",
      PRIMUS_VERSION);
  return out + "</main>\n</body>\n</html>\n";
}

}  // namespace primus
