// `data preprocess`: JSONL, JSONL.zst and text inputs into an indexed dataset; identical output for any worker
// count; malformed lines named by file:line or counted; corrupt .zst; progress lines; and the CLI commands
// (preprocess, inspect) with their exit codes.
#include "data/preprocess.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "data/indexed_dataset.h"
#include "data/preprocess_input.h"
#include "data/tokenizer.h"
#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

std::string zstd_compress(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::string random_text(Rng& rng, size_t n) {
  // Whole UTF-8 characters (JSON text must be valid UTF-8), quotes and escapes included.
  static const std::vector<std::string> alphabet = {"a",  "b",  "c",  "x",      "y",      " ",
                                                    "\"", "\\", "\t", "\u00e9", "\u4e2d", "!"};
  std::string s;
  for (size_t i = 0; i < n; ++i) s += alphabet[rng.below(alphabet.size())];
  return s;
}

std::vector<std::string> documents_of(const IndexedDataset& data) {
  std::vector<std::string> docs;
  for (int64_t k = 0; k < data.num_documents(); ++k) {
    std::string text;
    for (int64_t s = data.document_entry(k); s < data.document_entry(k + 1); ++s) {
      for (int32_t id : data.sequence(s))
        text += id == ByteLevelTokenizer::kEodId ? std::string("<EOD>") : std::string(1, static_cast<char>(id));
    }
    docs.push_back(text);
  }
  return docs;
}

PreprocessOptions quiet_options(std::vector<std::string> inputs, std::string prefix) {
  PreprocessOptions options;
  options.inputs = std::move(inputs);
  options.output_prefix = std::move(prefix);
  return options;
}

TEST(Preprocess, ReadsJsonlZstdTextAndDirectoriesInOrder) {
  std::string dir = testing::temp_dir("pre-inputs");
  Rng rng(1);
  std::string a = random_text(rng, 40), b = random_text(rng, 25), c = random_text(rng, 30);
  nlohmann::json line_a = {{"text", a}, {"id", 1}}, line_b = {{"meta", {{"x", 1}}}, {"text", b}};
  write_file_atomic(dir + "/a.jsonl", line_a.dump() + "\n\n" + line_b.dump() + "\n" + R"({"text": ""})");
  write_file_atomic(dir + "/b.jsonl.zst", zstd_compress(nlohmann::json({{"text", c}}).dump() + "\n"));
  fs::create_directories(dir + "/books/sub");
  write_file_atomic(dir + "/books/sub/2.txt", "second book");
  write_file_atomic(dir + "/books/1.txt", "first book\n");
  write_file_atomic(dir + "/books/.hidden", "never read");

  PreprocessOptions options = quiet_options({dir + "/a.jsonl", dir + "/b.jsonl.zst", dir + "/books"}, dir + "/out/ds");
  options.append_eod = true;
  ByteLevelTokenizer tokenizer;
  PreprocessResult result = preprocess_to_indexed(options, tokenizer);
  EXPECT_EQ(result.prefix, dir + "/out/ds_text_document");
  EXPECT_EQ(result.documents, 6);
  EXPECT_EQ(result.empty_documents, 1);

  IndexedDataset data(result.prefix);
  EXPECT_EQ(data.dtype(), TokenDType::kU16);
  EXPECT_EQ(documents_of(data), (std::vector<std::string>{a + "<EOD>", b + "<EOD>", "", c + "<EOD>",
                                                          "first book\n<EOD>", "second book<EOD>"}));
  EXPECT_EQ(data.num_sequences(), 5);  // the empty document has no sequence, only a repeated boundary
  EXPECT_EQ(data.num_tokens(), result.tokens);
}

TEST(Preprocess, OutputIsIdenticalForAnyWorkerCount) {
  std::string dir = testing::temp_dir("pre-workers");
  Rng rng(2);
  std::string jsonl;
  for (int i = 0; i < 3000; ++i) jsonl += nlohmann::json({{"text", random_text(rng, rng.below(80))}}).dump() + "\n";
  write_file_atomic(dir + "/big.jsonl", jsonl);
  write_file_atomic(dir + "/big2.jsonl.zst", zstd_compress(jsonl));
  ByteLevelTokenizer tokenizer;
  std::vector<std::string> outputs;
  for (int workers : {1, 3, 8}) {
    PreprocessOptions options =
        quiet_options({dir + "/big.jsonl", dir + "/big2.jsonl.zst"}, dir + "/w" + std::to_string(workers));
    options.workers = workers;
    options.batch_bytes = 997;  // many small batches, so many are in flight and finish out of order
    PreprocessResult result = preprocess_to_indexed(options, tokenizer);
    EXPECT_EQ(result.documents, 6000);
    outputs.push_back(read_file(result.prefix + ".idx") + read_file(result.prefix + ".bin"));
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], outputs[2]);
}

TEST(Preprocess, MalformedLinesNameFileAndLineOrAreCounted) {
  std::string dir = testing::temp_dir("pre-bad");
  write_file_atomic(dir + "/in.jsonl",
                    "{\"text\": \"ok\"}\n\n{\"text\": \"fine\"}\n{\"text\": oops}\n{\"body\": \"x\"}\n"
                    "[1, 2]\n{\"text\": 5}\n{\"text\": \"last\"}");
  ByteLevelTokenizer tokenizer;
  PreprocessOptions options = quiet_options({dir + "/in.jsonl"}, dir + "/out");
  options.workers = 2;
  try {
    preprocess_to_indexed(options, tokenizer);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find(dir + "/in.jsonl:4: malformed JSON"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/out_text_document.idx"));  // nothing half-written is left
  EXPECT_FALSE(fs::exists(dir + "/out_text_document.bin"));

  options.skip_bad_lines = true;
  PreprocessResult result = preprocess_to_indexed(options, tokenizer);
  EXPECT_EQ(result.bad_lines, 4);
  EXPECT_EQ(result.documents, 3);
  ASSERT_EQ(result.bad_line_examples.size(), 4u);
  EXPECT_EQ(result.bad_line_examples[1], dir + "/in.jsonl:5: no string field 'text'");
  EXPECT_EQ(result.bad_line_examples[3], dir + "/in.jsonl:7: no string field 'text'");
  EXPECT_EQ(documents_of(IndexedDataset(result.prefix)), (std::vector<std::string>{"ok", "fine", "last"}));

  options.json_key = "body";
  result = preprocess_to_indexed(options, tokenizer);
  EXPECT_EQ(result.prefix, dir + "/out_body_document");
  EXPECT_EQ(result.documents, 1);
}

TEST(Preprocess, CorruptOrTruncatedZstdIsARuntimeErrorWithFileAndOffset) {
  std::string dir = testing::temp_dir("pre-zstd");
  Rng rng(3);
  std::string text;
  for (int i = 0; i < 200; ++i) text += nlohmann::json({{"text", random_text(rng, 50)}}).dump() + "\n";
  std::string packed = zstd_compress(text);
  write_file_atomic(dir + "/cut.jsonl.zst", packed.substr(0, packed.size() / 2));
  std::string garbled = packed;
  for (size_t i = 20; i < 40; ++i) garbled[i] = static_cast<char>(garbled[i] ^ 0x5A);
  write_file_atomic(dir + "/bad.jsonl.zst", garbled);
  write_file_atomic(dir + "/junk.jsonl.zst", "this is not zstd at all");
  ByteLevelTokenizer tokenizer;
  for (std::string name : {"cut", "bad", "junk"}) {
    std::string path = dir + "/" + name + ".jsonl.zst";
    try {
      preprocess_to_indexed(quiet_options({path}, dir + "/o"), tokenizer);
      ADD_FAILURE() << name << ": no error";
    } catch (const RuntimeError& error) {
      EXPECT_NE(std::string(error.what()).find(path + ": "), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("byte offset"), std::string::npos) << error.what();
    } catch (const UsageError& error) {
      // Garbled data may decode to bytes that are not JSON before zstd's checksum notices.
      EXPECT_EQ(name, "bad") << error.what();
    }
  }
}

TEST(Preprocess, RejectsBadOptionsAndMissingInputs) {
  std::string dir = testing::temp_dir("pre-opts");
  ByteLevelTokenizer tokenizer;
  EXPECT_THROW(preprocess_to_indexed(quiet_options({dir + "/missing.jsonl"}, dir + "/o"), tokenizer), UsageError);
  fs::create_directories(dir + "/empty");
  EXPECT_THROW(preprocess_to_indexed(quiet_options({dir + "/empty"}, dir + "/o"), tokenizer), UsageError);
  write_file_atomic(dir + "/x.txt", "x");
  PreprocessOptions options = quiet_options({dir + "/x.txt"}, dir + "/o");
  options.workers = 0;
  EXPECT_THROW(preprocess_to_indexed(options, tokenizer), UsageError);
  options.workers = 1;
  options.output_prefix = "";
  EXPECT_THROW(preprocess_to_indexed(options, tokenizer), UsageError);
}

// Files in `dir` whose name holds ".tmp.": what a run that failed half-way would leave behind.
std::vector<std::string> temporaries_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) found.push_back(entry.path().string());
  }
  return found;
}

// Issue 12 hole 4: --workers 100000 used to abort (a std::thread left joinable when a later one failed to start).
TEST(Preprocess, TooManyWorkersIsAUsageErrorNamingTheFlag) {
  std::string dir = testing::temp_dir("pre-workers");
  write_file_atomic(dir + "/x.txt", "x");
  PreprocessOptions options = quiet_options({dir + "/x.txt"}, dir + "/o");
  options.workers = 100000;
  try {
    preprocess_to_indexed(options, ByteLevelTokenizer());
    FAIL() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("--workers 100000"), std::string::npos) << error.what();
  }
  options.workers = kMaxPreprocessWorkers;
  EXPECT_EQ(preprocess_to_indexed(options, ByteLevelTokenizer()).documents, 1);
  EXPECT_TRUE(temporaries_in(dir).empty());
}

// A stop signal (Ctrl-C) ends the run at the next batch with 128 + N, and removes the half-written output.
TEST(Preprocess, StopSignalEndsTheRunAndLeavesNoTemporaries) {
  std::string dir = testing::temp_dir("pre-stop");
  std::string text;
  for (int i = 0; i < 100; ++i) text += nlohmann::json({{"text", "document " + std::to_string(i)}}).dump() + "\n";
  write_file_atomic(dir + "/a.jsonl", text);
  PreprocessOptions options = quiet_options({dir + "/a.jsonl"}, dir + "/o");
  options.batch_bytes = 64;
  int polls = 0;
  options.stop_signal = [&polls] { return ++polls > 5 ? SIGINT : 0; };
  try {
    preprocess_to_indexed(options, ByteLevelTokenizer());
    FAIL() << "expected the run to stop";
  } catch (const Error& error) {
    EXPECT_EQ(error.exit_code(), 128 + SIGINT);
    EXPECT_NE(std::string(error.what()).find("stopped by signal"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(temporaries_in(dir).empty()) << temporaries_in(dir).front();
  EXPECT_FALSE(fs::exists(dir + "/o_text_document.bin"));
}

// Threads that cannot start (here: an address space too small for their stacks) are a clean RuntimeError, and the
// half-written output is removed. Runs in a child process so the limit stays there.
TEST(Preprocess, ThreadsThatCannotStartAreARuntimeErrorAndLeaveNoTemporaries) {
  std::string dir = testing::temp_dir("pre-threads");
  write_file_atomic(dir + "/x.txt", "x");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit limit{size_t{1} << 30, size_t{1} << 30};  // 1 GiB: room for the process, not for 1000 8-MiB stacks
    setrlimit(RLIMIT_AS, &limit);
    PreprocessOptions options = quiet_options({dir + "/x.txt"}, dir + "/o");
    options.workers = 1000;
    try {
      preprocess_to_indexed(options, ByteLevelTokenizer());
    } catch (const RuntimeError& error) {
      bool named = std::string(error.what()).find("--workers") != std::string::npos;
      _exit(named ? 0 : 11);
    } catch (...) {
      _exit(12);
    }
    _exit(13);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "11: message without --workers, 12: another exception, 13: no error";
  EXPECT_TRUE(temporaries_in(dir).empty()) << temporaries_in(dir).front();
  EXPECT_FALSE(fs::exists(dir + "/o_text_document.bin"));
}

TEST(Preprocess, InputStreamSplitsLinesAcrossChunks) {
  std::string dir = testing::temp_dir("pre-lines");
  Rng rng(4);
  std::vector<std::string> lines;
  std::string text;
  for (int i = 0; i < 50; ++i) {
    lines.push_back(random_text(rng, rng.below(3) == 0 ? 70000 : rng.below(100)));  // some longer than a chunk
    text += lines.back() + "\n";
  }
  text.pop_back();  // the last line has no newline
  write_file_atomic(dir + "/t.jsonl.zst", zstd_compress(text));
  InputFile file = list_preprocess_inputs({dir + "/t.jsonl.zst"}).at(0);
  EXPECT_TRUE(file.jsonl);
  EXPECT_TRUE(file.zstd);
  InputStream stream(file);
  std::string line;
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_TRUE(stream.next_line(line));
    ASSERT_EQ(line, lines[i]) << "line " << i;
    EXPECT_EQ(stream.line_number(), static_cast<int64_t>(i) + 1);
  }
  EXPECT_FALSE(stream.next_line(line));
  EXPECT_EQ(stream.consumed_bytes(), file.size_bytes);
}

// Progress reports: bytes consumed never go back, documents add up, and the last report is final and complete.
// (The bar drawn from them is tested in progress_test.cpp.)
TEST(Preprocess, ReportsProgressAfterEachBatchAndAtTheEnd) {
  std::string dir = testing::temp_dir("pre-progress");
  std::string text;
  for (int i = 0; i < 200; ++i) text += nlohmann::json({{"text", "document " + std::to_string(i)}}).dump() + "\n";
  write_file_atomic(dir + "/a.jsonl", text);
  PreprocessOptions options = quiet_options({dir + "/a.jsonl"}, dir + "/o");
  options.batch_bytes = 256;  // many batches
  options.workers = 3;
  std::vector<PreprocessProgress> reports;
  options.on_progress = [&](const PreprocessProgress& p) { reports.push_back(p); };
  PreprocessResult result = preprocess_to_indexed(options, ByteLevelTokenizer());
  ASSERT_GT(reports.size(), 5u);
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].bytes_total, static_cast<int64_t>(text.size()));
    EXPECT_EQ(reports[i].final, i + 1 == reports.size());
    if (i > 0) {
      EXPECT_GE(reports[i].bytes_done, reports[i - 1].bytes_done);
      EXPECT_GE(reports[i].documents, reports[i - 1].documents);
    }
  }
  EXPECT_EQ(reports.back().bytes_done, static_cast<int64_t>(text.size()));
  EXPECT_EQ(reports.back().documents, 200);
  EXPECT_EQ(result.documents, 200);
}

// The command line: preprocess, inspect, and the exit codes for bad lines (2) and corrupt files (3).
TEST(DataCli, PreprocessThenInspectAndExitCodes) {
  ASSERT_TRUE(fs::exists(testing::cli_path())) << "build primus-cli first: " << testing::cli_path();
  std::string dir = testing::temp_dir("data-cli");
  write_file_atomic(dir + "/in.jsonl", "{\"text\": \"hello world\"}\n{\"text\": \"second\"}\n");
  auto run = [&](std::vector<std::string> args) { return testing::wait_cli(testing::spawn_cli(args, dir), dir); };
  testing::CliResult made =
      run({"--", "data", "preprocess", "--input", dir + "/in.jsonl", "--tokenizer-type", "ByteLevelTokenizer",
           "--output-prefix", dir + "/ds", "--workers", "2", "--append-eod"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_NE(made.out.find("2 documents"), std::string::npos) << made.out;
  EXPECT_NE(made.err.find("preprocess: 100.0%"), std::string::npos) << made.err;

  std::string prefix = dir + "/ds_text_document";
  testing::CliResult shown = run({"--", "data", "inspect", prefix + ".idx", "--tokenizer-type", "ByteLevelTokenizer",
                                  "--document", "1", "--sample", "0", "--seq-length", "4"});
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("documents        2"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("tokens           19"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("document 1 (7 tokens):\nsecond\n"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("histogram"), std::string::npos) << shown.out;

  std::string idx = read_file(prefix + ".idx");
  idx[17] = 42;
  write_file_atomic(prefix + ".idx", idx);
  testing::CliResult corrupt = run({"--", "data", "inspect", prefix});
  EXPECT_EQ(corrupt.exit_code, 3) << corrupt.err;
  EXPECT_NE(corrupt.err.find(prefix + ".idx: corrupt indexed dataset at byte offset 17"), std::string::npos)
      << corrupt.err;

  write_file_atomic(dir + "/bad.jsonl", "{\"text\": \"a\"}\nnot json\n");
  testing::CliResult bad = run({"--", "data", "preprocess", "--input", dir + "/bad.jsonl", "--tokenizer",
                                "ByteLevelTokenizer", "--output-prefix", dir + "/b"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find(dir + "/bad.jsonl:2: malformed JSON"), std::string::npos) << bad.err;
  testing::CliResult skipped = run({"--", "data", "preprocess", "--input", dir + "/bad.jsonl", "--tokenizer",
                                    "ByteLevelTokenizer", "--output-prefix", dir + "/b", "--skip-bad-lines"});
  EXPECT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_NE(skipped.out.find("skipped 1 malformed lines"), std::string::npos) << skipped.out;

  testing::CliResult too_many = run({"--", "data", "preprocess", "--input", dir + "/in.jsonl", "--tokenizer",
                                     "ByteLevelTokenizer", "--output-prefix", dir + "/w", "--workers", "100000"});
  EXPECT_EQ(too_many.exit_code, 2) << too_many.err;
  EXPECT_NE(too_many.err.find("--workers 100000"), std::string::npos) << too_many.err;
  EXPECT_TRUE(temporaries_in(dir).empty()) << temporaries_in(dir).front();
}

}  // namespace
}  // namespace primus
