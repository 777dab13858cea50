// build_container_command: every rule of what `primus-cli container` mounts, passes and runs (see
// container_command.h). Invariants: no secret value is ever a word of argv (secrets travel by name, with the
// value in the runtime's environment, so they show neither in `ps` nor in a printed command line); every path
// mounted for primus-cli itself appears at the same path inside, so paths in configs and on the command line
// mean the same thing on both sides.
#include "cli/container_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <regex>

#include "core/error.h"
#include "core/secrets.h"

namespace primus::cli {
namespace {

namespace fs = std::filesystem;

// Variables of this environment that the container gets without asking, as Primus forwards them: the
// launch contract for a job that spans nodes, device lists, and the communication libraries' settings.
bool is_forwarded(const std::string& name) {
  if (name == "PRIMUS_LAUNCHED") return false;  // the command in the container is a fresh launch
  for (const char* prefix : {"PRIMUS_", "NCCL_", "RCCL_", "GLOO_"}) {
    if (name.starts_with(prefix)) return true;
  }
  for (const char* exact : {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "NNODES",
                            "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"}) {
    if (name == exact) return true;
  }
  return false;
}

bool is_variable_name(const std::string& name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// "--image" for a flag, "exp.yaml:4: container.options.image" for the config.
std::string named(const SourcedValue& value) { return fmt::format("{} '{}'", value.where, value.value); }

// a is b or below it (both lexically normal, absolute).
bool is_within(const std::string& a, const std::string& b) {
  if (b == "/") return true;
  return a == b || (a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '/');
}

std::string normal(const std::string& path) {
  std::string text = fs::path(path).lexically_normal().string();
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  return text;
}

bool is_volume_option(const std::string& option) {
  for (const char* known : {"ro", "rw", "z", "Z", "shared", "rshared", "slave", "rslave", "private", "rprivate",
                            "nocopy", "U", "O", "bind", "rbind"}) {
    if (option == known) return true;
  }
  return false;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

class MountList {
 public:
  // A mount made for primus-cli (program, working directory, run directory, config): the same path inside,
  // left out when a mount already listed covers it at least as permissively.
  void add_same_path(const std::string& path, bool writable, const std::string& why) {
    std::string clean = normal(path);
    if (clean == "/") return;  // never the host's root over the image's
    for (ContainerMount& m : mounts_) {
      bool same_path = m.source == m.destination;
      bool covers = same_path && is_within(clean, m.destination) && (!writable || m.options == "rw");
      if (covers) return;
      if (same_path && m.destination == clean) {  // one destination, one mount: the read-write one
        m.options = "rw";
        m.why += ", " + why;
        return;
      }
    }
    mounts_.push_back({clean, clean, writable ? "rw" : "ro", why});
  }

  void add_volume(const SourcedValue& volume, const std::string& working_dir,
                  const std::function<bool(const std::string&)>& path_exists) {
    std::vector<std::string> parts = split(volume.value, ':');
    if (volume.value.empty() || parts.size() > 3 || parts[0].empty()) {
      throw UsageError(fmt::format("{}: expected SRC[:DST[:OPTIONS]] (e.g. /data:/data:ro)", named(volume)));
    }
    std::string source = parts[0];
    bool named_volume = source.find('/') == std::string::npos && source != "." && source != "..";
    if (!named_volume) {
      source = normal(fs::path(source).is_absolute() ? source : (fs::path(working_dir) / source).string());
      if (!path_exists(source))
        throw UsageError(fmt::format("{}: {} does not exist on this machine", named(volume), source));
    }
    if (named_volume && parts.size() < 2) {
      throw UsageError(fmt::format("{}: '{}' is not a path (a named volume needs :DST)", named(volume), source));
    }
    std::string destination = parts.size() >= 2 ? parts[1] : source;
    if (!fs::path(destination).is_absolute()) {
      throw UsageError(fmt::format("{}: the destination '{}' must be an absolute path", named(volume), destination));
    }
    destination = normal(destination);
    std::string options = parts.size() == 3 ? parts[2] : "rw";
    for (const std::string& option : split(options, ',')) {
      if (!is_volume_option(option)) {
        throw UsageError(
            fmt::format("{}: unknown volume option '{}' (known: ro, rw, z, Z, shared, slave, private, "
                        "nocopy, U, O and their r- forms)",
                        named(volume), option));
      }
    }
    for (const ContainerMount& m : mounts_) {
      if (m.destination == destination) {
        throw UsageError(fmt::format("{}: {} is already mounted there ({}); give another destination", named(volume),
                                     destination, m.why));
      }
    }
    mounts_.push_back({source, destination, options, volume.where});
  }

  const std::vector<ContainerMount>& mounts() const { return mounts_; }

 private:
  std::vector<ContainerMount> mounts_;
};

// Primus's launcher YAML lets a boolean option be a flag without a value (privileged).
std::string option_word(const std::string& name, const std::string& value) {
  return value.empty() ? "--" + name : fmt::format("--{}={}", name, value);
}

bool has_option(const ContainerRequest& request, const std::string& name) {
  return std::any_of(request.options.begin(), request.options.end(),
                     [&](const auto& option) { return option.first == name; });
}

}  // namespace

bool is_valid_image_reference(const std::string& reference) {
  // The grammar of github.com/distribution/reference, which podman and docker both follow.
  static const std::regex pattern(
      // A host is localhost, or has a dot or a port; otherwise the first part is a (lower-case) path component.
      R"(^(?:(?:localhost(?::[0-9]+)?|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)"
      R"((?:(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)+(?::[0-9]+)?|:[0-9]+))/)?)"
      R"([a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
      R"((?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?)"
      R"((?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$)");
  return reference.size() <= 255 && std::regex_match(reference, pattern);
}

ContainerCommand build_container_command(const ContainerRequest& request) {
  if (request.runtime.value != "podman" && request.runtime.value != "docker") {
    throw UsageError(fmt::format("{}: expected podman or docker", named(request.runtime)));
  }
  const bool image_binary = request.binary.value == "image";
  if (!image_binary && request.binary.value != "mounted") {
    throw UsageError(fmt::format("{}: expected mounted (this primus-cli) or image (the image's own primus-cli)",
                                 named(request.binary)));
  }
  if (request.image.value.empty()) {
    throw UsageError(
        "container mode needs an image: give --image IMAGE, or container.options.image in the experiment config");
  }
  if (!is_valid_image_reference(request.image.value)) {
    throw UsageError(fmt::format(
        "{}: not a valid image reference (expected [HOST[:PORT]/]NAME[:TAG][@DIGEST], the name in lower case, "
        "e.g. localhost/primus:cuda)",
        named(request.image)));
  }
  if (request.command.empty()) {
    throw UsageError(
        "no command given (for example: primus-cli container --image IMAGE -- train pretrain --config "
        "exp.yaml)");
  }
  std::function<bool(const std::string&)> path_exists = request.path_exists;
  if (!path_exists) path_exists = [](const std::string& path) { return fs::exists(path); };

  ContainerCommand result;
  MountList mounts;
  if (!image_binary) {
    for (const std::string& path : request.program_paths) mounts.add_same_path(path, false, "program");
  }
  mounts.add_same_path(request.working_dir, true, "working directory");
  for (const std::string& path : request.writable_paths) mounts.add_same_path(path, true, "run directory");
  for (const std::string& path : request.readable_paths) mounts.add_same_path(path, false, "config");
  for (const SourcedValue& volume : request.volumes) mounts.add_volume(volume, request.working_dir, path_exists);
  result.mounts = mounts.mounts();

  // The environment, low to high: forwarded host variables, then the config's env, then the flags'.
  std::vector<std::pair<std::string, std::string>> env;
  auto set_env = [&env](const std::string& name, const std::string& value) {
    auto same = std::find_if(env.begin(), env.end(), [&](const auto& entry) { return entry.first == name; });
    if (same != env.end()) env.erase(same);
    env.emplace_back(name, value);
  };
  for (const auto& [name, value] : request.host_env) {
    // The image's own primus-cli finds its own configs/ (its image sets PRIMUS_CONFIGS_DIR), not this machine's.
    if (image_binary && name == "PRIMUS_CONFIGS_DIR") continue;
    if (is_forwarded(name)) set_env(name, value);
  }
  for (const SourcedValue& entry : request.env) {
    size_t equals = entry.value.find('=');
    std::string name = entry.value.substr(0, equals);
    if (!is_variable_name(name)) {
      throw UsageError(fmt::format("{} '{}': '{}' is not a valid environment variable name (expected NAME=VALUE)",
                                   entry.where, shown_command_line({entry.value}), name));
    }
    if (equals != std::string::npos) {
      set_env(name, entry.value.substr(equals + 1));
      continue;
    }
    auto host = request.host_env.find(name);
    if (host == request.host_env.end()) {
      throw UsageError(fmt::format("{} '{}': {} is not set in this environment (give {}=VALUE, or export it)",
                                   entry.where, name, name, name));
    }
    set_env(name, host->second);
  }

  std::vector<std::string>& argv = result.argv;
  argv = {request.runtime.value, "run", "--rm", "--name", request.container_name, "--pull", "never"};
  // Multi-node NCCL/Gloo needs the host's interfaces, and collectives its shared memory: Primus's defaults.
  if (!has_option(request, "network")) argv.insert(argv.end(), {"--network", "host"});
  if (!has_option(request, "ipc")) argv.insert(argv.end(), {"--ipc", "host"});
  if (request.uid != 0) {
    // Files written through the mounts should belong to the caller: rootless podman maps the caller to
    // itself with keep-id; docker's daemon runs as root, so ask for the caller's ids.
    if (request.runtime.value == "podman") {
      argv.insert(argv.end(), {"--userns", "keep-id"});
    } else {
      argv.insert(argv.end(), {"--user", fmt::format("{}:{}", request.uid, request.gid)});
    }
  }
  if (!has_option(request, "gpus")) {
    switch (request.gpus) {
      case GpuPassthrough::kNone:
        break;
      case GpuPassthrough::kNvidiaCdi:
        argv.insert(argv.end(), {"--device", "nvidia.com/gpu=all"});
        break;
      case GpuPassthrough::kNvidiaGpus:
        argv.insert(argv.end(), {"--gpus", "all"});
        break;
      case GpuPassthrough::kAmd:
        argv.insert(argv.end(), {"--device", "/dev/kfd", "--device", "/dev/dri"});
        break;
    }
  }
  for (const ContainerMount& m : result.mounts) {
    argv.insert(argv.end(), {"--volume", fmt::format("{}:{}:{}", m.source, m.destination, m.options)});
  }
  argv.insert(argv.end(), {"--workdir", normal(request.working_dir)});
  for (const auto& [name, value] : env) {
    if (is_secret_name(name)) {
      argv.insert(argv.end(), {"--env", name});
      result.secret_env.emplace_back(name, value);
    } else {
      argv.insert(argv.end(), {"--env", name + "=" + value});
    }
    result.shown_env.push_back(name + "=" + shown_value(name, value));
  }
  for (const auto& [name, option] : request.options) argv.push_back(option_word(name, option.value));
  result.image_index = argv.size();
  argv.push_back(request.image.value);

  // The command runs in direct mode inside; `direct [flags] -- command` is passed as it is.
  argv.push_back(image_binary ? "primus-cli" : request.executable);
  if (request.debug) argv.push_back("--debug");
  if (request.command.front() != "direct") argv.push_back("--");
  argv.insert(argv.end(), request.command.begin(), request.command.end());
  return result;
}

std::vector<std::string> probe_argv(const ContainerCommand& command) {
  std::vector<std::string> argv(command.argv.begin(), command.argv.begin() + command.image_index + 2);
  auto name = std::find(argv.begin(), argv.end(), "--name");
  if (name != argv.end() && name + 1 != argv.end()) *(name + 1) += "-probe";
  argv.push_back("--version");
  return argv;
}

std::string shown_command_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& word : argv) {
    std::string shown = word;
    size_t equals = word.find('=');
    if (equals != std::string::npos) {
      std::string name = word.substr(0, equals);
      size_t dashes = name.find_first_not_of('-');
      std::string bare = dashes == std::string::npos ? name : name.substr(dashes);
      // A dotted override (modules.pre_trainer.overrides.wandb_api_key=...) is judged by its last part.
      std::string last = bare.substr(bare.rfind('.') == std::string::npos ? 0 : bare.rfind('.') + 1);
      if (is_secret_name(last)) shown = name + "=" + kMaskedValue;
    }
    bool plain = !shown.empty() && std::all_of(shown.begin(), shown.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) ||
             std::string_view("-_./:=,@+%*").find(c) != std::string_view::npos;
    });
    if (!plain) {
      std::string quoted = "'";
      for (char c : shown) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      shown = quoted + "'";
    }
    line += (line.empty() ? "" : " ") + shown;
  }
  return line;
}

}  // namespace primus::cli
