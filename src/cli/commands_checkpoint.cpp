// `primus-cli -- checkpoint convert`: native checkpoints (single-file or sharded) to a Hugging Face folder, and a
// Hugging Face folder to a native checkpoint (checkpoint/convert.h does the work).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "checkpoint/convert.h"
#include "cli/cli.h"
#include "train/checkpoint_progress.h"

namespace primus::cli {
namespace {

constexpr const char* kConvertFooter =
    R"(--to hf (the default): INPUT is a checkpoint iteration directory (iter_0000100/, with manifest.json) or a
save directory whose latest_checkpointed_iteration.txt names one, in either native format: the single-file one
of a world of one, or the sharded one of data-parallel ranks (index.json over shard_<r>_of_<n>.safetensors).
Every file is verified against the manifest first. OUTPUT gets model.safetensors (fp32, every weight whole,
Hugging Face names) and config.json, which transformers loads as LlamaForCausalLM / Qwen3ForCausalLM. The
optimizer state is not exported.

--to native: INPUT is a Hugging Face folder (config.json and model.safetensors, or shards listed by
model.safetensors.index.json; F32, BF16 or F16). OUTPUT becomes a save directory holding iteration 0:
iter_0000000/ and latest_checkpointed_iteration.txt, fp32 weights and a FRESH optimizer state (zero AdamW
moments, step 0, no samples consumed). Resume from it with `load: OUTPUT` and the same --seed as the run's;
an OUTPUT that already holds checkpoints is refused. To start training from Hugging Face weights without a
copy, `pretrained_checkpoint: INPUT` needs no conversion.

Exit codes: 2 for a missing or wrong INPUT or OUTPUT (the path is named), 3 for a corrupt file (named, with
the offset or the CRC the manifest expects).

Examples:
  primus-cli -- checkpoint convert --input output/llama/checkpoints --output hf/llama
  primus-cli -- checkpoint convert --input output/llama/checkpoints/iter_0002000 --output hf/llama-2000
  primus-cli -- checkpoint convert --to native --input hf/Llama-3.2-1B --output ckpt/llama1b --seed 1234)";

struct ConvertArguments {
  std::string input;
  std::string output;
  std::string to = "hf";
  int64_t seed = 1234;
};

int run_convert(const ConvertArguments& arguments) {
  if (!std::filesystem::exists(arguments.input)) {
    throw UsageError(fmt::format("--input {}: does not exist", arguments.input));
  }
  if (std::filesystem::exists(arguments.output) && !std::filesystem::is_directory(arguments.output)) {
    throw UsageError(fmt::format("--output {}: exists and is not a directory", arguments.output));
  }
  const CheckpointProgressFn bars = checkpoint_progress_bars(ProgressOutput::standard_error());
  if (arguments.to == "native") {
    const ConversionSummary summary = import_hf_to_checkpoint(arguments.input, arguments.output, arguments.seed, bars);
    fmt::print(
        "wrote {}: {} tensors, {} parameters ({:.1f} MB with the optimizer state), iteration 0, fresh "
        "optimizer state, seed {}\n",
        summary.written, summary.tensors, summary.parameters, static_cast<double>(summary.bytes) / 1e6, arguments.seed);
    if (!summary.ignored.empty()) {
      fmt::print("ignored {} tensors the model has no parameter for: {}\n", summary.ignored.size(),
                 fmt::join(summary.ignored, ", "));
    }
  } else {
    const std::string checkpoint = resolve_checkpoint_dir(arguments.input);
    const ConversionSummary summary = export_checkpoint_to_hf(checkpoint, arguments.output, bars);
    fmt::print("wrote {} and config.json: {} tensors, {} parameters ({:.1f} MB, fp32) from {} ({}, iteration {})\n",
               summary.written, summary.tensors, summary.parameters, static_cast<double>(summary.bytes) / 1e6,
               checkpoint, summary.sharded ? "sharded" : "single-file", summary.iteration);
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void add_checkpoint_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* checkpoint = root.add_subcommand("checkpoint", "Checkpoints: convert to and from Hugging Face folders");
  checkpoint->require_subcommand(1);
  checkpoint->footer(
      "Examples:\n  primus-cli -- checkpoint convert --input output/llama/checkpoints --output hf/llama\n"
      "  primus-cli -- checkpoint convert --to native --input hf/Llama-3.2-1B --output ckpt/llama1b");

  auto arguments = std::make_shared<ConvertArguments>();
  CLI::App* convert = checkpoint->add_subcommand(
      "convert", "Native checkpoint (single-file or sharded) -> Hugging Face folder, or back with --to native");
  convert
      ->add_option("--input", arguments->input,
                   "A checkpoint iteration directory or a save directory (--to hf); a Hugging Face folder (--to "
                   "native)")
      ->required()
      ->type_name("PATH");
  convert
      ->add_option("--output", arguments->output,
                   "The Hugging Face folder to write (--to hf); the save directory to create (--to native)")
      ->required()
      ->type_name("DIR");
  convert
      ->add_option("--to", arguments->to,
                   "hf: write a Hugging Face folder; native: import one as iteration 0 with a fresh optimizer state")
      ->check(CLI::IsMember({"hf", "native"}))
      ->capture_default_str();
  convert->add_option("--seed", arguments->seed, "--to native: the run seed recorded in the checkpoint")
      ->capture_default_str();
  convert->footer(kConvertFooter);
  convert->final_callback([&launch, &action, arguments] {
    action = [&launch, arguments] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
        return static_cast<int>(kExitOk);
      }
      return run_convert(*arguments);
    };
  });
}

}  // namespace primus::cli
