// The command line of `primus-cli container` (src/cli/container_command.cpp), as a pure function: mounts,
// environment and secrets, GPU passthrough, user mapping, the command run inside, and every input it rejects
// with the flag or config key that gave it. The real podman run is container_test.cpp.
#include "cli/container_command.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"

namespace primus::cli {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)
#define EXPECT_LACKS(text, part) \
  EXPECT_EQ((text).find(part), std::string::npos) << "unexpected '" << (part) << "' in:\n" << (text)

// A request as container_mode.cpp makes it for `train pretrain` from the checkout /src/primus, run in /work/job
// with the run directory /scratch/runs/exp; /data and /work/job/extra exist.
ContainerRequest base_request() {
  ContainerRequest request;
  request.runtime = {"podman", "--runtime"};
  request.image = {"localhost/primus:cpu", "--image"};
  request.container_name = "primus-1-2";
  request.executable = "/src/primus/build/primus-cli";
  request.program_paths = {"/src/primus", "/src/primus/configs"};
  request.working_dir = "/work/job";
  request.writable_paths = {"/scratch/runs/exp"};
  request.readable_paths = {"/work/job/configs"};
  request.command = {"train", "pretrain", "--config", "configs/exp.yaml"};
  request.path_exists = [](const std::string& path) {
    static const std::set<std::string> existing = {"/data", "/work/job/extra", "/models"};
    return existing.count(path) > 0;
  };
  return request;
}

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : " ") + word;
  return text;
}

// The value that follows `option` each time it appears.
std::vector<std::string> values_of(const std::vector<std::string>& argv, const std::string& option) {
  std::vector<std::string> values;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == option) values.push_back(argv[i + 1]);
  }
  return values;
}

std::string usage_error(const ContainerRequest& request) {
  try {
    build_container_command(request);
  } catch (const UsageError& error) {
    EXPECT_EQ(error.exit_code(), kExitUsage);
    return error.what();
  }
  ADD_FAILURE() << "expected a UsageError";
  return "";
}

TEST(ContainerCommandTest, RunsPrimusCliInsideWithTheFixedOptions) {
  ContainerCommand command = build_container_command(base_request());
  const std::vector<std::string>& argv = command.argv;
  ASSERT_GE(argv.size(), 8u);
  EXPECT_EQ(joined({argv.begin(), argv.begin() + 7}), "podman run --rm --name primus-1-2 --pull never");
  EXPECT_EQ(values_of(argv, "--network"), std::vector<std::string>{"host"});
  EXPECT_EQ(values_of(argv, "--ipc"), std::vector<std::string>{"host"});
  EXPECT_EQ(values_of(argv, "--workdir"), std::vector<std::string>{"/work/job"});
  // The image, then this binary in direct mode with the command.
  auto image = std::find(argv.begin(), argv.end(), "localhost/primus:cpu");
  ASSERT_NE(image, argv.end());
  EXPECT_EQ(joined({image + 1, argv.end()}),
            "/src/primus/build/primus-cli -- train pretrain --config configs/exp.yaml");
}

TEST(ContainerCommandTest, TheProbeRunsTheVersionInTheSameContainerSetup) {
  ContainerRequest request = base_request();
  request.env = {{"HF_TOKEN=x", "--env"}};
  ContainerCommand command = build_container_command(request);
  std::vector<std::string> probe = probe_argv(command);
  auto image = std::find(probe.begin(), probe.end(), "localhost/primus:cpu");
  ASSERT_NE(image, probe.end());
  EXPECT_EQ(joined({image, probe.end()}), "localhost/primus:cpu /src/primus/build/primus-cli --version");
  EXPECT_EQ(values_of(probe, "--name"), std::vector<std::string>{"primus-1-2-probe"});
  EXPECT_EQ(values_of(probe, "--volume"), values_of(command.argv, "--volume"));
  EXPECT_EQ(values_of(probe, "--env"), std::vector<std::string>{"HF_TOKEN"});
}

TEST(ContainerCommandTest, MountsProgramWorkingDirectoryRunDirectoryAndConfigAtTheSamePaths) {
  ContainerCommand command = build_container_command(base_request());
  // configs/ lies in the checkout and the config folder in the working directory: both already covered.
  EXPECT_EQ(values_of(command.argv, "--volume"),
            (std::vector<std::string>{"/src/primus:/src/primus:ro", "/work/job:/work/job:rw",
                                      "/scratch/runs/exp:/scratch/runs/exp:rw"}));
  ASSERT_EQ(command.mounts.size(), 3u);
  EXPECT_EQ(command.mounts[0].why, "program");
  EXPECT_EQ(command.mounts[2].why, "run directory");
}

TEST(ContainerCommandTest, ARunDirectoryInsideTheWorkingDirectoryIsNotMountedTwice) {
  ContainerRequest request = base_request();
  request.writable_paths = {"/work/job/output/exp/"};
  EXPECT_EQ(values_of(build_container_command(request).argv, "--volume"),
            (std::vector<std::string>{"/src/primus:/src/primus:ro", "/work/job:/work/job:rw"}));
}

TEST(ContainerCommandTest, WorkingInTheCheckoutMountsItOnceReadWrite) {
  ContainerRequest request = base_request();
  request.working_dir = "/src/primus";
  request.readable_paths = {"/src/primus/configs/examples"};
  request.writable_paths = {"/src/primus/output/exp"};
  EXPECT_EQ(values_of(build_container_command(request).argv, "--volume"),
            std::vector<std::string>{"/src/primus:/src/primus:rw"});
}

TEST(ContainerCommandTest, AWorkingDirectoryOfSlashIsNeverMounted) {
  ContainerRequest request = base_request();
  request.working_dir = "/";
  std::vector<std::string> volumes = values_of(build_container_command(request).argv, "--volume");
  EXPECT_EQ(std::count(volumes.begin(), volumes.end(), "/:/:rw"), 0);
  EXPECT_EQ(values_of(build_container_command(request).argv, "--workdir"), std::vector<std::string>{"/"});
}

TEST(ContainerCommandTest, VolumesFromFlagsAndConfig) {
  ContainerRequest request = base_request();
  request.volumes = {{"/data:/data:ro", "exp.yaml:7: container.options.volume[0]"},
                     {"extra:/mnt/extra", "--volume"},  // a named volume: no slash, passed as it is
                     {"./extra:/mnt/relative", "--volume"},
                     {"/models", "--volume"}};
  std::vector<std::string> volumes = values_of(build_container_command(request).argv, "--volume");
  ASSERT_EQ(volumes.size(), 7u);
  EXPECT_EQ(volumes[3], "/data:/data:ro");
  EXPECT_EQ(volumes[4], "extra:/mnt/extra:rw");
  EXPECT_EQ(volumes[5], "/work/job/extra:/mnt/relative:rw");
  EXPECT_EQ(volumes[6], "/models:/models:rw");
}

TEST(ContainerCommandTest, BadVolumesNameTheFlagOrKeyAndTheValue) {
  ContainerRequest request = base_request();
  request.volumes = {{"/absent:/data", "--volume"}};
  std::string message = usage_error(request);
  EXPECT_CONTAINS(message, "--volume '/absent:/data'");
  EXPECT_CONTAINS(message, "/absent does not exist");

  request.volumes = {{"/data:relative", "exp.yaml:7: container.options.volume[0]"}};
  message = usage_error(request);
  EXPECT_CONTAINS(message, "exp.yaml:7: container.options.volume[0] '/data:relative'");
  EXPECT_CONTAINS(message, "must be an absolute path");

  request.volumes = {{"/data:/data:rx", "--volume"}};
  EXPECT_CONTAINS(usage_error(request), "unknown volume option 'rx'");
  request.volumes = {{"/data:/a:ro:x", "--volume"}};
  EXPECT_CONTAINS(usage_error(request), "expected SRC[:DST[:OPTIONS]]");
  request.volumes = {{"/data:/work/job", "--volume"}};
  EXPECT_CONTAINS(usage_error(request), "/work/job is already mounted there (working directory)");
  request.volumes = {{"cache", "--volume"}};
  EXPECT_CONTAINS(usage_error(request), "a named volume needs :DST");
}

TEST(ContainerCommandTest, SecretsTravelByNameAndAreMaskedWhenShown) {
  ContainerRequest request = base_request();
  request.host_env = {{"HF_TOKEN", "hf_host"}, {"HOME", "/root"}};
  request.env = {{"WANDB_API_KEY=wandb-secret", "--env"},
                 {"HF_TOKEN", "--env"},  // NAME alone: this environment's value
                 {"my_db_password=pw", "exp.yaml:9: container.options.env[0]"},
                 {"PLAIN=visible", "--env"}};
  ContainerCommand command = build_container_command(request);
  std::string line = joined(command.argv);
  for (const char* secret : {"wandb-secret", "hf_host", "pw"}) EXPECT_LACKS(line, secret);
  std::vector<std::string> env_words = values_of(command.argv, "--env");
  EXPECT_EQ(env_words, (std::vector<std::string>{"WANDB_API_KEY", "HF_TOKEN", "my_db_password", "PLAIN=visible"}));
  EXPECT_EQ(command.secret_env,
            (std::vector<std::pair<std::string, std::string>>{
                {"WANDB_API_KEY", "wandb-secret"}, {"HF_TOKEN", "hf_host"}, {"my_db_password", "pw"}}));
  EXPECT_EQ(command.shown_env,
            (std::vector<std::string>{"WANDB_API_KEY=***", "HF_TOKEN=***", "my_db_password=***", "PLAIN=visible"}));
}

TEST(ContainerCommandTest, HostVariablesForwardedAsPrimusDoesAndLaterEntriesWin) {
  ContainerRequest request = base_request();
  request.host_env = {{"PRIMUS_WORKSPACE", "/scratch/runs"},
                      {"NCCL_DEBUG", "INFO"},
                      {"GLOO_SOCKET_IFNAME", "lo"},
                      {"MASTER_ADDR", "10.0.0.1"},
                      {"HOME", "/root"},
                      {"PATH", "/usr/bin"},
                      {"PRIMUS_LAUNCHED", "1"},
                      {"OMP_NUM_THREADS", "2"},
                      {"CUDA_VISIBLE_DEVICES", "1"}};
  request.env = {{"NCCL_DEBUG=WARN", "exp.yaml:9: container.options.env[0]"}, {"NCCL_DEBUG=TRACE", "--env"}};
  std::vector<std::string> env = values_of(build_container_command(request).argv, "--env");
  std::set<std::string> got(env.begin(), env.end());
  EXPECT_EQ(got,
            (std::set<std::string>{"PRIMUS_WORKSPACE=/scratch/runs", "GLOO_SOCKET_IFNAME=lo", "MASTER_ADDR=10.0.0.1",
                                   "OMP_NUM_THREADS=2", "CUDA_VISIBLE_DEVICES=1", "NCCL_DEBUG=TRACE"}));
}

TEST(ContainerCommandTest, BadVariablesNameTheFlag) {
  ContainerRequest request = base_request();
  request.env = {{"1BAD=x", "--env"}};
  EXPECT_CONTAINS(usage_error(request), "--env '1BAD=x': '1BAD' is not a valid environment variable name");
  request.env = {{"HF_TOKEN", "--env"}};
  EXPECT_CONTAINS(usage_error(request), "--env 'HF_TOKEN': HF_TOKEN is not set in this environment");
  // The value of a secret never appears in an error either.
  request.env = {{"BAD NAME_TOKEN=hunter2", "--env"}};
  EXPECT_LACKS(usage_error(request), "hunter2");
}

TEST(ContainerCommandTest, GpuPassthroughPerVendor) {
  ContainerRequest request = base_request();
  EXPECT_TRUE(values_of(build_container_command(request).argv, "--device").empty());
  EXPECT_TRUE(values_of(build_container_command(request).argv, "--gpus").empty());
  request.gpus = GpuPassthrough::kNvidiaCdi;
  EXPECT_EQ(values_of(build_container_command(request).argv, "--device"),
            std::vector<std::string>{"nvidia.com/gpu=all"});
  request.gpus = GpuPassthrough::kNvidiaGpus;
  EXPECT_EQ(values_of(build_container_command(request).argv, "--gpus"), std::vector<std::string>{"all"});
  request.gpus = GpuPassthrough::kAmd;
  EXPECT_EQ(values_of(build_container_command(request).argv, "--device"),
            (std::vector<std::string>{"/dev/kfd", "/dev/dri"}));
  // A gpus: option in the config replaces the automatic choice.
  request.gpus = GpuPassthrough::kNvidiaGpus;
  request.options = {{"gpus", {"device=1", "exp.yaml:8: container.options.gpus"}}};
  ContainerCommand command = build_container_command(request);
  EXPECT_TRUE(values_of(command.argv, "--gpus").empty());
  EXPECT_NE(std::find(command.argv.begin(), command.argv.end(), "--gpus=device=1"), command.argv.end());
}

TEST(ContainerCommandTest, ConfigRunOptionsReplaceTheDefaultsTheyName) {
  ContainerRequest request = base_request();
  request.options = {{"network", {"none", "x"}},
                     {"device", {"/dev/infiniband", "x"}},
                     {"cap-add", {"SYS_PTRACE", "x"}},
                     {"privileged", {"", "x"}}};
  ContainerCommand command = build_container_command(request);
  EXPECT_TRUE(values_of(command.argv, "--network").empty());
  EXPECT_EQ(values_of(command.argv, "--ipc"), std::vector<std::string>{"host"});
  std::string line = joined(command.argv);
  EXPECT_CONTAINS(line,
                  "--network=none --device=/dev/infiniband --cap-add=SYS_PTRACE --privileged localhost/primus:cpu");
}

TEST(ContainerCommandTest, NonRootCallersKeepTheirIds) {
  ContainerRequest request = base_request();
  request.uid = 1000;
  request.gid = 100;
  EXPECT_EQ(values_of(build_container_command(request).argv, "--userns"), std::vector<std::string>{"keep-id"});
  request.runtime = {"docker", "--runtime"};
  ContainerCommand docker = build_container_command(request);
  EXPECT_EQ(docker.argv.front(), "docker");
  EXPECT_EQ(values_of(docker.argv, "--user"), std::vector<std::string>{"1000:100"});
  EXPECT_TRUE(values_of(docker.argv, "--userns").empty());
}

TEST(ContainerCommandTest, DebugAndAnInnerDirectLaunch) {
  ContainerRequest request = base_request();
  request.debug = true;
  request.command = {"direct", "--nproc-per-node", "2", "--", "train", "pretrain", "--config", "e.yaml"};
  ContainerCommand command = build_container_command(request);
  auto image = std::find(command.argv.begin(), command.argv.end(), "localhost/primus:cpu");
  ASSERT_NE(image, command.argv.end());
  EXPECT_EQ(joined({image + 1, command.argv.end()}),
            "/src/primus/build/primus-cli --debug direct --nproc-per-node 2 -- train pretrain --config e.yaml");
}

TEST(ContainerCommandTest, TheImagesOwnBinaryMountsNothingOfThisProgram) {
  ContainerRequest request = base_request();
  request.binary = {"image", "--binary"};
  ContainerCommand command = build_container_command(request);
  EXPECT_EQ(values_of(command.argv, "--volume"),
            (std::vector<std::string>{"/work/job:/work/job:rw", "/scratch/runs/exp:/scratch/runs/exp:rw"}));
  auto image = std::find(command.argv.begin(), command.argv.end(), "localhost/primus:cpu");
  ASSERT_NE(image, command.argv.end());
  EXPECT_EQ(joined({image + 1, command.argv.end()}), "primus-cli -- train pretrain --config configs/exp.yaml");
  EXPECT_EQ(probe_argv(command).back(), "--version");
  request.binary = {"host", "--binary"};
  EXPECT_CONTAINS(usage_error(request), "--binary 'host': expected mounted (this primus-cli) or image");
}

TEST(ContainerCommandTest, RuntimeAndImageAreChecked) {
  ContainerRequest request = base_request();
  request.runtime = {"lxc", "--runtime"};
  EXPECT_CONTAINS(usage_error(request), "--runtime 'lxc': expected podman or docker");
  request = base_request();
  request.runtime = {"singularity", "exp.yaml:3: container.runtime"};
  EXPECT_CONTAINS(usage_error(request), "exp.yaml:3: container.runtime 'singularity': expected podman or docker");
  request = base_request();
  request.image = {"Primus:Latest", "--image"};
  EXPECT_CONTAINS(usage_error(request), "--image 'Primus:Latest': not a valid image reference");
  request.image = {"", "--image"};
  EXPECT_CONTAINS(usage_error(request), "container mode needs an image: give --image IMAGE");
  request = base_request();
  request.command.clear();
  EXPECT_CONTAINS(usage_error(request), "no command given");
}

TEST(ContainerCommandTest, ImageReferences) {
  for (const char* good :
       {"primus", "localhost/primus:cpu", "docker.io/rocm/dev-ubuntu-24.04:6.4-complete",
        "nvcr.io/nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04", "registry:5000/a/b__c-d.e:v1.2_3",
        "ubuntu@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "0123456789ab"}) {
    EXPECT_TRUE(is_valid_image_reference(good)) << good;
  }
  for (const char* bad : {"", "Bad Image!", "UPPER/case", "primus:", "primus:tag with space", "/primus", "primus/",
                          "a//b", "primus@sha256:short", "-primus", "primus:-tag"}) {
    EXPECT_FALSE(is_valid_image_reference(bad)) << bad;
  }
}

TEST(ContainerCommandTest, ShownCommandLinesMaskSecretAssignmentsAndQuote) {
  EXPECT_EQ(shown_command_line({"train", "pretrain", "wandb_api_key=abc", "--hf_token=x",
                                "modules.pre_trainer.overrides.secret_key=y", "lr=1e-3", "a b", "it's"}),
            "train pretrain wandb_api_key=*** --hf_token=*** modules.pre_trainer.overrides.secret_key=*** lr=1e-3 "
            "'a b' 'it'\\''s'");
}

}  // namespace
}  // namespace primus::cli
