// `primus-cli report` end to end: train a tiny model through the binary, write its report, and render the page
// in headless Chromium (Debian's `chromium`, installed by scripts/setup.sh --test): a screenshot that is a real
// picture, the charts in the DOM, and no console errors. Also the exit codes of bad run directories.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/cli_process.h"
#include "support/test_support.h"

extern char** environ;

namespace primus {
namespace {

namespace fs = std::filesystem;

using testing::cli_path;
using testing::CliResult;
using testing::read_text;
using testing::spawn_cli;
using testing::wait_cli;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// Debian's chromium on PATH, or $PRIMUS_CHROMIUM; empty when there is none.
std::string find_chromium() {
  if (const char* given = std::getenv("PRIMUS_CHROMIUM"); given != nullptr && *given != '\0') return given;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    for (const char* name : {"chromium", "chromium-browser"}) {
      const fs::path candidate = fs::path(dir) / name;
      if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  }
  return "";
}

struct ProcessResult {
  int exit_code = -1;  // 1000 + signal number when killed (also after the timeout)
  std::string out, err;
};

// Runs `argv` with stdout and stderr in files under `dir`; killed after `timeout`.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& dir,
                          std::chrono::seconds timeout = std::chrono::seconds(120)) {
  std::vector<std::string> copies(argv);
  std::vector<char*> args;
  for (std::string& arg : copies) args.push_back(arg.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir + "/process.out").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (dir + "/process.err").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int started = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ProcessResult result;
  if (started != 0) {
    result.err = "cannot start " + argv[0];
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
  result.out = read_text(dir + "/process.out");
  result.err = read_text(dir + "/process.err");
  return result;
}

// Chromium logs the page's console messages and uncaught exceptions to stderr as
// "[...:INFO:CONSOLE:LINE] "message", source: URL (LINE)"; the report has no scripts, so there should be none.
std::vector<std::string> console_lines(const std::string& chromium_stderr) {
  std::vector<std::string> lines;
  std::istringstream in(chromium_stderr);
  for (std::string line; std::getline(in, line);) {
    if (line.find(":CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos) {
      lines.push_back(line);
    }
  }
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

class ReportRenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << cli_path() << " not found: build the primus-cli target first";
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    ASSERT_FALSE(testing::use_default_data().empty()) << "scripts/prepare_default_data.sh failed (see stderr)";
    dir_ = testing::temp_dir("report-render");
  }

  CliResult cli(const std::vector<std::string>& args) { return wait_cli(spawn_cli(args, dir_), dir_); }

  // Headless Chromium on `url` with its own profile folder; `extra` adds --screenshot=... or --dump-dom.
  ProcessResult chromium(const std::string& url, const std::vector<std::string>& extra) {
    const std::string binary = find_chromium();
    std::vector<std::string> argv{binary,
                                  "--headless",
                                  "--disable-gpu",
                                  "--no-sandbox",
                                  "--no-first-run",
                                  "--user-data-dir=" + dir_ + "/chromium-profile",
                                  "--window-size=1200,2000",
                                  "--enable-logging=stderr",
                                  "--v=0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(url);
    return run_process(argv, dir_);
  }

  void require_chromium() {
    ASSERT_FALSE(find_chromium().empty())
        << "chromium not found on PATH (or $PRIMUS_CHROMIUM): install Debian's chromium package, e.g. "
           "bash scripts/setup.sh --test";
  }

  std::string dir_;
};

// Width and height from a PNG's IHDR chunk (bytes 16..23, big-endian); {0, 0} when `bytes` is not a PNG.
std::pair<uint32_t, uint32_t> png_size(const std::string& bytes) {
  if (bytes.size() < 24 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || bytes.compare(12, 4, "IHDR") != 0) {
    return {0, 0};
  }
  auto be32 = [&](size_t at) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
    return value;
  };
  return {be32(16), be32(20)};
}

TEST_F(ReportRenderTest, TinyRunReportRendersInHeadlessChromiumWithoutErrors) {
  ASSERT_NO_FATAL_FAILURE(require_chromium());
  // The sample prompt lands in config.yaml and so in the page: unescaped, it would log a console error.
  const std::string workspace = dir_ + "/workspace";
  CliResult train =
      cli({"train", "pretrain", "--config", PRIMUS_SOURCE_DIR "/configs/examples/tiny_cpu.yaml",
           "workspace=" + workspace, "exp_name=report_run", "train_iters=24", "log_interval=2", "eval_interval=8",
           "save_interval=0", "sample_length=0", "sample_prompt=<script>console.error('unescaped')</script>"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const std::string run_dir = workspace + "/report_run";

  CliResult report = cli({"report", run_dir});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const fs::path html = fs::path(run_dir) / "report.html";
  EXPECT_CONTAINS(report.out, "wrote " + html.string() + ": 7 charts from 12 metric records (steps 2 to 24)");
  ASSERT_TRUE(fs::exists(html));

  const std::string url = "file://" + html.string();
  const std::string screenshot = dir_ + "/report.png";
  ProcessResult shot = chromium(url, {"--screenshot=" + screenshot});
  ASSERT_EQ(shot.exit_code, 0) << shot.err;
  EXPECT_EQ(join(console_lines(shot.err)), "");
  ASSERT_TRUE(fs::exists(screenshot)) << shot.err;
  const std::string png = read_text(screenshot);
  EXPECT_EQ(png_size(png), (std::pair<uint32_t, uint32_t>{1200, 2000}));
  // A page of one colour compresses to a few KB; charts, tables and text take far more.
  EXPECT_GT(png.size(), 40u * 1024) << "the screenshot looks blank";

  ProcessResult dom = chromium(url, {"--dump-dom"});
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_EQ(join(console_lines(dom.err)), "");
  EXPECT_EQ(count(dom.out, "<svg"), 7u);
  for (const char* series :
       {"loss", "eval_loss", "lr", "tokens_per_s", "tflops_per_gpu", "grad_norm", "step_ms", "mem_peak_gib"}) {
    EXPECT_CONTAINS(dom.out, std::string("data-series=\"") + series + "\"");
  }
  EXPECT_CONTAINS(dom.out, "data-series=\"loss\" data-points=\"12\"");
  EXPECT_CONTAINS(dom.out, "data-series=\"eval_loss\" data-points=\"3\"");
  EXPECT_CONTAINS(dom.out, "<h1>Run report: report_run</h1>");
  EXPECT_CONTAINS(dom.out, "<td>cpu (");  // the device, from the run's log
  EXPECT_CONTAINS(dom.out, "&lt;script&gt;console.error(");
  EXPECT_EQ(dom.out.find("<script"), std::string::npos);
}

// The console check above would be worthless if Chromium stopped logging console messages this way.
TEST_F(ReportRenderTest, ConsoleCheckSeesAPageError) {
  ASSERT_NO_FATAL_FAILURE(require_chromium());
  const std::string page = dir_ + "/broken.html";
  std::ofstream(page) << "<!DOCTYPE html><html><body><p>broken</p><script>missing_function();</script></body></html>\n";
  ProcessResult dom = chromium("file://" + page, {"--dump-dom"});
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_CONTAINS(join(console_lines(dom.err)), "Uncaught ReferenceError: missing_function is not defined");
}

TEST_F(ReportRenderTest, BadRunDirectoriesExitTwoNamingFileAndLine) {
  CliResult missing = cli({"report", dir_ + "/no_such_run"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_CONTAINS(missing.err, "primus-cli: error: run directory " + dir_ + "/no_such_run does not exist");

  fs::create_directories(dir_ + "/empty_run");
  CliResult no_metrics = cli({"report", dir_ + "/empty_run"});
  EXPECT_EQ(no_metrics.exit_code, 2);
  EXPECT_CONTAINS(no_metrics.err, dir_ + "/empty_run/metrics.jsonl not found");

  std::ofstream(dir_ + "/empty_run/metrics.jsonl") << "{\"step\":1,\"loss\":5.0}\n{\"step\":2,\"loss\":4.9\n";
  CliResult malformed = cli({"report", dir_ + "/empty_run"});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_CONTAINS(malformed.err, dir_ + "/empty_run/metrics.jsonl:2:");
  EXPECT_FALSE(fs::exists(dir_ + "/empty_run/report.html"));

  // --output names the file; its folder is created. No config.yaml or log: the page says so.
  std::ofstream(dir_ + "/empty_run/metrics.jsonl") << "{\"step\":1,\"loss\":5.0}\n";
  CliResult written = cli({"report", dir_ + "/empty_run", "--output", dir_ + "/out/r.html"});
  EXPECT_EQ(written.exit_code, 0) << written.err;
  EXPECT_CONTAINS(read_text(dir_ + "/out/r.html"), "config.yaml not found");

  CliResult help = cli({"report", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_CONTAINS(help.out, "RUN_DIR");
  EXPECT_CONTAINS(help.out, "--output");
}

}  // namespace
}  // namespace primus
