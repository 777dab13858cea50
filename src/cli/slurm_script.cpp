// The pure half of `primus-cli slurm` (see slurm_script.h): argument parsing, merging with the config's slurm:
// section, the srun command and the sbatch script, host lists and srun's failure lines.
#include "cli/slurm_script.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <regex>
#include <sstream>

#include "config/config.h"
#include "core/error.h"

namespace primus::cli {
namespace {

enum class Field { kNodes, kPartition, kTime, kJobName, kAccount, kGpusPerNode, kOutput, kError, kNproc, kPort };

struct FlagSpec {
  Field field;
  const char* long_name;  // without the leading "--"
  char short_name;        // 0: none
  const char* canonical;  // the config key it matches, or our own option's name
};

constexpr FlagSpec kFlags[] = {
    {Field::kNodes, "nodes", 'N', "nodes"},
    {Field::kPartition, "partition", 'p', "partition"},
    {Field::kTime, "time", 't', "time"},
    {Field::kJobName, "job-name", 'J', "job_name"},
    {Field::kAccount, "account", 'A', "account"},
    {Field::kGpusPerNode, "gpus-per-node", 0, "gpus_per_node"},
    {Field::kOutput, "output", 'o', "output"},
    {Field::kError, "error", 'e', "error"},
    {Field::kNproc, "nproc-per-node", 0, "nproc_per_node"},
    {Field::kPort, "master-port", 0, "master_port"},
};

std::optional<int64_t> parse_count(const std::string& text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

const FlagSpec* find_long(const std::string& name) {
  for (const FlagSpec& spec : kFlags) {
    if (name == spec.long_name || name == spec.canonical) return &spec;  // --job_name too, as in the config
  }
  return nullptr;
}

const FlagSpec* find_short(char letter) {
  for (const FlagSpec& spec : kFlags) {
    if (spec.short_name != 0 && spec.short_name == letter) return &spec;
  }
  return nullptr;
}

void set_field(SlurmArguments& a, const FlagSpec& spec, const std::string& typed, const std::string& value) {
  auto count = [&](int64_t min) {
    std::optional<int64_t> number = parse_count(value);
    if (!number || *number < min) {
      throw UsageError(fmt::format("{}: expected a whole number >= {}, got '{}'", typed, min, value));
    }
    return *number;
  };
  if (value.empty()) throw UsageError(fmt::format("{}: the value must not be empty", typed));
  SlurmSettings& s = a.given;
  switch (spec.field) {
    case Field::kNodes:
      if (value.find('-') != std::string::npos) {
        throw UsageError(
            fmt::format("{}: a node range ('{}') is not supported; give one number of nodes", typed, value));
      }
      s.nodes = count(1);
      break;
    case Field::kPartition:
      s.partition = value;
      break;
    case Field::kTime:
      if (!is_slurm_time(value)) {
        throw UsageError(
            fmt::format("{}: '{}' is not a Slurm time (MINUTES, HOURS:MINUTES:SECONDS, "
                        "DAYS-HOURS[:MINUTES[:SECONDS]] or UNLIMITED)",
                        typed, value));
      }
      s.time = value;
      break;
    case Field::kJobName:
      s.job_name = value;
      break;
    case Field::kAccount:
      s.account = value;
      break;
    case Field::kGpusPerNode: {
      // Slurm reads [type:]count; the count is also how many workers each node starts.
      size_t colon = value.rfind(':');
      std::optional<int64_t> number = parse_count(colon == std::string::npos ? value : value.substr(colon + 1));
      if (!number || *number < 0) {
        throw UsageError(fmt::format("{}: expected [TYPE:]COUNT with a whole COUNT, got '{}'", typed, value));
      }
      s.gpus_per_node = *number;
      a.gpus_per_node_text = value;
      break;
    }
    case Field::kOutput:
      s.output = value;
      break;
    case Field::kError:
      s.error = value;
      break;
    case Field::kNproc:
      a.nproc_per_node = static_cast<int>(count(1));
      return;  // ours, not a Slurm setting
    case Field::kPort: {
      int64_t port = count(1);
      if (port > 65535) throw UsageError(fmt::format("{}: must be a TCP port, 1..65535", typed));
      a.master_port = static_cast<int>(port);
      return;
    }
  }
  s.sources[spec.canonical] = typed;
}

bool is_ntasks_flag(const std::string& word) {
  for (const char* flag : {"-n", "--ntasks", "--ntasks-per-node"}) {
    if (word == flag || word.starts_with(std::string(flag) + "=")) return true;
  }
  return word.size() > 2 && word.starts_with("-n") && word[2] != '-';  // -n4
}

// "--flag=value", "--flag value", "-Xvalue", "-X value", for the line of a dry run and a message.
std::string typed_flag(const std::string& flag, const std::string& value) { return flag + " " + value; }

}  // namespace

SlurmArguments parse_slurm_arguments(const std::vector<std::string>& words) {
  SlurmArguments a;
  size_t i = 0;
  // Global flags may come before the launcher word too.
  for (; i < words.size() && (words[i] == "--dry-run" || words[i] == "--debug"); ++i) {
    (words[i] == "--dry-run" ? a.dry_run : a.debug) = true;
  }
  if (i < words.size() && (words[i] == "srun" || words[i] == "sbatch" || words[i] == "node")) a.launcher = words[i++];
  const bool node = a.launcher == "node";
  for (; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word == "--dry-run" || word == "--debug") {
      (word == "--dry-run" ? a.dry_run : a.debug) = true;
      continue;
    }
    if (word == "srun" || word == "sbatch") {
      throw UsageError(
          fmt::format("'{}' must come first after 'slurm' (primus-cli slurm {} [flags] -- <command>)", word, word));
    }
    if (is_ntasks_flag(word)) {
      throw UsageError(fmt::format(
          "{}: primus-cli slurm runs one task per node, which starts that node's workers; set the workers per node "
          "with --nproc-per-node or --gpus-per-node",
          word));
    }
    const FlagSpec* spec = nullptr;
    std::string flag = word;
    std::optional<std::string> value;
    if (word.starts_with("--")) {
      size_t equals = word.find('=');
      flag = word.substr(0, equals);
      if (equals != std::string::npos) value = word.substr(equals + 1);
      spec = find_long(flag.substr(2));
    } else if (word.size() >= 2 && word[0] == '-') {
      spec = find_short(word[1]);
      if (spec != nullptr) {
        flag = word.substr(0, 2);
        if (word.size() > 2) value = word.substr(word[2] == '=' ? 3 : 2);
      }
    }
    if (spec == nullptr) {
      if (node) {
        throw UsageError(
            fmt::format("'{}': primus-cli slurm node takes only --nproc-per-node and --master-port "
                        "(Slurm flags belong to primus-cli slurm srun|sbatch)",
                        word));
      }
      if (!word.starts_with("-") && a.passthrough.empty()) {
        throw UsageError(fmt::format("'{}' is not a Slurm flag (expected srun, sbatch or flags before '--')", word));
      }
      if (a.launcher == "sbatch" && (word == "--wait" || word == "-W")) {
        a.wait = true;
        continue;
      }
      a.passthrough.push_back(word);
      continue;
    }
    if (node && spec->field != Field::kNproc && spec->field != Field::kPort) {
      throw UsageError(fmt::format("'{}': primus-cli slurm node takes only --nproc-per-node and --master-port", flag));
    }
    if (!value) {
      if (i + 1 >= words.size()) throw UsageError(fmt::format("{}: needs a value", flag));
      value = words[++i];
    }
    set_field(a, *spec, typed_flag(flag, *value), *value);
  }
  return a;
}

SlurmJob merge_slurm_job(const SlurmArguments& arguments, const SlurmSettings& config, const std::string& run_dir,
                         const std::string& default_job_name) {
  SlurmJob job;
  job.launcher = arguments.launcher;
  const SlurmSettings& flags = arguments.given;
  // A flag wins; else the config; else the default. Each chosen value is noted with where it came from.
  auto pick = [&](const char* key, const std::string& flag_value, const std::string& config_value,
                  const std::string& fallback, const std::string& fallback_origin) {
    if (flags.sources.contains(key)) {
      job.origins.push_back(fmt::format("{} {} (from {})", key, flag_value, flags.sources.at(key)));
      return flag_value;
    }
    if (config.sources.contains(key)) {
      job.origins.push_back(fmt::format("{} {} (from slurm.{} at {})", key, config_value, key, config.sources.at(key)));
      return config_value;
    }
    if (!fallback.empty()) job.origins.push_back(fmt::format("{} {} ({})", key, fallback, fallback_origin));
    return fallback;
  };
  auto count_text = [](const std::optional<int64_t>& v) { return v ? std::to_string(*v) : std::string(); };
  job.nodes = std::stoll(pick("nodes", count_text(flags.nodes), count_text(config.nodes), "1", "the default"));
  job.partition = pick("partition", flags.partition, config.partition, "", "");
  job.time = pick("time", flags.time, config.time, "", "");
  job.job_name = pick("job_name", flags.job_name, config.job_name, default_job_name, "the experiment's name");
  job.account = pick("account", flags.account, config.account, "", "");
  job.gpus_per_node = pick("gpus_per_node", arguments.gpus_per_node_text, count_text(config.gpus_per_node), "", "");
  std::string default_output = job.launcher == "sbatch" ? run_dir + "/slurm/job-%j.out" : std::string();
  job.output = pick("output", flags.output, config.output, default_output, "in the run directory");
  job.error = pick("error", flags.error, config.error, "", "");
  job.nproc_per_node = arguments.nproc_per_node;
  if (!job.nproc_per_node) {
    std::optional<int64_t> gpus = flags.gpus_per_node ? flags.gpus_per_node : config.gpus_per_node;
    if (gpus && *gpus > 0) job.nproc_per_node = static_cast<int>(*gpus);
  }
  job.master_port = arguments.master_port;
  job.passthrough = arguments.passthrough;
  job.wait = arguments.wait;
  job.debug = arguments.debug;
  return job;
}

std::vector<std::string> node_entry_argv(const SlurmJob& job, const std::string& executable,
                                         const std::vector<std::string>& command) {
  std::vector<std::string> argv{executable};
  if (job.debug) argv.push_back("--debug");
  argv.insert(argv.end(), {"slurm", "node"});
  if (job.nproc_per_node) argv.insert(argv.end(), {"--nproc-per-node", std::to_string(*job.nproc_per_node)});
  if (job.master_port) argv.insert(argv.end(), {"--master-port", std::to_string(*job.master_port)});
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

namespace {

// The job's Slurm flags in the order a Slurm user writes them, as --name=value.
std::vector<std::string> job_flags(const SlurmJob& job) {
  std::vector<std::string> flags{"--job-name=" + job.job_name, fmt::format("--nodes={}", job.nodes),
                                 "--ntasks-per-node=1"};
  auto add = [&](const char* name, const std::string& value) {
    if (!value.empty()) flags.push_back(fmt::format("--{}={}", name, value));
  };
  add("partition", job.partition);
  add("account", job.account);
  add("time", job.time);
  add("gpus-per-node", job.gpus_per_node);
  add("output", job.output);
  add("error", job.error);
  return flags;
}

}  // namespace

std::vector<std::string> srun_argv(const SlurmJob& job, const std::vector<std::string>& node_entry) {
  std::vector<std::string> argv{"srun"};
  std::vector<std::string> flags = job_flags(job);
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--kill-on-bad-exit=1");
  argv.insert(argv.end(), job.passthrough.begin(), job.passthrough.end());
  argv.insert(argv.end(), node_entry.begin(), node_entry.end());
  return argv;
}

std::string sbatch_script(const SlurmJob& job, const std::vector<std::string>& node_entry, const std::string& workdir,
                          const std::vector<std::string>& header) {
  std::string script = "#!/bin/bash\n";
  for (const std::string& line : header) script += "# " + line + "\n";
  for (const std::string& flag : job_flags(job)) script += "#SBATCH " + flag + "\n";
  script += "#SBATCH --chdir=" + workdir + "\n";
  // Other flags: one line each, with the words that follow a flag (its value when it takes one).
  std::string line;
  for (const std::string& word : job.passthrough) {
    if (word.starts_with("-") && !line.empty()) {
      script += "#SBATCH" + line + "\n";
      line.clear();
    }
    line += " " + word;
  }
  if (!line.empty()) script += "#SBATCH" + line + "\n";
  script +=
      "\n"
      "# One task per node: `primus-cli slurm node` takes NNODES, NODE_RANK and MASTER_ADDR from SLURM_NNODES,\n"
      "# SLURM_NODEID and the first host of the step's nodes (its NodeAddr), then starts the node's workers.\n"
      "# A failing node stops the others (--kill-on-bad-exit); its error and the rank's last lines are above.\n"
      "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " +
      shell_join(node_entry) +
      "\n"
      "status=$?\n"
      "if [ \"$status\" -ne 0 ]; then\n"
      "  echo \"primus-cli: error: slurm job ${SLURM_JOB_ID}: srun exited with code $status\" >&2\n"
      "fi\n"
      "exit \"$status\"\n";
  return script;
}

std::string shell_quote(const std::string& word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
  });
  if (safe) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string joined;
  for (const std::string& word : words) joined += (joined.empty() ? "" : " ") + shell_quote(word);
  return joined;
}

std::vector<std::string> expand_hostlist(const std::string& list) {
  auto bad = [&](const std::string& why) { return UsageError(fmt::format("host list '{}': {}", list, why)); };
  // Split at commas outside brackets.
  std::vector<std::string> parts;
  std::string part;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw bad("']' without '['");
    if (c == ',' && depth == 0) {
      parts.push_back(part);
      part.clear();
    } else {
      part += c;
    }
  }
  if (depth != 0) throw bad("'[' without ']'");
  parts.push_back(part);
  std::vector<std::string> hosts;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    // Expand the first bracket group, then the rest of the word recursively (n[1-2]-ib[0-1] has two).
    size_t open = p.find('[');
    if (open == std::string::npos) {
      hosts.push_back(p);
      continue;
    }
    size_t close = p.find(']', open);
    std::string prefix = p.substr(0, open);
    std::string suffix = p.substr(close + 1);
    std::vector<std::string> tails = suffix.empty() ? std::vector<std::string>{""} : expand_hostlist(suffix);
    std::stringstream ranges(p.substr(open + 1, close - open - 1));
    for (std::string range; std::getline(ranges, range, ',');) {
      size_t dash = range.find('-');
      std::string first = range.substr(0, dash);
      std::string last = dash == std::string::npos ? first : range.substr(dash + 1);
      std::optional<int64_t> lo = parse_count(first);
      std::optional<int64_t> hi = parse_count(last);
      if (!lo || !hi || *hi < *lo) throw bad(fmt::format("bad range '{}'", range));
      if (*hi - *lo > 100000) throw bad(fmt::format("range '{}' is too long", range));
      for (int64_t n = *lo; n <= *hi; ++n) {
        std::string number = std::to_string(n);
        if (number.size() < first.size()) number.insert(0, first.size() - number.size(), '0');
        for (const std::string& tail : tails) hosts.push_back(prefix + number + tail);
      }
    }
  }
  return hosts;
}

std::string parse_node_addr(const std::string& scontrol_output) {
  static const std::regex addr(R"((?:^|\s)NodeAddr=(\S+))");
  std::smatch match;
  if (!std::regex_search(scontrol_output, match, addr)) return "";
  return match[1];
}

std::optional<std::string> resolve_output_path(const std::string& pattern, const std::string& job_id,
                                               const std::string& job_name) {
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 >= pattern.size()) {
      path += pattern[i];
      continue;
    }
    char code = pattern[++i];
    if (code == 'j') {
      path += job_id;
    } else if (code == 'x') {
      path += job_name;
    } else if (code == '%') {
      path += '%';
    } else {
      return std::nullopt;
    }
  }
  return path;
}

std::optional<SrunFailure> find_failed_task(const std::string& srun_stderr) {
  static const std::regex line(R"(srun: error: (\S+): tasks? ([0-9,\-]+): (.*))");
  static const std::regex exited(R"(Exited with exit code (\d+))");
  std::vector<SrunFailure> failures;
  std::istringstream in(srun_stderr);
  for (std::string text; std::getline(in, text);) {
    std::smatch match;
    if (!std::regex_search(text, match, line)) continue;
    SrunFailure failure{match[1], match[2], match[3], -1};
    std::string status = match[3];
    std::smatch code;
    if (std::regex_search(status, code, exited)) {
      failure.exit_code = std::stoi(code[1]);
      failure.how = fmt::format("exited with code {}", failure.exit_code);
    } else if (status.starts_with("Killed")) {
      failure.how = "was killed";
    } else if (status.starts_with("Terminated")) {
      failure.how = "was terminated";
    }
    failures.push_back(failure);
  }
  if (failures.empty()) return std::nullopt;
  for (const SrunFailure& failure : failures) {
    const int code = failure.exit_code;
    if (code > 0 && code != 128 + SIGTERM && code != 128 + SIGKILL && code != 128 + SIGINT) return failure;
  }
  return failures.front();
}

}  // namespace primus::cli
