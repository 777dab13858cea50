// `primus-cli container`: runs the command in a podman or docker container. The command line itself is built
// by container_command.h; this part finds the facts it needs on this machine (runtime, image, GPUs, paths),
// runs the runtime, and turns its failures into exit codes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace primus::cli {

// The container flags as given on the command line (unset: from the config's container: section).
struct ContainerFlags {
  std::optional<std::string> image;
  std::optional<std::string> runtime;
  std::optional<std::string> binary;  // mounted | image
  std::vector<std::string> volumes;
  std::vector<std::string> env;
};

// Registers the `container` mode and its flags (--image, --runtime, --binary, --volume, --env) on the launcher.
CLI::App* add_container_mode(CLI::App& launcher, ContainerFlags& flags);

// Runs `command` (the words after `--`) in the container and returns the exit code: the command's own code
// from inside the container; 3 when the runtime fails (cannot start the container, cannot run primus-cli in
// the image, killed); 128+N when SIGINT/SIGTERM stopped it (they are forwarded to the container once each).
// `plan` is what the command's dry run on this machine found (its config: run directory, container:
// section). Under --dry-run prints the plan instead. Throws UsageError (exit 2) naming the flag or config key
// for a bad runtime, image, volume or variable, an image that is not on this machine, a runtime that is not
// installed; RuntimeError (exit 3) when the runtime cannot be queried.
int run_container_mode(const LaunchOptions& launch, const ContainerFlags& flags, const CommandPlan& plan,
                       const std::vector<std::string>& command);

// The --env NAME=VALUE flags applied to this process's environment, so that ${VAR} in the config resolves on
// this machine as it will in the container (the run directory to mount depends on it).
void apply_flag_env(const ContainerFlags& flags);

}  // namespace primus::cli
