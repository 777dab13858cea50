// `primus-cli container` against a real Podman that this test sets up itself: its own containers.conf (runc,
// no default ulimits: what these machines need, ../shared/docs/PARALLEL.md) and its own image store in a
// temporary folder, and an image built from the test's own files with no registry: `podman import` of a
// skeleton root file system (empty /usr, /etc/passwd, the merged-/usr links), run with the host's /usr mounted
// read-only, so that the binary mounted by container mode finds its libraries. The tiny CPU training job
// runs in it and writes its run directory through the mount; a missing image, an image the binary cannot run
// in, and the command's own failure give their exit codes. Skips with the reason where Podman cannot run
// containers here (not root, not installed, the runtime fails). The checks that need no Podman (bad runtime,
// runtime not installed, secrets in a dry run) are ContainerModeTest and always run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::read_text;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)
#define EXPECT_LACKS(text, part) \
  EXPECT_EQ((text).find(part), std::string::npos) << "unexpected '" << (part) << "' in:\n" << (text)

const std::string kTinyConfig = PRIMUS_SOURCE_DIR "/configs/examples/tiny_cpu.yaml";

struct Shell {
  int code = -1;
  std::string output;
};

// Runs a shell command (stdout and stderr together). Every podman call is wrapped in `timeout`.
Shell shell(const std::string& command) {
  Shell result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  int status = ::pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000;
  return result;
}

std::string podman(const std::string& arguments) { return "timeout 60 podman " + arguments; }

bool on_path(const std::string& program) { return shell("command -v " + program + " >/dev/null").code == 0; }

// Steps logged in metrics.jsonl (train lines carry "loss" and "step").
std::vector<int> logged_steps(const fs::path& metrics) {
  std::vector<int> steps;
  std::ifstream in(metrics);
  std::string line;
  static const std::regex step(R"("step":\s*(\d+))");
  while (std::getline(in, line)) {
    std::smatch match;
    if (line.find("\"loss\"") != std::string::npos && std::regex_search(line, match, step)) {
      steps.push_back(std::stoi(match[1]));
    }
  }
  return steps;
}

// Waits for a primus-cli started by spawn_cli at most timeout_s, then kills it (its runtime gets SIGTERM through
// PR_SET_PDEATHSIG and stops the container) and fails the test.
CliResult wait_bounded(pid_t pid, const std::string& dir, int timeout_s = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  siginfo_t info{};
  while (pid > 0 && std::chrono::steady_clock::now() < deadline) {
    info.si_pid = 0;
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (pid > 0 && info.si_pid != pid) {
    ::kill(pid, SIGKILL);
    ADD_FAILURE() << "primus-cli did not finish within " << timeout_s << " s; killed";
  }
  return testing::wait_cli(pid, dir);
}

CliResult run_cli_in(const std::vector<std::string>& args, const std::string& dir) {
  return wait_bounded(testing::spawn_cli(args, dir), dir);
}

// ---- Podman suite ------------------------------------------------------------------------------------------

class ContainerPodmanTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason_.clear();
    // The checkout is the working directory (as under ctest): it is mounted, the temporary folders are not.
    fs::current_path(PRIMUS_SOURCE_DIR);
    if (::getuid() != 0) {
      skip_reason_ = "not root: these machines run Podman as root (rootless Podman needs subuid ranges)";
      return;
    }
    if (!on_path("podman")) {
      skip_reason_ = "podman is not installed (scripts/setup.sh --test installs Debian's podman and runc)";
      return;
    }
    if (!on_path("runc")) {
      skip_reason_ = "runc is not installed (crun fails on these machines' cgroups; scripts/setup.sh --test)";
      return;
    }
    dir_ = testing::temp_dir("container");
    // Podman settings of this test only: runc, no default ulimits, and an image store of its own, so that
    // nothing it makes can touch (or be confused with) the machine's images and containers.
    std::ofstream(dir_ + "/containers.conf") << "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n";
    std::ofstream(dir_ + "/storage.conf")
        << "[storage]\ndriver = \"vfs\"\ngraphroot = \"" << dir_ << "/graph\"\nrunroot = \"" << dir_ << "/run\"\n";
    ::setenv("CONTAINERS_CONF", (dir_ + "/containers.conf").c_str(), 1);
    ::setenv("CONTAINERS_STORAGE_CONF", (dir_ + "/storage.conf").c_str(), 1);

    // The image: a skeleton root file system; /usr comes from the host at run time.
    fs::path rootfs = fs::path(dir_) / "rootfs";
    for (const char* sub : {"usr", "etc", "tmp", "proc", "sys", "dev", "run", "root", "var/tmp"}) {
      fs::create_directories(rootfs / sub);
    }
    for (const char* link : {"bin", "lib", "lib64", "sbin"})
      fs::create_symlink(std::string("usr/") + link, rootfs / link);
    std::ofstream(rootfs / "etc/passwd") << "root:x:0:0:root:/root:/bin/sh\n";
    std::ofstream(rootfs / "etc/group") << "root:x:0:\n";
    // Debian's /usr/lib links some libraries (OpenBLAS) through /etc/alternatives; the loader's cache helps too.
    Shell tar =
        shell("timeout 60 tar -C '" + rootfs.string() + "' -cf '" + dir_ +
              "/rootfs.tar' . && timeout 60 tar -C / -rf '" + dir_ + "/rootfs.tar' etc/alternatives etc/ld.so.cache");
    if (tar.code != 0) {
      skip_reason_ = "cannot pack the test image's root file system: " + tar.output;
      return;
    }
    image_ = "localhost/primus-container-test:" + std::to_string(::getpid());
    Shell import = shell(podman("import '" + dir_ + "/rootfs.tar' " + image_));
    if (import.code != 0) {
      skip_reason_ = "podman cannot import an image here: " + import.output;
      return;
    }
    Shell probe = shell(podman("run --rm --network host --volume /usr:/usr:ro " + image_ + " /bin/true"));
    if (probe.code != 0) {
      skip_reason_ = "podman cannot run a container here (exit " + std::to_string(probe.code) + "): " + probe.output;
    }
  }

  static void TearDownTestSuite() {
    if (dir_.empty()) return;
    // Everything lives in this test's own store: remove it all, containers first.
    Shell containers = shell(podman("rm -af"));
    Shell images = shell(podman("rmi -af"));
    EXPECT_EQ(containers.code, 0) << containers.output;
    EXPECT_EQ(images.code, 0) << images.output;
    std::error_code ignored;
    fs::remove_all(dir_ + "/graph", ignored);
    fs::remove_all(dir_ + "/run", ignored);
    ::unsetenv("CONTAINERS_CONF");
    ::unsetenv("CONTAINERS_STORAGE_CONF");
  }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    data_ = testing::use_default_data();
    ASSERT_FALSE(data_.empty()) << "scripts/prepare_default_data.sh failed (see stderr)";
    ::setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    case_dir_ = testing::temp_dir("container-case");
    // The workspace lies outside the working directory (the checkout, for ctest): only the run-directory
    // mount can carry the run's files out.
    workspace_ = case_dir_ + "/workspace";
    ::setenv("PRIMUS_WORKSPACE", workspace_.c_str(), 1);
  }

  void TearDown() override {
    ::unsetenv("PRIMUS_WORKSPACE");
    if (!skip_reason_.empty()) return;
    Shell left = shell(podman("ps -a --format '{{.Names}}'"));
    EXPECT_EQ(left.code, 0) << left.output;
    EXPECT_EQ(left.output, "") << "containers left behind";
  }

  CliResult run(const std::vector<std::string>& args) { return run_cli_in(args, case_dir_); }

  static std::string skip_reason_;
  static std::string dir_;
  static std::string image_;
  std::string data_;
  std::string case_dir_;
  std::string workspace_;
};

std::string ContainerPodmanTest::skip_reason_;
std::string ContainerPodmanTest::dir_;
std::string ContainerPodmanTest::image_;

TEST_F(ContainerPodmanTest, TinyJobTrainsInsideTheImageAndWritesItsRunDirectoryThroughTheMount) {
  CliResult result = run({"container",
                          "--image",
                          image_,
                          "--runtime",
                          "podman",
                          "--volume",
                          "/usr:/usr:ro",
                          "--env",
                          "OMP_NUM_THREADS=1",
                          "--env",
                          "HF_TOKEN=hf_container_test_secret",
                          "--",
                          "train",
                          "pretrain",
                          "--config",
                          kTinyConfig,
                          "exp_name=in_container",
                          "train_iters=4",
                          "lr_warmup_iters=1",
                          "eval_interval=2",
                          "save_interval=4",
                          "sample_length=0"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.err, "container: podman run --rm --name primus-");
  EXPECT_CONTAINS(result.err, "--volume " + workspace_ + "/in_container:" + workspace_ + "/in_container:rw");
  EXPECT_CONTAINS(result.err, "--env HF_TOKEN ");
  EXPECT_LACKS(result.err + result.out, "hf_container_test_secret");
  const fs::path run_dir = fs::path(workspace_) / "in_container";
  EXPECT_EQ(logged_steps(run_dir / "metrics.jsonl"), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_TRUE(fs::exists(run_dir / "config.yaml"));
  EXPECT_TRUE(fs::is_directory(run_dir / "checkpoints"));
}

TEST_F(ContainerPodmanTest, SigtermReachesTheTrainerInTheContainerWhichCheckpointsAndExits143) {
  const std::string dir = case_dir_;
  pid_t pid =
      testing::spawn_cli({"container", "--image", image_, "--volume", "/usr:/usr:ro", "--env", "OMP_NUM_THREADS=1",
                          "--", "train", "pretrain", "--config", kTinyConfig, "exp_name=stopped", "train_iters=100000",
                          "eval_interval=100000", "save_interval=100000", "sample_length=0"},
                         dir);
  ASSERT_GT(pid, 0);
  // Bounded wait for the first logged step: the trainer is running inside the container then.
  const fs::path run_dir = fs::path(workspace_) / "stopped";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (logged_steps(run_dir / "metrics.jsonl").empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  bool started = !logged_steps(run_dir / "metrics.jsonl").empty();
  ::kill(pid, SIGTERM);
  CliResult result = wait_bounded(pid, dir);
  ASSERT_TRUE(started) << "no step within 90 s:\n" << result.err;
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  // One signal, forwarded once: the trainer saved a checkpoint after its current step.
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "latest_checkpointed_iteration.txt")) << result.err;
  EXPECT_CONTAINS(result.err, "container: stopped by signal 15");
}

TEST_F(ContainerPodmanTest, TheConfigsContainerSectionSuppliesImageVolumesAndEnvAndSecretsStayMasked) {
  const std::string config = case_dir_ + "/exp.yaml";
  std::ofstream(config) << "extends: " << kTinyConfig << "\n"
                        << "exp_name: from_section\n"
                        << "env:\n  WANDB_API_KEY: wandb_container_test_secret\n"
                        << "container:\n  runtime: podman\n  options:\n    image: " << image_ << "\n"
                        << "    volume:\n      - /usr:/usr:ro\n    env:\n      - OMP_NUM_THREADS=1\n";
  CliResult result = run({"container", "--", "config", "show", "--config", config});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // `config show` ran in the container and printed the section it was started from.
  EXPECT_CONTAINS(result.out, "container.options.image");
  EXPECT_CONTAINS(result.out, image_);
  EXPECT_CONTAINS(result.out, "env.WANDB_API_KEY");
  EXPECT_CONTAINS(result.out, "***");
  EXPECT_LACKS(result.out + result.err, "wandb_container_test_secret");
  EXPECT_CONTAINS(result.err, "--volume /usr:/usr:ro");
}

TEST_F(ContainerPodmanTest, AnImageThatIsNotHereIsNamedWithExitTwo) {
  CliResult result = run({"container", "--image", "localhost/primus-no-such-image:1", "--", "config", "validate",
                          "--config", kTinyConfig});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_CONTAINS(result.err,
                  "primus-cli: error: --image 'localhost/primus-no-such-image:1': no such image in "
                  "podman's local storage");
  EXPECT_LACKS(result.err, "container: podman run");
}

TEST_F(ContainerPodmanTest, AnImageTheBinaryCannotRunInFailsWithExitThree) {
  // Without the host's /usr the image has no loader and no libraries for the mounted primus-cli.
  CliResult result = run({"container", "--image", image_, "--", "config", "validate", "--config", kTinyConfig});
  EXPECT_EQ(result.exit_code, 3) << result.err;
  EXPECT_CONTAINS(result.err, "primus-cli could not be executed in image " + image_);
  EXPECT_CONTAINS(result.err, "must hold its loader and shared libraries");
  EXPECT_LACKS(result.err, "container: podman run");  // the probe failed: the command never started
}

TEST_F(ContainerPodmanTest, TheCommandsExitCodeReachesTheCaller) {
  // `report` of a directory that does not exist: checked only when it runs, in the container (exit 2).
  CliResult result =
      run({"container", "--image", image_, "--volume", "/usr:/usr:ro", "--", "report", case_dir_ + "/no-such-run"});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_CONTAINS(result.err, "container: podman run");
  EXPECT_CONTAINS(result.err, "no-such-run");
  EXPECT_CONTAINS(result.err, "container: the command exited with code 2");
}

TEST_F(ContainerPodmanTest, ABadImageNameIsRejectedBeforePodmanRuns) {
  CliResult result =
      run({"container", "--image", "Primus:Latest", "--", "config", "validate", "--config", kTinyConfig});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_CONTAINS(result.err, "--image 'Primus:Latest': not a valid image reference");
}

// ---- Without Podman -------------------------------------------------------------------------------------------

class ContainerModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    ::setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    dir_ = testing::temp_dir("container-mode");
    const char* path = std::getenv("PATH");
    path_ = path != nullptr ? path : "";
  }
  void TearDown() override { ::setenv("PATH", path_.c_str(), 1); }

  CliResult run(const std::vector<std::string>& args) { return run_cli_in(args, dir_); }

  std::string dir_;
  std::string path_;
};

TEST_F(ContainerModeTest, AnUnknownRuntimeIsNamedWithExitTwo) {
  CliResult result = run(
      {"container", "--runtime", "lxc", "--image", "localhost/x", "--", "config", "validate", "--config", kTinyConfig});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "primus-cli: error: --runtime 'lxc': expected podman or docker");
}

TEST_F(ContainerModeTest, ARuntimeThatIsNotInstalledIsNamedWithExitTwo) {
  ::setenv("PATH", (dir_ + "/empty-path").c_str(), 1);
  CliResult given = run({"container", "--runtime", "docker", "--image", "localhost/x", "--", "config", "validate",
                         "--config", kTinyConfig});
  EXPECT_EQ(given.exit_code, 2);
  EXPECT_CONTAINS(given.err, "--runtime 'docker': docker is not installed (not in PATH)");
  CliResult none = run({"container", "--image", "localhost/x", "--", "config", "validate", "--config", kTinyConfig});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_CONTAINS(none.err, "no container runtime: neither podman nor docker is in PATH");
}

TEST_F(ContainerModeTest, ABadConfigExitsTwoBeforeAnyContainer) {
  CliResult result = run({"container", "--runtime", "podman", "--image", "localhost/x", "--", "train", "pretrain",
                          "--config", kTinyConfig, "lerning_rate=1"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "lerning_rate");
  EXPECT_LACKS(result.err, "container: podman run");
}

TEST_F(ContainerModeTest, DryRunShowsThePlanWithSecretsMasked) {
  ::setenv("PRIMUS_WORKSPACE", (dir_ + "/ws").c_str(), 1);
  CliResult result = run({"--dry-run",
                          "container",
                          "--runtime",
                          "podman",
                          "--image",
                          "localhost/primus:cpu",
                          "--env",
                          "HF_TOKEN=hf_dry_run_secret",
                          "--env",
                          "NCCL_DEBUG=INFO",
                          "--volume",
                          dir_ + ":/data:ro",
                          "--",
                          "train",
                          "pretrain",
                          "--config",
                          kTinyConfig,
                          "train_iters=5",
                          "lr_warmup_iters=1",
                          "--wandb_api_key=zzz_secret"});
  ::unsetenv("PRIMUS_WORKSPACE");
  // The override is not a config key, so the run stops at the config check; the secret is not printed.
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_LACKS(result.out + result.err, "zzz_secret");

  ::setenv("PRIMUS_WORKSPACE", (dir_ + "/ws").c_str(), 1);
  result = run({"--dry-run", "container", "--runtime", "podman", "--image", "localhost/primus:cpu", "--env",
                "HF_TOKEN=hf_dry_run_secret", "--env", "NCCL_DEBUG=INFO", "--volume", dir_ + ":/data:ro", "--", "train",
                "pretrain", "--config", kTinyConfig, "train_iters=5", "lr_warmup_iters=1"});
  ::unsetenv("PRIMUS_WORKSPACE");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_LACKS(result.out + result.err, "hf_dry_run_secret");
  EXPECT_CONTAINS(result.out, "mode         container");
  EXPECT_CONTAINS(result.out, "HF_TOKEN=***");
  EXPECT_CONTAINS(result.out, "NCCL_DEBUG=INFO");
  EXPECT_CONTAINS(result.out, "mount        " + dir_ + "/ws/tiny_cpu -> same path (rw, run directory)");
  EXPECT_CONTAINS(result.out, "mount        " + dir_ + " -> /data (ro, --volume)");
  EXPECT_CONTAINS(result.out, "podman run --rm");
  EXPECT_CONTAINS(result.out, "--env HF_TOKEN ");
  // A dry run creates nothing, not even the run directory it would mount.
  EXPECT_FALSE(fs::exists(dir_ + "/ws"));
}

}  // namespace
}  // namespace primus
