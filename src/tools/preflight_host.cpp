// Preflight's host and network checks: /proc and /sys, uname, getrlimit, statvfs, getifaddrs. Nothing here needs
// a GPU or privileges; what cannot be read is reported as such.
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tools/preflight_checks.h"

namespace primus::preflight {

namespace fs = std::filesystem;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

// "key : value" lines (cpuinfo, meminfo): the values of `key`, in order.
std::vector<std::string> values_of(const std::string& text, const std::string& key) {
  std::vector<std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(':');
    if (colon != std::string::npos && trim(line.substr(0, colon)) == key) out.push_back(trim(line.substr(colon + 1)));
  }
  return out;
}

// /proc/meminfo values are "12345 kB".
double meminfo_bytes(const std::string& text, const std::string& key) {
  std::vector<std::string> v = values_of(text, key);
  if (v.empty()) return -1.0;
  return std::strtod(v.front().c_str(), nullptr) * 1024.0;
}

std::string limit_text(rlim_t value) {
  return value == RLIM_INFINITY ? std::string("unlimited") : std::to_string(static_cast<unsigned long long>(value));
}

std::string bytes_limit_text(rlim_t value) {
  if (value == RLIM_INFINITY) return "unlimited";
  const double v = static_cast<double>(value);
  return v >= kGiB ? format_gib(v) : fmt::format("{:g} MiB", v / (1024.0 * 1024.0));
}

void add_cpu(Checks& out) {
  const std::string cpuinfo = read_file_text("/proc/cpuinfo");
  std::vector<std::string> models = values_of(cpuinfo, "model name");
  if (models.empty()) models = values_of(cpuinfo, "Model");  // aarch64
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  // Physical cores: distinct (physical id, core id) pairs, where the kernel lists them.
  std::set<std::pair<std::string, std::string>> cores;
  std::vector<std::string> packages = values_of(cpuinfo, "physical id"), core_ids = values_of(cpuinfo, "core id");
  for (size_t i = 0; i < std::min(packages.size(), core_ids.size()); ++i) cores.insert({packages[i], core_ids[i]});
  cpu_set_t set;
  CPU_ZERO(&set);
  const int usable = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(online);
  std::string value = fmt::format("{}; {} logical CPUs", models.empty() ? "unknown model" : models.front(), online);
  if (!cores.empty()) value += fmt::format(", {} physical cores", cores.size());
  if (usable != online) value += fmt::format(", {} usable by this process", usable);
  out.push_back(make_check("host", "cpu", CheckStatus::kInfo, value));
}

void add_memory(Checks& out) {
  const std::string meminfo = read_file_text("/proc/meminfo");
  const double total = meminfo_bytes(meminfo, "MemTotal"), available = meminfo_bytes(meminfo, "MemAvailable");
  if (total < 0) {
    out.push_back(make_check("host", "memory", CheckStatus::kWarn, "unknown", "/proc/meminfo is not readable"));
    return;
  }
  PreflightCheck c = make_check("host", "memory", CheckStatus::kInfo,
                                fmt::format("{} total, {} available", format_gib(total), format_gib(available)));
  c.measured = available / kGiB;
  c.unit = "GiB";
  out.push_back(c);
}

void add_numa(Checks& out) {
  std::vector<std::string> nodes;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.starts_with("node") &&
        std::all_of(name.begin() + 4, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const std::string cpus = trim(read_file_text(entry.path().string() + "/cpulist"));
      nodes.push_back(fmt::format("{} (CPUs {})", name, cpus.empty() ? "none" : cpus));
    }
  }
  std::sort(nodes.begin(), nodes.end());
  if (nodes.empty()) {
    out.push_back(make_check("host", "numa", CheckStatus::kInfo, "no NUMA information under /sys/devices/system/node"));
    return;
  }
  out.push_back(make_check("host", "numa", CheckStatus::kInfo,
                           fmt::format("{} node{}: {}", nodes.size(), nodes.size() == 1 ? "" : "s", fmt::join(nodes, ", "))));
}

void add_kernel(Checks& out) {
  utsname u{};
  if (uname(&u) != 0) {
    out.push_back(make_check("host", "kernel", CheckStatus::kWarn, "unknown", "uname failed"));
    return;
  }
  out.push_back(make_check("host", "kernel", CheckStatus::kInfo, fmt::format("{} {} {}", u.sysname, u.release, u.machine)));
}

void add_limits(const PreflightOptions& options, Checks& out) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    const bool low = files.rlim_cur != RLIM_INFINITY && files.rlim_cur < static_cast<rlim_t>(options.min_open_files);
    out.push_back(make_check(
        "host", "open files limit", low ? CheckStatus::kWarn : CheckStatus::kPass,
        fmt::format("soft {}, hard {}", limit_text(files.rlim_cur), limit_text(files.rlim_max)),
        low ? fmt::format("below {}: many ranks, NCCL and data loaders open many files (raise with ulimit -n)",
                          options.min_open_files)
            : fmt::format("at least {}", options.min_open_files)));
  }
  rlimit memlock{};
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) == 0) {
    const bool unlimited = memlock.rlim_cur == RLIM_INFINITY;
    const bool enough = unlimited || (options.min_memlock_gib > 0 &&
                                      static_cast<double>(memlock.rlim_cur) >= options.min_memlock_gib * kGiB);
    out.push_back(make_check("host", "locked memory limit", enough ? CheckStatus::kPass : CheckStatus::kWarn,
                             fmt::format("soft {}, hard {}", bytes_limit_text(memlock.rlim_cur), bytes_limit_text(memlock.rlim_max)),
                             enough ? "" : "InfiniBand/RoCE (GPUDirect RDMA) registers pinned memory: set "
                                           "'ulimit -l unlimited' (or --ulimit memlock=-1 in a container)"));
  }
}

// statvfs of the directory, or of its nearest existing parent (the workspace may not exist yet).
void add_disk(const PreflightOptions& options, Checks& out) {
  std::error_code ec;
  fs::path dir = fs::absolute(options.workspace, ec).lexically_normal();
  if (dir.has_parent_path() && dir.filename().empty()) dir = dir.parent_path();  // "/a/b/" -> "/a/b"
  while (!dir.empty() && !fs::exists(dir, ec) && dir != dir.parent_path()) dir = dir.parent_path();
  struct statvfs s {};
  if (statvfs(dir.c_str(), &s) != 0) {
    out.push_back(make_check("host", "free disk", CheckStatus::kFail, "unknown",
                             fmt::format("statvfs({}) failed", dir.string())));
    return;
  }
  const double free_bytes = static_cast<double>(s.f_bavail) * static_cast<double>(s.f_frsize);
  const double total_bytes = static_cast<double>(s.f_blocks) * static_cast<double>(s.f_frsize);
  const bool low = free_bytes < options.min_free_disk_gib * kGiB;
  PreflightCheck c = make_check("host", "free disk", low ? CheckStatus::kFail : CheckStatus::kPass,
                                fmt::format("{} free of {} at {}", format_gib(free_bytes), format_gib(total_bytes),
                                            dir.string()),
                                fmt::format("at least {:g} GiB (--min-free-disk-gib)", options.min_free_disk_gib));
  c.measured = free_bytes / kGiB;
  c.unit = "GiB";
  out.push_back(c);
  struct statvfs shm {};
  if (statvfs("/dev/shm", &shm) == 0) {
    const double shm_bytes = static_cast<double>(shm.f_blocks) * static_cast<double>(shm.f_frsize);
    const bool small = shm_bytes < kGiB;
    out.push_back(make_check("host", "/dev/shm", small ? CheckStatus::kWarn : CheckStatus::kPass,
                             fmt::format("{} total", format_gib(shm_bytes)),
                             small ? "below 1 GiB: NCCL's shared-memory transport between local ranks may fail "
                                     "(--shm-size in a container)"
                                   : "at least 1 GiB"));
  }
}

struct Interface {
  bool up = false;
  std::vector<std::string> addresses;
};

std::map<std::string, Interface> list_interfaces() {
  std::map<std::string, Interface> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr) continue;
    Interface& i = found[a->ifa_name];
    i.up = i.up || (a->ifa_flags & IFF_UP) != 0;
    if (a->ifa_addr != nullptr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6)) {
      char host[NI_MAXHOST] = {};
      const socklen_t length =
          a->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (getnameinfo(a->ifa_addr, length, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) == 0) {
        i.addresses.push_back(host);
      }
    }
  }
  freeifaddrs(list);
  return found;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    item = trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// NCCL's list syntax (NCCL_SOCKET_IFNAME, NCCL_IB_HCA): a leading '^' excludes the names, a leading '=' (after
// the '^') asks for exact names instead of prefixes.
struct NameList {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
};

NameList parse_name_list(std::string text) {
  NameList list;
  if (text.starts_with("^")) list.exclude = true, text.erase(0, 1);
  if (text.starts_with("=")) list.exact = true, text.erase(0, 1);
  list.names = split_list(text);
  return list;
}

bool matches(const std::string& candidate, const std::string& name, bool exact) {
  return exact ? candidate == name : candidate.starts_with(name);
}

// The interfaces a variable names (`list`, parsed from its value `raw`) against those of this host.
void check_interfaces(const std::string& variable, const std::string& raw, const NameList& list,
                      const std::map<std::string, Interface>& interfaces, const std::vector<std::string>& described,
                      Checks& out) {
  std::vector<std::string> missing, down, good;
  for (const std::string& name : list.names) {
    bool any = false, any_up = false;
    for (const auto& [candidate, i] : interfaces) {
      if (!matches(candidate, name, list.exact)) continue;
      any = true;
      if (i.up) {
        any_up = true;
        good.push_back(fmt::format("{} {}", candidate, i.addresses.empty() ? "no address" : i.addresses.front()));
      }
    }
    if (!any) missing.push_back(name);
    else if (!any_up) down.push_back(name);
  }
  std::vector<std::string> names;
  for (const auto& [name, i] : interfaces) names.push_back(name);
  if (!missing.empty()) {
    out.push_back(make_check("network", variable, CheckStatus::kFail,
                             fmt::format("'{}': no interface named {}", raw, fmt::join(missing, ", ")),
                             fmt::format("this host has: {}", fmt::join(names, ", "))));
  } else if (good.empty()) {
    out.push_back(make_check("network", variable, CheckStatus::kFail,
                             fmt::format("'{}': interface {} is down", raw, fmt::join(down, ", ")),
                             fmt::format("interfaces: {}", fmt::join(described, "; "))));
  } else {
    out.push_back(make_check("network", variable, down.empty() ? CheckStatus::kPass : CheckStatus::kWarn,
                             fmt::format("'{}': {}", raw, fmt::join(good, "; ")),
                             down.empty() ? "" : fmt::format("down: {}", fmt::join(down, ", "))));
  }
}

// NCCL_SOCKET_IFNAME in NCCL's syntax; GLOO_SOCKET_IFNAME (CPU ranks' Gloo) one exact name, checked only when set.
void add_socket_ifname(Checks& out) {
  const std::map<std::string, Interface> interfaces = list_interfaces();
  std::vector<std::string> described;
  for (const auto& [name, i] : interfaces) {
    described.push_back(fmt::format("{}{} {}", name, i.up ? "" : " (down)",
                                    i.addresses.empty() ? "no address" : fmt::format("{}", fmt::join(i.addresses, " "))));
  }
  const char* env = std::getenv("NCCL_SOCKET_IFNAME");
  if (env == nullptr || *env == '\0') {
    out.push_back(make_check("network", "NCCL_SOCKET_IFNAME", CheckStatus::kInfo,
                             "not set: NCCL picks an interface (not lo or docker*)",
                             fmt::format("interfaces: {}", fmt::join(described, "; "))));
  } else if (const NameList list = parse_name_list(env); list.exclude) {
    out.push_back(make_check("network", "NCCL_SOCKET_IFNAME", CheckStatus::kInfo,
                             fmt::format("'{}' excludes interfaces", env),
                             fmt::format("interfaces: {}", fmt::join(described, "; "))));
  } else {
    check_interfaces("NCCL_SOCKET_IFNAME", env, list, interfaces, described, out);
  }
  if (const char* gloo = std::getenv("GLOO_SOCKET_IFNAME"); gloo != nullptr && *gloo != '\0') {
    NameList list;
    list.exact = true;
    list.names = {gloo};
    check_interfaces("GLOO_SOCKET_IFNAME", gloo, list, interfaces, described, out);
  }
}

void add_ib_hca(Checks& out) {
  const std::string root = "/sys/class/infiniband";
  std::vector<std::string> devices;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) devices.push_back(entry.path().filename().string());
  std::sort(devices.begin(), devices.end());
  // A device's ports and their states ("mlx5_0 port 1 ACTIVE (InfiniBand)").
  auto ports = [&](const std::string& device, const std::string& only_port, bool* any_active) {
    std::vector<std::string> described;
    for (const auto& port : fs::directory_iterator(root + "/" + device + "/ports", ec)) {
      const std::string number = port.path().filename().string();
      if (!only_port.empty() && number != only_port) continue;
      std::string state = trim(read_file_text(port.path().string() + "/state"));  // "4: ACTIVE"
      if (const size_t colon = state.find(':'); colon != std::string::npos) state = trim(state.substr(colon + 1));
      const std::string layer = trim(read_file_text(port.path().string() + "/link_layer"));
      if (state == "ACTIVE") *any_active = true;
      described.push_back(fmt::format("{} port {} {}{}", device, number, state.empty() ? "unknown" : state,
                                      layer.empty() ? "" : " (" + layer + ")"));
    }
    return described;
  };
  const char* env = std::getenv("NCCL_IB_HCA");
  if (env == nullptr || *env == '\0') {
    out.push_back(make_check("network", "NCCL_IB_HCA", CheckStatus::kInfo,
                             devices.empty() ? "not set; no InfiniBand/RoCE device under /sys/class/infiniband"
                                             : fmt::format("not set; devices: {}", fmt::join(devices, ", "))));
    return;
  }
  const NameList list = parse_name_list(env);
  if (list.exclude) {
    out.push_back(make_check("network", "NCCL_IB_HCA", CheckStatus::kInfo, fmt::format("'{}' excludes devices", env),
                             fmt::format("devices: {}", devices.empty() ? "none" : fmt::format("{}", fmt::join(devices, ", ")))));
    return;
  }
  std::vector<std::string> missing, inactive, described;
  for (const std::string& entry : list.names) {
    const size_t colon = entry.find(':');
    const std::string name = entry.substr(0, colon), port = colon == std::string::npos ? "" : entry.substr(colon + 1);
    bool found = false, active = false;
    for (const std::string& device : devices) {
      if (!matches(device, name, list.exact)) continue;
      found = true;
      std::vector<std::string> p = ports(device, port, &active);
      described.insert(described.end(), p.begin(), p.end());
    }
    if (!found) missing.push_back(entry);
    else if (!active) inactive.push_back(entry);
  }
  if (!missing.empty()) {
    out.push_back(make_check("network", "NCCL_IB_HCA", CheckStatus::kFail,
                             fmt::format("'{}': no device {} under {}", env, fmt::join(missing, ", "), root),
                             devices.empty() ? "this host has no InfiniBand/RoCE device"
                                             : fmt::format("this host has: {}", fmt::join(devices, ", "))));
    return;
  }
  out.push_back(make_check("network", "NCCL_IB_HCA", inactive.empty() ? CheckStatus::kPass : CheckStatus::kFail,
                           fmt::format("'{}': {}", env, fmt::join(described, "; ")),
                           inactive.empty() ? "" : fmt::format("no ACTIVE port on {}", fmt::join(inactive, ", "))));
}

}  // namespace

std::string read_file_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string format_gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / kGiB); }

void add_host_checks(const PreflightOptions& options, Checks& out) {
  guarded(out, "host", "cpu", [&] { add_cpu(out); });
  guarded(out, "host", "memory", [&] { add_memory(out); });
  guarded(out, "host", "numa", [&] { add_numa(out); });
  guarded(out, "host", "kernel", [&] { add_kernel(out); });
  guarded(out, "host", "limits", [&] { add_limits(options, out); });
  guarded(out, "host", "free disk", [&] { add_disk(options, out); });
}

void add_network_checks(Checks& out) {
  guarded(out, "network", "NCCL_SOCKET_IFNAME", [&] { add_socket_ifname(out); });
  guarded(out, "network", "NCCL_IB_HCA", [&] { add_ib_hca(out); });
}

}  // namespace primus::preflight
