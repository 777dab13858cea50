// The installable program: `cmake --install <build> --prefix TMP` puts bin/primus-cli and share/primus/configs
// there, and the installed binary, run from a folder outside the source tree without PRIMUS_CONFIGS_DIR, prints its
// version and validates an installed example config with the installed presets; `cpack -G DEB` makes a .deb with
// the binary, the configs and Depends on the Debian libraries it links (skipped without dpkg-deb).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "support/cli_process.h"
#include "support/test_support.h"

extern char** environ;

namespace primus {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

struct Outcome {
  int exit_code = -1;  // 1000 + signal when killed; -1 when it ran past the limit (then killed)
  std::string out;
};

// Runs argv in `cwd` with stdout and stderr together in a file, waiting at most `limit`.
Outcome run(const std::vector<std::string>& args, const std::string& cwd, std::chrono::seconds limit) {
  const std::string log = testing::temp_dir("install_run") + "/out";
  std::vector<std::string> copies(args);
  std::vector<char*> argv;
  for (std::string& a : copies) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  Outcome result;
  if (spawned != 0) {
    result.out = "cannot start " + args.front();
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.out = testing::read_text(log) + "\n(killed after the time limit)";
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
  result.out = testing::read_text(log);
  return result;
}

bool on_path(const std::string& program) {
  return run({"sh", "-c", "command -v " + program}, "/", std::chrono::seconds(10)).exit_code == 0;
}

class Install : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    const char* old = std::getenv("PRIMUS_CONFIGS_DIR");
    saved_configs_dir_ = old ? std::optional<std::string>(old) : std::nullopt;
    unsetenv("PRIMUS_CONFIGS_DIR");  // the installed binary must find its configs by itself
  }
  void TearDown() override {
    if (saved_configs_dir_) setenv("PRIMUS_CONFIGS_DIR", saved_configs_dir_->c_str(), 1);
  }
  std::optional<std::string> saved_configs_dir_;
};

TEST_F(Install, InstalledBinaryFindsItsConfigsOutsideTheSourceTree) {
  const std::string prefix = testing::temp_dir("install_prefix");
  Outcome install = run({PRIMUS_CMAKE_COMMAND, "--install", PRIMUS_BINARY_DIR, "--prefix", prefix}, "/",
                    std::chrono::seconds(120));
  ASSERT_EQ(install.exit_code, 0) << install.out;
  for (const char* file : {"bin/primus-cli", "share/primus/configs/models/llama3.2_1B.yaml",
                           "share/primus/configs/models/llama3.1_base.yaml", "share/primus/configs/models/tiny_llama.yaml",
                           "share/primus/configs/examples/tiny_cpu.yaml", "share/primus/configs/examples/default_cpu.yaml",
                           "share/primus/configs/H200/llama3.2_1B-bf16-pretrain.yaml"}) {
    EXPECT_TRUE(fs::is_regular_file(fs::path(prefix) / file)) << file << " not installed under " << prefix;
  }
  const std::string binary = prefix + "/bin/primus-cli";
  const std::string elsewhere = testing::temp_dir("install_cwd");  // not the source tree, not the build tree
  Outcome version = run({binary, "--version"}, elsewhere, std::chrono::seconds(60));
  ASSERT_EQ(version.exit_code, 0) << version.out;
  EXPECT_TRUE(version.out.starts_with(std::string("primus-cli ") + PRIMUS_VERSION + " (built ")) << version.out;
  const std::string example = prefix + "/share/primus/configs/examples/tiny_cpu.yaml";
  Outcome validate = run({binary, "config", "validate", "--config", example}, elsewhere, std::chrono::seconds(60));
  ASSERT_EQ(validate.exit_code, 0) << validate.out;
  EXPECT_CONTAINS(validate.out, "OK: " + example);
  // The preset came from the installed configs, not from the source tree the binary was built from.
  Outcome show = run({binary, "config", "show", "--config", example}, elsewhere, std::chrono::seconds(60));
  ASSERT_EQ(show.exit_code, 0) << show.out;
  EXPECT_CONTAINS(show.out, "share/primus/configs/models/tiny_llama.yaml:3");
  EXPECT_EQ(show.out.find(PRIMUS_SOURCE_DIR "/configs"), std::string::npos) << show.out;
  // A preset by name in a config of the user's own, outside both trees.
  const std::string own = elsewhere + "/mine.yaml";
  std::ofstream(own) << "exp_name: mine\nmodules:\n  pre_trainer:\n    framework: megatron\n    model: qwen3_0.6B\n"
                        "    overrides:\n      train_iters: 10\n      micro_batch_size: 1\n      global_batch_size: 1\n"
                        "      seq_length: 128\n      lr: 1.0e-4\n      mock_data: true\n";
  Outcome mine = run({binary, "config", "validate", "--config", own}, elsewhere, std::chrono::seconds(60));
  EXPECT_EQ(mine.exit_code, 0) << mine.out;
}

TEST_F(Install, CpackBuildsADebWithTheBinaryConfigsAndDepends) {
  if (!on_path("dpkg-deb")) GTEST_SKIP() << "dpkg-deb is not installed: the .deb cannot be built or read here";
  if (!on_path("dpkg-shlibdeps")) GTEST_SKIP() << "dpkg-shlibdeps (dpkg-dev) is not installed: CPack cannot list Depends";
  const std::string out = testing::temp_dir("cpack_out");
  Outcome cpack = run({PRIMUS_CPACK_COMMAND, "-G", "DEB", "--config", PRIMUS_BINARY_DIR "/CPackConfig.cmake", "-B", out},
                  out, std::chrono::seconds(300));
  ASSERT_EQ(cpack.exit_code, 0) << cpack.out;
  std::string found;
  for (const auto& entry : fs::directory_iterator(out)) {
    if (entry.path().extension() == ".deb") found = entry.path().string();
  }
  ASSERT_FALSE(found.empty()) << "no .deb in " << out << ":\n" << cpack.out;
  Outcome info = run({"dpkg-deb", "--field", found, "Package", "Version", "Depends"}, out, std::chrono::seconds(60));
  ASSERT_EQ(info.exit_code, 0) << info.out;
  EXPECT_CONTAINS(info.out, "Package: primus-cli");
  EXPECT_CONTAINS(info.out, std::string("Version: ") + PRIMUS_VERSION);
  for (const char* library : {"libc6", "libstdc++6", "libyaml-cpp", "libgloo", "libzstd1", "libsentencepiece"}) {
    EXPECT_CONTAINS(info.out, library);
  }
  Outcome contents = run({"dpkg-deb", "--contents", found}, out, std::chrono::seconds(60));
  ASSERT_EQ(contents.exit_code, 0) << contents.out;
  EXPECT_CONTAINS(contents.out, "./usr/bin/primus-cli");
  EXPECT_CONTAINS(contents.out, "./usr/share/primus/configs/models/llama3.2_1B.yaml");
  EXPECT_CONTAINS(contents.out, "./usr/share/primus/configs/examples/tiny_cpu.yaml");
}

}  // namespace
}  // namespace primus
