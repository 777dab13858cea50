// The preprocess pipeline: read batches in order, tokenize them on worker threads, write them in order.
#include "data/preprocess.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess_input.h"

namespace primus {

namespace {

constexpr size_t kMaxBadLineExamples = 5;

struct Job {
  const InputFile* file = nullptr;
  int64_t first_line = 0;          // line number of lines[0]
  std::vector<std::string> lines;  // JSONL lines
  std::string text;                // a whole text document (when !file->jsonl)
  int64_t bytes_done = 0;          // input bytes consumed once this job was read
};

struct BadLine {
  int64_t line = 0;
  std::string why;
};

struct JobResult {
  const InputFile* file = nullptr;
  std::vector<int32_t> tokens;   // every document's tokens back to back
  std::vector<int64_t> lengths;  // [documents]
  std::vector<BadLine> bad;
  int64_t bytes_done = 0;
};

// A fixed set of threads running submitted jobs; futures carry results and exceptions back in order of the
// caller's choosing. Destruction drops jobs not started yet and joins.
class WorkerPool {
 public:
  // Throws RuntimeError when the system cannot start that many threads, after joining those that did start
  // (a joinable std::thread destroyed during unwinding would call std::terminate).
  explicit WorkerPool(int threads) {
    try {
      for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
    } catch (const std::system_error& error) {
      stop_and_join();
      throw RuntimeError(fmt::format("cannot start tokenizing thread {} of --workers {}: {}; try fewer workers",
                                     threads_.size() + 1, threads, error.what()));
    }
  }
  ~WorkerPool() { stop_and_join(); }
  std::future<JobResult> submit(std::function<JobResult()> work) {
    std::packaged_task<JobResult()> task(std::move(work));
    std::future<JobResult> result = task.get_future();
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
    return result;
  }

 private:
  void stop_and_join() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void run() {
    for (;;) {
      std::packaged_task<JobResult()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (stop_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<JobResult()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

bool is_blank(const std::string& line) { return line.find_first_not_of(" \t\r\f\v") == std::string::npos; }

// Tokenizes one document into `result`, with eod after a non-empty document when asked (as Megatron).
void add_document(JobResult& result, const Tokenizer& tokenizer, std::string_view text, bool append_eod) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  if (append_eod && !ids.empty()) ids.push_back(tokenizer.eod_id());
  result.tokens.insert(result.tokens.end(), ids.begin(), ids.end());
  result.lengths.push_back(static_cast<int64_t>(ids.size()));
}

JobResult tokenize_job(const Job& job, const Tokenizer& tokenizer, const std::string& key, bool append_eod) {
  JobResult result;
  result.file = job.file;
  result.bytes_done = job.bytes_done;
  if (!job.file->jsonl) {
    try {
      add_document(result, tokenizer, job.text, append_eod);
    } catch (const Error& error) {
      throw UsageError(fmt::format("{}: {}", job.file->path, error.what()));
    }
    return result;
  }
  for (size_t i = 0; i < job.lines.size(); ++i) {
    const std::string& line = job.lines[i];
    int64_t number = job.first_line + static_cast<int64_t>(i);
    if (is_blank(line)) continue;
    nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) {
      result.bad.push_back({number, "malformed JSON"});
      continue;
    }
    auto field = value.is_object() ? value.find(key) : value.end();
    if (!value.is_object() || field == value.end() || !field->is_string()) {
      result.bad.push_back({number, fmt::format("no string field '{}'", key)});
      continue;
    }
    try {
      add_document(result, tokenizer, field->get_ref<const std::string&>(), append_eod);
    } catch (const Error& error) {
      throw UsageError(fmt::format("{}:{}: {}", job.file->path, number, error.what()));
    }
  }
  return result;
}

void throw_if_stopped(const PreprocessOptions& options) {
  int signal_number = options.stop_signal ? options.stop_signal() : 0;
  if (signal_number != 0) {
    throw Error(128 + signal_number,
                fmt::format("data preprocess: stopped by signal {}; no output written", signal_number));
  }
}

}  // namespace

PreprocessResult preprocess_to_indexed(const PreprocessOptions& options, const Tokenizer& tokenizer) {
  if (options.workers < 1 || options.workers > kMaxPreprocessWorkers) {
    throw UsageError(fmt::format("--workers {}: must be in [1, {}] (this machine has {} hardware threads)",
                                 options.workers, kMaxPreprocessWorkers, std::thread::hardware_concurrency()));
  }
  if (options.json_key.empty()) throw UsageError("--json-key must not be empty");
  if (options.output_prefix.empty()) throw UsageError("--output-prefix must not be empty");
  if (options.batch_bytes < 1)
    throw UsageError(fmt::format("batch size must be >= 1 byte, got {}", options.batch_bytes));

  std::vector<InputFile> files = list_preprocess_inputs(options.inputs);
  PreprocessResult result;
  result.prefix = fmt::format("{}_{}_document", options.output_prefix, options.json_key);
  int64_t bytes_total = 0;
  for (const InputFile& file : files) bytes_total += static_cast<int64_t>(file.size_bytes);

  IndexedDatasetWriter writer(result.prefix, token_dtype_for_vocab(tokenizer.vocab_size()));
  const auto start = std::chrono::steady_clock::now();
  std::deque<std::future<JobResult>> in_flight;
  const size_t max_in_flight = 2 * static_cast<size_t>(options.workers);

  auto write_next = [&] {
    JobResult done = in_flight.front().get();
    in_flight.pop_front();
    for (const BadLine& bad : done.bad) {
      std::string where = fmt::format("{}:{}: {}", done.file->path, bad.line, bad.why);
      if (!options.skip_bad_lines) {
        throw UsageError(fmt::format("{} (--skip-bad-lines counts such lines and goes on)", where));
      }
      ++result.bad_lines;
      if (result.bad_line_examples.size() < kMaxBadLineExamples) result.bad_line_examples.push_back(where);
    }
    size_t begin = 0;
    for (int64_t length : done.lengths) {
      writer.add_document(std::span<const int32_t>(done.tokens.data() + begin, static_cast<size_t>(length)));
      begin += static_cast<size_t>(length);
      ++result.documents;
      if (length == 0) ++result.empty_documents;
    }
    result.tokens += static_cast<int64_t>(done.tokens.size());
    if (options.on_progress) options.on_progress({result.documents, done.bytes_done, bytes_total, false});
  };

  {
    WorkerPool pool(options.workers);
    auto submit = [&](Job job) {
      throw_if_stopped(options);
      while (in_flight.size() >= max_in_flight) write_next();
      auto shared = std::make_shared<Job>(std::move(job));
      in_flight.push_back(pool.submit([shared, &tokenizer, &options] {
        return tokenize_job(*shared, tokenizer, options.json_key, options.append_eod);
      }));
    };
    int64_t bytes_before = 0;
    for (const InputFile& file : files) {
      InputStream stream(file);
      if (!file.jsonl) {
        Job job{&file, 1, {}, stream.read_all(), 0};
        job.bytes_done = bytes_before + static_cast<int64_t>(stream.consumed_bytes());
        submit(std::move(job));
      } else {
        Job job{&file, 1, {}, {}, 0};
        int64_t job_bytes = 0;
        std::string line;
        while (stream.next_line(line)) {
          if (job.lines.empty()) job.first_line = stream.line_number();
          job_bytes += static_cast<int64_t>(line.size()) + 1;
          job.lines.push_back(std::move(line));
          if (job_bytes >= options.batch_bytes) {
            job.bytes_done = bytes_before + static_cast<int64_t>(stream.consumed_bytes());
            submit(std::move(job));
            job = Job{&file, 1, {}, {}, 0};
            job_bytes = 0;
          }
        }
        if (!job.lines.empty()) {
          job.bytes_done = bytes_before + static_cast<int64_t>(stream.consumed_bytes());
          submit(std::move(job));
        }
      }
      bytes_before += static_cast<int64_t>(stream.consumed_bytes());
    }
    while (!in_flight.empty()) write_next();
  }
  writer.finish();
  result.input_bytes = bytes_total;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.on_progress) options.on_progress({result.documents, bytes_total, bytes_total, true});
  return result;
}

}  // namespace primus
