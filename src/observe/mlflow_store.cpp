// The MLflow file store writer (see mlflow_store.h): experiment lookup and creation, run creation and reopening,
// meta.yaml in PyYAML's shape, metric/param/tag files, and the metrics.jsonl -> MLflow key table.
#include "observe/mlflow_store.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultExperimentId = "0";
constexpr const char* kTrashDir = ".trash";
constexpr int kSourceTypeLocal = 4;  // MLflow's SourceType.LOCAL

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::mt19937_64& random_engine() {
  static std::mt19937_64 engine([] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }());
  return engine;
}

// 32 lowercase hex digits, the shape of MLflow's uuid4().hex run ids.
std::string new_run_id() { return fmt::format("{:016x}{:016x}", random_engine()(), random_engine()()); }

// An 18-digit decimal integer without a leading zero, the shape of MLflow's experiment ids.
std::string new_experiment_id() {
  std::uniform_int_distribution<int> first(1, 9), digit(0, 9);
  std::string id(1, static_cast<char>('0' + first(random_engine())));
  while (id.size() < 18) id.push_back(static_cast<char>('0' + digit(random_engine())));
  return id;
}

// file:// URI of an absolute path, percent-encoding all but unreserved characters and '/' (Python's
// pathlib.Path.as_uri, which MLflow uses for local artifact locations).
std::string file_uri(const std::string& absolute_path) {
  std::string uri = "file://";
  for (unsigned char c : absolute_path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      uri.push_back(static_cast<char>(c));
    } else {
      uri += fmt::format("%{:02X}", c);
    }
  }
  return uri;
}

// An experiment or run id as MLflow allows them (letters, digits, '_', '-'): a single path component.
bool plain_id(const std::string& id) {
  return !id.empty() &&
         std::all_of(id.begin(), id.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
}

std::string absolute_normal(const std::string& path) { return fs::absolute(path).lexically_normal().string(); }

void make_dirs(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw RuntimeError(fmt::format("[mlflow] cannot create directory {}: {}", dir.string(), error.message()));
}

// A meta.yaml as a YAML map; an unreadable or malformed file gives a null node (MLflow skips those too).
YAML::Node read_meta(const fs::path& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return YAML::Node();
  try {
    YAML::Node node = YAML::Load(read_file(path.string()));
    return node.IsMap() ? node : YAML::Node();
  } catch (const std::exception&) {
    return YAML::Node();
  }
}

std::string meta_string(const YAML::Node& meta, const char* key) {
  const YAML::Node value = meta[key];
  return value && value.IsScalar() ? value.Scalar() : std::string();
}

void write_experiment_meta(const std::string& root, const std::string& id, const std::string& name) {
  const std::string dir = root + "/" + id;
  make_dirs(dir);
  const int64_t now = now_ms();
  write_file_atomic(dir + "/meta.yaml", fmt::format("artifact_location: {}\n"
                                                    "creation_time: {}\n"
                                                    "experiment_id: {}\n"
                                                    "last_update_time: {}\n"
                                                    "lifecycle_stage: active\n"
                                                    "name: {}\n",
                                                    mlflow_yaml_scalar(file_uri(dir)), now, mlflow_yaml_scalar(id), now,
                                                    mlflow_yaml_scalar(name)));
}

// The id of the active experiment called `name` under `root`, or "" (several: the smallest id, for a stable pick).
std::string find_experiment(const std::string& root, const std::string& name) {
  std::vector<std::string> ids;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    const std::string id = entry.path().filename().string();
    if (id == kTrashDir || !entry.is_directory()) continue;
    const YAML::Node meta = read_meta(entry.path() / "meta.yaml");
    if (!meta) continue;
    if (meta_string(meta, "name") == name && meta_string(meta, "lifecycle_stage") == "active" &&
        meta_string(meta, "experiment_id") == id) {
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  return ids.empty() ? std::string() : ids.front();
}

std::string create_experiment(const std::string& root, const std::string& name) {
  std::string id;
  do {
    id = new_experiment_id();
  } while (fs::exists(root + "/" + id) || fs::exists(root + "/" + kTrashDir + "/" + id));
  write_experiment_meta(root, id, name);
  return id;
}

// Parses "<timestamp> <value> [<step>]" (MLflow accepts 2 or 3 fields); the step, or nullopt when malformed.
std::optional<int64_t> metric_line_step(const std::string& line) {
  std::istringstream in(line);
  std::string fields[4];
  int n = 0;
  while (n < 4 && in >> fields[n]) ++n;
  if (n != 2 && n != 3) return std::nullopt;
  try {
    size_t used = 0;
    std::stoll(fields[0], &used);
    if (used != fields[0].size()) return std::nullopt;
    std::stod(fields[1], &used);  // accepts nan and inf as Python's float() does
    if (used != fields[1].size()) return std::nullopt;
    if (n == 2) return 0;
    const int64_t step = std::stoll(fields[2], &used);
    if (used != fields[2].size()) return std::nullopt;
    return step;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Drops every value logged after `keep_through_step`, and an unterminated (torn) last line, from the metric files.
void cut_metrics_back(const fs::path& metrics_dir, int64_t keep_through_step) {
  std::error_code error;
  if (!fs::is_directory(metrics_dir, error)) return;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(metrics_dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string path = entry.path().string();
    const std::string text = read_file(path);
    std::string kept;
    size_t begin = 0;
    while (begin < text.size()) {
      const size_t end = text.find('\n', begin);
      if (end == std::string::npos) break;  // torn: the writer ends every line with '\n'
      const std::string line = text.substr(begin, end - begin);
      const std::optional<int64_t> step = metric_line_step(line);
      if (step && *step <= keep_through_step) kept += line + "\n";
      begin = end + 1;
    }
    if (kept != text) write_file_atomic(path, kept);
  }
}

// Writes `value` to <run>/<folder>/<key> (no trailing newline, as MLflow writes params and tags).
void write_key_file(const std::string& run_path, const char* folder, const std::string& key, const std::string& value,
                    const char* what) {
  if (!mlflow_valid_key(key)) {
    throw UsageError(
        fmt::format("[mlflow] '{}' is not a valid {} name: names may only contain letters, digits, "
                    "'_', '-', '.', ' ' and '/', and must not resolve to another path",
                    key, what));
  }
  const fs::path path = fs::path(run_path) / folder / key;
  make_dirs(path.parent_path());
  // A plain write, as MLflow's: no fsync for each of the ~80 params (meta.yaml is the file written atomically).
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << value;
  out.close();
  if (!out) throw RuntimeError(fmt::format("[mlflow] cannot write {}", path.string()));
}

// Lowercase hex with a digit a-d or f somewhere (a run id): no YAML 1.1 or 1.2 number, date or bool, unless it is
// a 0b binary literal.
bool plain_hex(std::string_view text) {
  return text.find_first_not_of("0123456789abcdef") == std::string_view::npos &&
         text.find_first_of("abcdf") != std::string_view::npos && text.substr(0, 2) != "0b";
}

bool plain_yaml_safe(std::string_view text) {
  if (text.empty()) return false;
  if (plain_hex(text)) return true;
  const unsigned char first = static_cast<unsigned char>(text.front());
  if (!(std::isalpha(first) || first == '_' || first == '/')) return false;  // no numbers, dates, indicators
  if (text.back() == ' ' || text.back() == ':') return false;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const bool allowed =
        std::isalnum(c) || c == '_' || c == '.' || c == '/' || c == '+' || c == '-' || c == '@' || c == ':' || c == ' ';
    if (!allowed) return false;
    if (c == ':' && i + 1 < text.size() && text[i + 1] == ' ') return false;
  }
  // Words that YAML 1.1 (PyYAML) or 1.2 would read as booleans or null.
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::array<const char*, 11> kReserved = {"y",  "n",   "yes",  "no",  "true", "false",
                                                        "on", "off", "null", "nan", "inf"};
  return std::find(kReserved.begin(), kReserved.end(), lower) == kReserved.end();
}

void flatten_yaml(const YAML::Node& node, const std::string& path, MlflowKeyValues& out) {
  if (node.IsMap()) {
    if (node.size() == 0 && !path.empty()) out.emplace_back(path, "{}");
    for (const auto& item : node) {
      const std::string key = item.first.Scalar();
      flatten_yaml(item.second, path.empty() ? key : path + "." + key, out);
    }
    return;
  }
  if (path.empty()) return;
  if (node.IsNull()) {
    out.emplace_back(path, "null");
  } else if (node.IsScalar()) {
    out.emplace_back(path, node.Scalar());
  } else {
    YAML::Emitter flow;
    flow << YAML::Flow << node;
    out.emplace_back(path, flow.c_str());
  }
}

// Replaces characters MLflow refuses in a key by '_', and collapses path shapes it refuses ("a//b", "/a", "a/").
std::string sanitize_key(std::string_view name) {
  std::string key;
  for (unsigned char c : name) {
    const bool ok = std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ' ' || c == '/';
    key.push_back(ok ? static_cast<char>(c) : '_');
  }
  std::string out;
  std::istringstream parts(key);
  for (std::string part; std::getline(parts, part, '/');) {
    if (part.empty() || part == ".") continue;
    if (part == "..") part = "__";
    out += (out.empty() ? "" : "/") + part;
  }
  return out.empty() ? "_" : out;
}

// The numbers of a metrics record under their MLflow keys; nested objects become key paths ("a": {"b": 1} -> a/b).
void collect_numbers(const nlohmann::json& object, const std::string& prefix,
                     std::vector<std::pair<std::string, double>>& out) {
  for (const auto& [name, value] : object.items()) {
    if (prefix.empty() && name == "step") continue;
    if (value.is_object()) {
      collect_numbers(value, prefix + name + "/", out);
    } else if (value.is_number()) {
      out.emplace_back(prefix.empty() ? mlflow_metric_key(name) : sanitize_key(prefix + name), value.get<double>());
    }
  }
}

}  // namespace

std::string mlflow_number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string mlflow_yaml_scalar(std::string_view text) {
  if (plain_yaml_safe(text)) return std::string(text);
  const bool control =
      std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; });
  std::string out;
  if (!control) {
    out = "'";
    for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  }
  out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          out += fmt::format("\\x{:02X}", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

bool mlflow_valid_key(std::string_view key) {
  if (key.empty() || key.size() > 250 || key.front() == '/' || key.back() == '/') return false;
  for (unsigned char c : key) {
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ' ' || c == '/')) return false;
  }
  // MLflow refuses names that a path normalisation would change (they could alias another file).
  size_t begin = 0;
  while (begin <= key.size()) {
    const size_t end = std::min(key.find('/', begin), key.size());
    const std::string_view part = key.substr(begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    begin = end + 1;
  }
  return true;
}

std::string mlflow_metric_key(std::string_view metrics_name) {
  static const std::array<std::pair<const char*, const char*>, 15> kTable = {{
      {"loss", "train/loss"},
      {"lr", "train/lr"},
      {"grad_norm", "train/grad_norm"},
      {"consumed_samples", "train/consumed_samples"},
      {"eval_loss", "eval/loss"},
      {"tokens_per_s", "perf/tokens_per_s"},
      {"tflops_per_gpu", "perf/tflops_per_gpu"},
      {"mfu", "perf/mfu"},
      {"mem_peak_gib", "memory/peak_gib"},
      {"step_ms", "time/step_ms"},
      {"elapsed_s", "time/elapsed_s"},
      {"data_ms", "time/data_ms"},
      {"forward_ms", "time/forward_ms"},
      {"backward_ms", "time/backward_ms"},
      {"optimizer_ms", "time/optimizer_ms"},
  }};

  for (const auto& [ours, theirs] : kTable) {
    if (metrics_name == ours) return theirs;
  }
  return sanitize_key(metrics_name);
}

MlflowKeyValues mlflow_config_params(const std::string& effective_yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(effective_yaml);
  } catch (const YAML::Exception& error) {
    throw RuntimeError(fmt::format("[mlflow] the effective config does not parse as YAML: {}", error.what()));
  }
  MlflowKeyValues flat;
  flatten_yaml(root, "", flat);
  MlflowKeyValues params;
  for (auto& [path, value] : flat) {
    // modules.<module>.overrides.<key> -> <key>, the name `config show` and the schema use.
    const size_t overrides = path.find(".overrides.");
    std::string key = path.rfind("modules.", 0) == 0 && overrides != std::string::npos
                          ? path.substr(overrides + std::string_view(".overrides.").size())
                          : path;
    params.emplace_back(sanitize_key(key), std::move(value));
  }
  return params;
}

MlflowRun::MlflowRun(const MlflowRunOptions& options)
    : root_(absolute_normal(options.tracking_dir)), run_name_(options.run_name), user_(options.user) {
  if (options.experiment_name.empty()) throw UsageError("[mlflow] the experiment name is empty");
  std::error_code error;
  if (fs::exists(root_, error) && !fs::is_directory(root_, error)) {
    throw UsageError(fmt::format("[mlflow] tracking directory {} is not a directory", root_));
  }
  if (!fs::exists(root_, error)) {
    make_dirs(root_);
    write_experiment_meta(root_, kDefaultExperimentId, "Default");  // a new MLflow store starts with it
  }
  make_dirs(root_ + "/" + kTrashDir);

  // Reopen the run recorded in the run directory when it is still an active run of this store.
  if (!options.resume_file.empty() && fs::exists(options.resume_file, error)) {
    const nlohmann::json saved = nlohmann::json::parse(read_file(options.resume_file), nullptr, false);
    if (saved.is_object() && saved.value("tracking_dir", "") == root_) {
      const std::string experiment = saved.value("experiment_id", "");
      const std::string run = saved.value("run_id", "");
      const YAML::Node meta = plain_id(experiment) && plain_id(run)
                                  ? read_meta(fs::path(root_) / experiment / run / "meta.yaml")
                                  : YAML::Node();
      if (meta && meta_string(meta, "lifecycle_stage") == "active" && meta_string(meta, "run_id") == run) {
        experiment_id_ = experiment;
        run_id_ = run;
        reopened_ = true;
        run_name_ = meta_string(meta, "run_name");  // keeps a rename made in the UI
        user_ = meta_string(meta, "user_id");
        artifact_uri_ = meta_string(meta, "artifact_uri");
        try {
          start_time_ms_ = meta["start_time"].as<int64_t>();
        } catch (const YAML::Exception&) {
          start_time_ms_ = now_ms();
        }
      }
    }
  }
  if (!reopened_) {
    experiment_id_ = find_experiment(root_, options.experiment_name);
    if (experiment_id_.empty()) experiment_id_ = create_experiment(root_, options.experiment_name);
    run_id_ = new_run_id();
    start_time_ms_ = now_ms();
    const YAML::Node experiment = read_meta(fs::path(root_) / experiment_id_ / "meta.yaml");
    const std::string location = meta_string(experiment, "artifact_location");
    artifact_uri_ =
        (location.empty() ? file_uri(root_ + "/" + experiment_id_) : location) + "/" + run_id_ + "/artifacts";
  }
  run_path_ = root_ + "/" + experiment_id_ + "/" + run_id_;
  for (const char* folder : {"metrics", "params", "tags", "artifacts"}) make_dirs(run_path_ + "/" + folder);
  if (reopened_) cut_metrics_back(run_path_ + "/metrics", options.keep_through_step);
  write_meta(MlflowRunStatus::kRunning, 0);

  set_tag("mlflow.runName", run_name_);
  set_tag("mlflow.user", user_);
  set_tag("mlflow.source.type", "LOCAL");
  for (const auto& [key, value] : options.tags) set_tag(key, value);
  for (const auto& [key, value] : options.params) log_param(key, value);

  if (!options.resume_file.empty()) {
    const nlohmann::json saved = {{"tracking_dir", root_}, {"experiment_id", experiment_id_}, {"run_id", run_id_}};
    write_file_atomic(options.resume_file, saved.dump(2) + "\n");
  }
}

MlflowRun::~MlflowRun() {
  if (finished_) return;
  try {
    finish(MlflowRunStatus::kFailed);
  } catch (...) {  // a destructor must not throw; the run stays RUNNING in the store
  }
}

void MlflowRun::write_meta(MlflowRunStatus status, int64_t end_time_ms) {
  // Keys in sorted order, as MLflow's write_yaml (PyYAML, sort_keys) writes them.
  write_file_atomic(
      run_path_ + "/meta.yaml",
      fmt::format("artifact_uri: {}\n"
                  "end_time: {}\n"
                  "entry_point_name: ''\n"
                  "experiment_id: {}\n"
                  "lifecycle_stage: active\n"
                  "run_id: {}\n"
                  "run_name: {}\n"
                  "run_uuid: {}\n"
                  "source_name: ''\n"
                  "source_type: {}\n"
                  "source_version: ''\n"
                  "start_time: {}\n"
                  "status: {}\n"
                  "tags: []\n"
                  "user_id: {}\n",
                  mlflow_yaml_scalar(artifact_uri_), end_time_ms > 0 ? std::to_string(end_time_ms) : "null",
                  mlflow_yaml_scalar(experiment_id_), mlflow_yaml_scalar(run_id_), mlflow_yaml_scalar(run_name_),
                  mlflow_yaml_scalar(run_id_), kSourceTypeLocal, start_time_ms_, static_cast<int>(status),
                  mlflow_yaml_scalar(user_)));
}

void MlflowRun::log_metric(const std::string& key, double value, int64_t step, int64_t timestamp_ms) {
  auto it = metric_files_.find(key);
  if (it == metric_files_.end()) {
    if (!mlflow_valid_key(key)) {
      throw UsageError(
          fmt::format("[mlflow] '{}' is not a valid metric name: names may only contain letters, "
                      "digits, '_', '-', '.', ' ' and '/', and must not resolve to another path",
                      key));
    }
    const fs::path path = fs::path(run_path_) / "metrics" / key;
    make_dirs(path.parent_path());
    auto file = std::make_unique<std::ofstream>(path, std::ios::app);
    if (!*file) throw RuntimeError(fmt::format("[mlflow] cannot open {} for appending", path.string()));
    it = metric_files_.emplace(key, std::move(file)).first;
  }
  *it->second << (timestamp_ms < 0 ? now_ms() : timestamp_ms) << ' ' << mlflow_number(value) << ' ' << step << '\n';
  if (!*it->second) throw RuntimeError(fmt::format("[mlflow] write to {}/metrics/{} failed", run_path_, key));
}

void MlflowRun::log_metrics(const nlohmann::json& record) {
  PRIMUS_CHECK(record.contains("step") && record["step"].is_number_integer(),
               "[mlflow] a metrics record needs an integer \"step\": {}", record.dump());
  const int64_t step = record["step"].get<int64_t>();
  const int64_t timestamp = now_ms();
  std::vector<std::pair<std::string, double>> values;
  collect_numbers(record, "", values);
  for (const auto& [key, value] : values) log_metric(key, value, step, timestamp);
  flush();
}

void MlflowRun::log_param(const std::string& key, const std::string& value) {
  write_key_file(run_path_, "params", key, value, "param");
}

void MlflowRun::set_tag(const std::string& key, const std::string& value) {
  write_key_file(run_path_, "tags", key, value, "tag");
}

void MlflowRun::flush() {
  for (auto& [key, file] : metric_files_) {
    file->flush();
    if (!*file) throw RuntimeError(fmt::format("[mlflow] write to {}/metrics/{} failed", run_path_, key));
  }
}

void MlflowRun::finish(MlflowRunStatus status) {
  finished_ = true;
  flush();
  metric_files_.clear();
  write_meta(status, now_ms());
}

}  // namespace primus
