// `primus-cli report`: one self-contained HTML page about a training run, for people who would rather look
// than read. It draws the run directory's metrics.jsonl as inline SVG charts (loss and eval loss, learning
// rate, throughput, TFLOP/s, ...) and lists the config summary and the device the run used. The page has
// inline CSS and no scripts, fonts or images from elsewhere, so it opens offline and can be mailed around.
//
// Everything here but load_run_report is a pure function of its arguments (unit-testable); every piece of
// text that comes from a file goes through html_escape.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primus {

// One line of metrics.jsonl (see src/train/pretrain.cpp for the fields it writes).
struct MetricsRecord {
  int64_t step = 0;
  std::map<std::string, double> values;  // every numeric field but "step"; nulls and non-numbers left out
};

struct MetricsFile {
  std::vector<MetricsRecord> records;  // sorted by step (stable)
  std::vector<std::string> notes;      // what was skipped, e.g. the torn last line of a killed run
};

// Parses the text of a metrics.jsonl file named `path`. Throws UsageError "PATH:LINE: ..." (or
// "PATH:LINE:COLUMN: ...") for a line that is not a JSON object with an integer "step". A last line without
// its newline that does not parse is what a run killed mid-write leaves: it is skipped with a note.
MetricsFile parse_metrics_jsonl(std::string_view text, const std::string& path);

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// The summary rows of an effective config.yaml (experiment, preset, model shape, batch, schedule, data,
// device), in a fixed order, for the keys the file has. Throws UsageError "PATH:LINE: ..." on bad YAML.
KeyValues summarize_config(std::string_view yaml_text, const std::string& path);

// Rows about where and how the run ran, from the run's log (logs/train.log: the "device:", "model:",
// "data:" and "done:" lines that the trainer writes) and from the metrics (peak memory and MFU on a GPU).
KeyValues run_summary(std::string_view log_text, const MetricsFile& metrics);

struct ChartSeries {
  std::string key;    // metrics field, e.g. "eval_loss"; also the polyline's data-series attribute
  std::string label;  // legend text
  std::string color;  // CSS colour
  std::vector<std::pair<double, double>> points;  // (step, value), ascending step
};

struct Chart {
  std::string title;
  std::string y_label;
  std::vector<ChartSeries> series;
};

// The charts for these metrics: loss (train and eval), learning rate, tokens/s, TFLOP/s per GPU, MFU,
// gradient norm, step time, peak memory; a chart whose fields never occur is left out.
std::vector<Chart> report_charts(const MetricsFile& metrics);

// One chart as an inline <svg> element: axes with ticks, one <polyline> per series carrying
// data-series="KEY" data-points="N" (N: the series' points; more than 2,000 are drawn as the minimum and
// maximum of 1,000 step buckets, so spikes stay visible), and a circle with a tooltip per point on series of
// at most 60 points.
std::string render_svg_chart(const Chart& chart);

// Everything the page shows; load_run_report fills it from a run directory.
struct RunReport {
  std::string run_dir;
  std::string title;         // exp_name, or the directory's name
  std::string generated_at;  // shown in the header; set by the caller
  MetricsFile metrics;
  KeyValues config_summary;
  std::string config_yaml;  // the whole effective config, shown folded; empty when the run has none
  KeyValues run_info;
  std::vector<std::string> notes;  // missing optional files, skipped lines
};

// Reads RUN_DIR/metrics.jsonl (required), RUN_DIR/config.yaml and RUN_DIR/logs/train.log (optional: a note
// when absent). Throws UsageError naming the path for a missing directory or metrics file, a metrics file
// without records, and for malformed lines (with their line number).
RunReport load_run_report(const std::string& run_dir);

// The whole HTML page.
std::string render_report_html(const RunReport& report);

// Escapes & < > " ' for use in HTML text and attribute values.
std::string html_escape(std::string_view text);

}  // namespace primus
