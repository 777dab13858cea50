// `primus-cli -- data preprocess|inspect`: turn text into Megatron indexed datasets and look inside them.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/cli.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "observe/progress.h"
#include "train/signals.h"

namespace primus::cli {
namespace {

constexpr const char* kPreprocessFooter =
    R"(Inputs: *.jsonl / *.json (one JSON object a line; the document is the string under --json-key),
the same with .zst (Zstandard, streamed), any other file is one plain-text document; directories are read
recursively in path order (hidden entries skipped). Blank lines are skipped.
Writes {output-prefix}_{json-key}_document.bin and .idx (Megatron-LM's MMIDIDX format; uint16 tokens when
the vocabulary has < 65500 ids, else int32). Progress goes to stderr: a bar with MB/s and ETA on a terminal,
else a line every --log-interval seconds and a closing line (PRIMUS_PROGRESS=0: none).

Examples:
  primus-cli -- data preprocess --input corpus.jsonl.zst --tokenizer-type ByteLevelTokenizer \
      --output-prefix data/corpus --workers 8 --append-eod
  primus-cli -- data preprocess --input books/ --tokenizer-type ByteLevelTokenizer --output-prefix data/books)";

constexpr const char* kInspectFooter =
    R"(PREFIX is the dataset path without .idx/.bin (a path ending in either is accepted).
A corrupt .idx/.bin exits 3 naming the file and byte offset.

Examples:
  primus-cli -- data inspect data/corpus_text_document
  primus-cli -- data inspect data/corpus_text_document --tokenizer-type ByteLevelTokenizer --document 3
  primus-cli -- data inspect data/corpus_text_document --tokenizer-type ByteLevelTokenizer --sample 10 --seq-length 1024)";

struct PreprocessArguments {
  PreprocessOptions options;
  std::string tokenizer_type;
  std::string tokenizer_model;
  double progress_interval_s = 5.0;
};

int run_preprocess(const PreprocessArguments& arguments) {
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(arguments.tokenizer_type, arguments.tokenizer_model);
  // Input bytes consumed (on disk), with documents as the second counter; the finished bar stays.
  ProgressBar bar({.label = "preprocess",
                   .unit = ProgressUnit::kBytes,
                   .secondary_name = "docs",
                   .line_interval_s = arguments.progress_interval_s},
                  ProgressOutput::standard_error());
  PreprocessOptions options = arguments.options;
  // Ctrl-C or SIGTERM stops at the next batch, so the half-written output is removed (a second signal exits now).
  install_stop_handlers();
  options.stop_signal = stop_signal;
  options.on_progress = [&bar](const PreprocessProgress& progress) {
    bar.set_total(progress.bytes_total);
    bar.update(progress.bytes_done, progress.documents);
    if (progress.final) bar.finish();
  };
  PreprocessResult result = preprocess_to_indexed(options, *tokenizer);
  fmt::print("wrote {}.bin and {}.idx: {} documents ({} empty), {} tokens ({}) from {:.1f} MB in {:.1f} s\n",
             result.prefix, result.prefix, result.documents, result.empty_documents, result.tokens,
             token_dtype_name(static_cast<uint8_t>(token_dtype_for_vocab(tokenizer->vocab_size()))),
             static_cast<double>(result.input_bytes) / 1e6, result.seconds);
  if (result.bad_lines > 0) {
    fmt::print("skipped {} malformed lines, e.g.:\n", result.bad_lines);
    for (const std::string& example : result.bad_line_examples) fmt::print("  {}\n", example);
  }
  std::fflush(stdout);
  return kExitOk;
}

struct InspectArguments {
  std::string prefix;
  std::string tokenizer_type;
  std::string tokenizer_model;
  int64_t document = -1;
  int64_t sample = -1;
  int64_t seq_length = 2048;
  int64_t num_samples = 0;
  std::string split = "969,30,1";
  int64_t seed = 1234;
};

void print_histogram(const IndexedDataset& data) {
  int64_t min_length = data.num_sequences() > 0 ? std::numeric_limits<int64_t>::max() : 0;
  int64_t max_length = 0;
  std::vector<int64_t> buckets(33, 0);  // bucket b: lengths in [2^(b-1), 2^b), bucket 0: length 0
  for (int64_t s = 0; s < data.num_sequences(); ++s) {
    int64_t length = data.sequence_length(s);
    min_length = std::min(min_length, length);
    max_length = std::max(max_length, length);
    size_t b = 0;
    while (b < 32 && (int64_t{1} << b) <= length) ++b;
    ++buckets[b];
  }
  double mean = data.num_sequences() > 0 ? static_cast<double>(data.num_tokens()) / data.num_sequences() : 0.0;
  fmt::print("sequence length  min {} / mean {:.1f} / max {}\n", min_length, mean, max_length);
  fmt::print("histogram of sequence lengths (tokens):\n");
  int64_t most = *std::max_element(buckets.begin(), buckets.end());
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b] == 0) continue;
    std::string range = b == 0 ? "0" : fmt::format("[{}, {})", int64_t{1} << (b - 1), int64_t{1} << b);
    size_t bar = most > 0 ? static_cast<size_t>((buckets[b] * 50 + most - 1) / most) : 0;
    fmt::print("  {:>24} {:>12} {}\n", range, buckets[b], std::string(bar, '#'));
  }
}

void print_tokens(const std::vector<int32_t>& ids, const Tokenizer* tokenizer) {
  if (tokenizer != nullptr) {
    fmt::print("{}\n", tokenizer->decode(ids));
  } else {
    fmt::print("{}\n(ids; give --tokenizer-type to decode)\n", fmt::join(ids, " "));
  }
}

int run_inspect(const InspectArguments& arguments) {
  std::string prefix = strip_indexed_suffix(arguments.prefix);
  auto data = std::make_shared<const IndexedDataset>(prefix);
  std::unique_ptr<Tokenizer> tokenizer;
  if (!arguments.tokenizer_type.empty()) {
    tokenizer = make_tokenizer(arguments.tokenizer_type, arguments.tokenizer_model);
  }
  std::error_code ec;
  fmt::print("dataset          {}\n", prefix);
  fmt::print("files            {} ({} bytes), {} ({} bytes)\n", idx_path(prefix),
             std::filesystem::file_size(idx_path(prefix), ec), bin_path(prefix),
             std::filesystem::file_size(bin_path(prefix), ec));
  fmt::print("dtype            {}\n", token_dtype_name(static_cast<uint8_t>(data->dtype())));
  fmt::print("documents        {}\n", data->num_documents());
  fmt::print("sequences        {}\n", data->num_sequences());
  fmt::print("tokens           {}\n", data->num_tokens());
  print_histogram(*data);

  if (arguments.document >= 0) {
    if (arguments.document >= data->num_documents()) {
      throw UsageError(
          fmt::format("--document {}: the dataset has {} documents", arguments.document, data->num_documents()));
    }
    std::vector<int32_t> ids;
    for (int64_t s = data->document_entry(arguments.document); s < data->document_entry(arguments.document + 1); ++s) {
      std::vector<int32_t> part = data->sequence(s);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    fmt::print("\ndocument {} ({} tokens):\n", arguments.document, ids.size());
    print_tokens(ids, tokenizer.get());
  }
  if (arguments.sample >= 0) {
    GPTDatasetConfig config;
    config.seq_length = arguments.seq_length;
    config.split = arguments.split;
    if (arguments.seed < 0 || arguments.seed > 0xFFFFFFFFll) {
      throw UsageError(fmt::format("--seed must be in [0, 2^32), got {}", arguments.seed));
    }
    config.seed = static_cast<uint32_t>(arguments.seed);
    config.use_cache = false;
    int64_t num_samples = arguments.num_samples > 0 ? arguments.num_samples : arguments.sample + 1;
    GPTDataset dataset(data, kSplitTrain, num_samples, config);
    std::vector<int32_t> ids(static_cast<size_t>(arguments.seq_length + 1));
    dataset.read_sample(arguments.sample, ids);
    fmt::print("\ntrain sample {} of {} (seq_length {} + 1 tokens, split '{}', seed {}, {} epochs):\n",
               arguments.sample, dataset.size(), arguments.seq_length, arguments.split, arguments.seed,
               dataset.plan().num_epochs);
    print_tokens(ids, tokenizer.get());
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void add_data_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* data = root.add_subcommand("data", "Datasets: preprocess text into indexed datasets, inspect them");
  data->require_subcommand(1);
  data->footer(
      "Examples:\n  primus-cli -- data preprocess --input corpus.jsonl --tokenizer-type ByteLevelTokenizer "
      "--output-prefix data/corpus\n  primus-cli -- data inspect data/corpus_text_document");

  auto pre = std::make_shared<PreprocessArguments>();
  CLI::App* preprocess =
      data->add_subcommand("preprocess", "Tokenize JSONL/text into a Megatron indexed dataset (.bin/.idx)");
  preprocess->add_option("--input", pre->options.inputs, "Input files or directories")->required()->type_name("PATH");
  preprocess->add_option("--json-key,--json-keys,--json_key", pre->options.json_key, "JSON field holding the text")
      ->capture_default_str();
  preprocess->add_option("--tokenizer-type,--tokenizer_type,--tokenizer", pre->tokenizer_type, "Tokenizer type")
      ->required()
      ->type_name("TYPE");
  preprocess
      ->add_option("--tokenizer-model,--tokenizer_model", pre->tokenizer_model, "Tokenizer file, if the type needs one")
      ->type_name("FILE");
  preprocess->add_option("--output-prefix,--output_prefix", pre->options.output_prefix, "Output path prefix")
      ->required()
      ->type_name("PREFIX");
  preprocess
      ->add_option("--workers", pre->options.workers, fmt::format("Tokenizing threads, 1 to {}", kMaxPreprocessWorkers))
      ->capture_default_str();
  preprocess->add_flag("--append-eod,--append_eod", pre->options.append_eod,
                       "Append the tokenizer's end-of-document id to every non-empty document");
  preprocess->add_flag("--skip-bad-lines,--skip_bad_lines", pre->options.skip_bad_lines,
                       "Count and report malformed JSON lines instead of stopping at the first");
  preprocess
      ->add_option("--log-interval", pre->progress_interval_s,
                   "Seconds between progress lines when stderr is not a terminal (a terminal gets a live bar)")
      ->capture_default_str();
  preprocess->footer(kPreprocessFooter);
  preprocess->final_callback([&launch, &action, pre] {
    action = [&launch, pre] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
        return static_cast<int>(kExitOk);
      }
      return run_preprocess(*pre);
    };
  });

  auto ins = std::make_shared<InspectArguments>();
  CLI::App* inspect = data->add_subcommand("inspect", "Summarise an indexed dataset and decode a document or sample");
  inspect->add_option("prefix", ins->prefix, "Dataset prefix (PREFIX.idx and PREFIX.bin)")
      ->required()
      ->type_name("PREFIX");
  inspect
      ->add_option("--tokenizer-type,--tokenizer_type,--tokenizer", ins->tokenizer_type,
                   "Tokenizer to decode with (ids are printed without one)")
      ->type_name("TYPE");
  inspect
      ->add_option("--tokenizer-model,--tokenizer_model", ins->tokenizer_model, "Tokenizer file, if the type needs one")
      ->type_name("FILE");
  inspect->add_option("--document", ins->document, "Decode document K")->type_name("K");
  inspect->add_option("--sample", ins->sample, "Decode training sample K of a GPT dataset over PREFIX")->type_name("K");
  inspect->add_option("--seq-length,--seq_length", ins->seq_length, "Sample length for --sample")
      ->capture_default_str();
  inspect->add_option("--num-samples,--num_samples", ins->num_samples,
                      "Samples the GPT dataset is built for (default K + 1; the order depends on it)");
  inspect->add_option("--split", ins->split, "Megatron split for --sample")->capture_default_str();
  inspect->add_option("--seed", ins->seed, "Shuffle seed for --sample")->capture_default_str();
  inspect->footer(kInspectFooter);
  inspect->final_callback([&launch, &action, ins] {
    action = [&launch, ins] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
        return static_cast<int>(kExitOk);
      }
      return run_inspect(*ins);
    };
  });
}

}  // namespace primus::cli
