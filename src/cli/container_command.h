// The `podman run` / `docker run` command line of `primus-cli container`, built by a pure function from what
// the launcher gathered (flags, the config's container: section, this machine's GPUs, paths and environment),
// so that tests check every rule without a container runtime. Finding those facts and running the command is
// container_mode.cpp.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/experiment.h"

namespace primus::cli {

// How the host's GPUs reach the container.
enum class GpuPassthrough {
  kNone,        // no GPU found
  kNvidiaCdi,   // a CDI spec names nvidia.com/gpu: --device nvidia.com/gpu=all
  kNvidiaGpus,  // NVIDIA without a CDI spec: --gpus all (NVIDIA Container Toolkit's hook)
  kAmd,         // /dev/kfd: --device /dev/kfd --device /dev/dri
};

struct ContainerRequest {
  // Each value with where it came from: "--image" for a flag, "exp.yaml:4: container.options.image" for the
  // config; errors name it.
  SourcedValue runtime;                                       // podman | docker
  SourcedValue image;                                         // an image reference
  std::vector<SourcedValue> volumes;                          // SRC[:DST[:OPTIONS]]; the config's, then the flags'
  std::vector<SourcedValue> env;                              // NAME=VALUE or NAME; later entries win
  std::vector<std::pair<std::string, SourcedValue>> options;  // run options from the config (ipc, device, ...)

  std::string container_name;
  // "mounted" (default): `executable` runs in the container, mounted with `program_paths`; "image": the image's
  // own primus-cli (from its PATH) runs, and nothing of this program is mounted.
  SourcedValue binary{"mounted", "default"};
  std::string executable;                   // the running primus-cli, absolute; runs in the container
  std::vector<std::string> program_paths;   // the checkout, or the installed binary and its configs/: read-only
  std::string working_dir;                  // absolute; mounted read-write and the container's working dir
  std::vector<std::string> writable_paths;  // the run directory: read-write
  std::vector<std::string> readable_paths;  // the config file's folder: read-only
  GpuPassthrough gpus = GpuPassthrough::kNone;
  std::map<std::string, std::string> host_env;  // this process's environment
  unsigned uid = 0;                             // of this process: non-root changes the user mapping
  unsigned gid = 0;
  bool debug = false;
  std::vector<std::string> command;  // the words after `--`
  // Whether a host path exists (volume sources); the real file system unless a test replaces it.
  std::function<bool(const std::string&)> path_exists;
};

struct ContainerMount {
  std::string source;       // host path, or a named volume
  std::string destination;  // path in the container
  std::string options;      // "ro", "rw" or the user's options
  std::string why;          // "program", "working directory", "run directory", "config", "--volume"
};

struct ContainerCommand {
  std::vector<std::string> argv;                                // runtime run ... IMAGE primus-cli ... -- command
  std::vector<std::pair<std::string, std::string>> secret_env;  // set in the runtime's own environment only
  std::vector<std::string> shown_env;                           // NAME=VALUE of every variable, secrets as ***
  std::vector<ContainerMount> mounts;
  size_t image_index = 0;  // argv[image_index] is the image; this binary follows it
};

// Validates and builds. Throws UsageError naming the flag or config key and the value: a runtime other than
// podman or docker, a binary other than mounted or image, a malformed image reference, a volume whose source does not
// exist or whose destination is not absolute, unknown volume options, a bad variable name, `--env NAME` for a variable
// this environment lacks, two mounts on one destination.
ContainerCommand build_container_command(const ContainerRequest& request);

// The same container, named NAME-probe, running `primus-cli --version` instead of the command: whether the binary
// starts in the image (its libraries, its loader) with the same mounts and environment, checked before the run.
std::vector<std::string> probe_argv(const ContainerCommand& command);

// argv as one shell-quoted line with secret values masked (a `NAME=VALUE` word whose NAME is a secret's).
std::string shown_command_line(const std::vector<std::string>& argv);

// Whether `reference` is a valid image reference: [HOST[:PORT]/]NAME[:TAG][@DIGEST] with a lower-case NAME.
bool is_valid_image_reference(const std::string& reference);

}  // namespace primus::cli
