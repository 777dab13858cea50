// Resolution of the multi-process layout of `primus-cli direct` (see launch_layout.h): flags win over the
// environment that Primus's scripts and Slurm wrappers set (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT),
// which wins over the defaults. Every bad value names where it came from, a flag or a variable.
#include "cli/launch_layout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace primus::cli {
namespace {

// A value and how to name it in a message: "--nnodes 3" or "NNODES=3 (from the environment)".
template <typename T>
struct Sourced {
  T value;
  std::string origin;
};

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int parse_environment_int(const char* name, const std::string& text, const char* flag) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    throw UsageError(
        fmt::format("{}={} (from the environment): not a whole number; fix it or pass {}", name, text, flag));
  }
  return value;
}

// The flag's value when given, else the variable's, else `fallback`.
Sourced<int> pick_int(const std::optional<int>& flag_value, const char* flag, const char* variable, int fallback) {
  if (flag_value) return {*flag_value, fmt::format("{} {}", flag, *flag_value)};
  if (auto text = environment(variable)) {
    int value = parse_environment_int(variable, *text, flag);
    return {value, fmt::format("{}={} (from the environment)", variable, value)};
  }
  return {fallback, fmt::format("{} {} (the default)", flag, fallback)};
}

// The visible-devices variable that is set, CUDA's first, with its entry count. An entry starting with '-'
// (CUDA_VISIBLE_DEVICES=-1) hides it and every later one, as the CUDA runtime reads the list.
std::optional<std::pair<std::string, int>> visible_devices_list() {
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}) {
    auto text = environment(name);
    if (!text) continue;
    int count = 0;
    size_t start = 0;
    while (start <= text->size()) {
      size_t comma = text->find(',', start);
      std::string entry = text->substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (entry.starts_with("-")) break;
      if (!entry.empty()) ++count;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return std::pair<std::string, int>(name, count);
  }
  return std::nullopt;
}

int nvidia_device_files() {
  int count = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", error)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.starts_with("nvidia") && name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++count;
    }
  }
  return count;
}

}  // namespace

bool is_launched_worker() { return environment(kLaunchedVariable) == std::optional<std::string>("1"); }

int visible_gpu_count() {
  if (auto list = visible_devices_list()) return list->second;
  return nvidia_device_files();
}

LaunchLayout resolve_launch_layout(const LaunchRequest& request, bool uses_devices) {
  LaunchLayout layout;
  if (!uses_devices && !request.any_given()) return layout;  // config, data, report: one run, here

  int gpus = visible_gpu_count();
  Sourced<int> nproc =
      request.nproc_per_node
          ? Sourced<int>{*request.nproc_per_node, fmt::format("--nproc-per-node {}", *request.nproc_per_node)}
          : Sourced<int>{std::max(gpus, 1), "--nproc-per-node (the number of visible GPUs, else 1)"};
  Sourced<int> nnodes = pick_int(request.nnodes, "--nnodes", "NNODES", 1);
  Sourced<int> node_rank = pick_int(request.node_rank, "--node-rank", "NODE_RANK", 0);
  Sourced<int> port = pick_int(request.master_port, "--master-port", "MASTER_PORT", 29500);
  std::string addr_origin = "--master-addr";
  std::string addr = "127.0.0.1";
  if (request.master_addr) {
    addr = *request.master_addr;
  } else if (auto text = environment("MASTER_ADDR")) {
    addr = *text;
    addr_origin = "MASTER_ADDR (from the environment)";
  }

  if (nproc.value < 1) throw UsageError(fmt::format("{}: must be at least 1", nproc.origin));
  if (nnodes.value < 1) throw UsageError(fmt::format("{}: must be at least 1", nnodes.origin));
  if (node_rank.value < 0 || node_rank.value >= nnodes.value) {
    throw UsageError(fmt::format("{}: must be in 0..{} for {}", node_rank.origin, nnodes.value - 1, nnodes.origin));
  }
  if (port.value < 1 || port.value > 65535) {
    throw UsageError(fmt::format("{}: must be a TCP port, 1..65535", port.origin));
  }
  if (addr.empty()) throw UsageError(fmt::format("{}: must not be empty", addr_origin));

  layout.nproc_per_node = nproc.value;
  layout.nnodes = nnodes.value;
  layout.node_rank = node_rank.value;
  layout.master_addr = addr;
  layout.master_port = port.value;
  layout.multi_process = request.any_given() || layout.nproc_per_node > 1 || layout.nnodes > 1;
  if (!layout.multi_process) return layout;

  // A preset list is kept as it is (it may be another job's boundary on a shared node); each worker picks
  // its device by LOCAL_RANK within it, so a count that differs from N leaves GPUs idle or shares them.
  if (auto list = visible_devices_list(); list && list->second != layout.nproc_per_node) {
    spdlog::warn("launcher: {} lists {} device(s) but {} workers start on this node; it is kept as it is", list->first,
                 list->second, layout.nproc_per_node);
  }
  if (layout.nnodes > 1 && (addr == "127.0.0.1" || addr == "localhost")) {
    spdlog::warn("launcher: {} nodes but the master address is {}: the other nodes cannot reach it (set --master-addr)",
                 layout.nnodes, addr);
  }
  return layout;
}

std::vector<std::pair<std::string, std::string>> worker_environment(const LaunchLayout& layout, int local_rank) {
  return {
      {"RANK", std::to_string(layout.global_rank(local_rank))},
      {"WORLD_SIZE", std::to_string(layout.world_size())},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(layout.nproc_per_node)},
      {"GROUP_RANK", std::to_string(layout.node_rank)},
      {"NNODES", std::to_string(layout.nnodes)},
      {"NODE_RANK", std::to_string(layout.node_rank)},
      {"MASTER_ADDR", layout.master_addr},
      {"MASTER_PORT", std::to_string(layout.master_port)},
      {kLaunchedVariable, "1"},
  };
}

void print_launch_plan(const LaunchLayout& layout, const std::vector<std::string>& worker_argv) {
  auto line = [](const std::string& label, const std::string& value) { fmt::print("  {:<12} {}\n", label, value); };
  line("workers",
       fmt::format("{} on this node (node {} of {}, world size {}), master {}:{}", layout.nproc_per_node,
                   layout.node_rank, layout.nnodes, layout.world_size(), layout.master_addr, layout.master_port));
  std::string argv;
  for (const std::string& word : worker_argv) argv += (argv.empty() ? "" : " ") + word;
  line("worker argv", argv);
  for (int local = 0; local < layout.nproc_per_node; ++local) {
    std::string env;
    for (const auto& [key, value] : worker_environment(layout, local))
      env += (env.empty() ? "" : " ") + key + "=" + value;
    line(fmt::format("rank {}", layout.global_rank(local)), env);
  }
  std::fflush(stdout);
}

}  // namespace primus::cli
