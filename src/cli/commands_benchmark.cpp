// `primus-cli -- benchmark train`: time the training step of an experiment config on synthetic tokens.
// `primus-cli -- benchmark comm` (alias `nccl`): collective bandwidth over the world communicator, on every rank.
// `primus-cli -- benchmark checkpoint`: save and load speed of a checkpoint of a given size (checkpoint_benchmark.h).
// `primus-cli -- benchmark gemm|attention`: the engine's GEMMs and attention at a config's shapes (kernel_benchmark.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "checkpoint/checkpoint_benchmark.h"
#include "cli/cli.h"
#include "config/config.h"
#include "parallel/comm_benchmark.h"
#include "parallel/distributed_env.h"
#include "tools/kernel_benchmark.h"
#include "train/benchmark.h"
#include "train/train_step.h"

namespace primus::cli {

namespace {

struct CommCommandOptions {
  std::string device = "auto";
  std::string min_bytes = "1K";
  std::string max_bytes = "1G";
  std::string ops = "all_reduce,reduce_scatter,all_gather,all_to_all,send_recv";
  std::string jsonl;
  double timeout_minutes = 10.0;
  CommBenchmarkOptions sweep;
};

// Runs on every rank of the job (`primus-cli direct --nproc-per-node N -- benchmark comm` starts them; without
// torchrun's variables it is a world of one); rank 0 prints and writes.
int run_benchmark_comm(CommCommandOptions& o) {
  o.sweep.min_bytes = parse_byte_size(o.min_bytes, "--min-bytes");
  o.sweep.max_bytes = parse_byte_size(o.max_bytes, "--max-bytes");
  o.sweep.ops.clear();
  for (size_t start = 0; start <= o.ops.size();) {
    size_t comma = std::min(o.ops.find(',', start), o.ops.size());
    if (comma > start) o.sweep.ops.push_back(o.ops.substr(start, comma - start));
    start = comma + 1;
  }
  validate_comm_benchmark_options(o.sweep);
  if (!(o.timeout_minutes > 0)) {
    throw UsageError(fmt::format("--timeout-minutes must be positive (got {})", o.timeout_minutes));
  }
  const DistributedEnv env = DistributedEnv::from_environment();
  std::ofstream jsonl;
  if (env.rank == 0 && !o.jsonl.empty()) {
    jsonl.open(o.jsonl, std::ios::trunc);
    if (!jsonl) throw UsageError(fmt::format("--jsonl {}: cannot write this file", o.jsonl));
  }
  const Device device = select_comm_device(o.device, env.local_rank);
  const auto timeout =
      std::chrono::duration_cast<DistributedTimeout>(std::chrono::duration<double>(o.timeout_minutes * 60.0));
  std::unique_ptr<Communicator> comm = make_world_communicator(env, device, timeout);
  const bool printer = comm->rank() == 0;
  if (printer) {
    fmt::print("{}\n{}\n", comm_benchmark_title(*comm, o.sweep), comm_benchmark_header());
    std::fflush(stdout);
  }
  run_comm_benchmark(*comm, o.sweep, [&](const CommBenchmarkRow& row) {
    if (!printer) return;
    fmt::print("{}\n", comm_benchmark_table_row(row));
    std::fflush(stdout);
    if (jsonl.is_open()) jsonl << comm_benchmark_json(*comm, o.sweep, row) << "\n" << std::flush;
  });
  comm->barrier();  // no rank leaves (closing its connections) while another still measures
  return static_cast<int>(kExitOk);
}

// `nccl` is registered as a second subcommand, not a CLI11 alias: the launcher's check for unknown command words
// compares names only.
void add_benchmark_comm_command(CLI::App& benchmark, const LaunchOptions& launch, Action& action, const char* name,
                                const char* description) {
  CLI::App* comm = benchmark.add_subcommand(name, description);
  auto o = std::make_shared<CommCommandOptions>();
  comm->add_option("--device", o->device, "cpu (Gloo), cuda (NCCL) or auto: the GPU LOCAL_RANK when there is one")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  comm->add_option("--min-bytes", o->min_bytes, "Smallest buffer (default 1K; suffixes K, M, G)")->type_name("BYTES");
  comm->add_option("--max-bytes", o->max_bytes, "Largest buffer (default 1G)")->type_name("BYTES");
  comm->add_option("--step-factor", o->sweep.step_factor, "Size multiplier from one row to the next (default 2)");
  comm->add_option("--iters", o->sweep.iters, "Timed iterations a size (default 20)");
  comm->add_option("--warmup", o->sweep.warmup, "Untimed iterations first (default 5)");
  comm->add_option("--ops", o->ops,
                   "Comma list (default all): all_reduce,reduce_scatter,all_gather,all_to_all,send_recv");
  comm->add_option("--jsonl", o->jsonl, "Rank 0 also writes one JSON object a row to FILE")->type_name("FILE");
  comm->add_option("--timeout-minutes", o->timeout_minutes,
                   "How long a rank waits for the others before failing (default 10)");
  comm->footer(
      "Bytes are the per-rank buffer of nccl-tests (reduce_scatter's input, all_gather's output); algbw = bytes /\n"
      "time; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for reduce_scatter, all_gather and all_to_all,\n"
      "x 1 for send_recv (ranks 2i -> 2i+1). A row's time is the slowest rank's mean over the timed iterations.\n\n"
      "Examples:\n  primus-cli -- benchmark comm --max-bytes 64M\n"
      "  primus-cli direct --nproc-per-node 8 -- benchmark nccl --jsonl out/comm.jsonl");
  comm->final_callback([&launch, &action, o] {
    action = [&launch, o] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
        return static_cast<int>(kExitOk);
      }
      return run_benchmark_comm(*o);
    };
  });
}

struct CheckpointCommandOptions {
  CheckpointBenchmarkOptions run;
  std::string device = "cpu";
  bool json = false;
};

void add_benchmark_checkpoint_command(CLI::App& benchmark, const LaunchOptions& launch, Action& action) {
  CLI::App* checkpoint = benchmark.add_subcommand(
      "checkpoint", "Save and load speed of a checkpoint of N GB through the real save and load paths");
  auto o = std::make_shared<CheckpointCommandOptions>();
  checkpoint->add_option("--size-gb", o->run.size_gb, "Weights plus AdamW moments, in GB (1e9 bytes)")
      ->required()
      ->type_name("N");
  checkpoint->add_option("--dir", o->run.dir, "Folder to write into (on the disk to measure)")
      ->required()
      ->type_name("DIR");
  checkpoint->add_option("--threads", o->run.threads, "I/O threads (default min(8, CPUs))");
  checkpoint->add_option("--device", o->device, "Where the model lives: cpu (default) or cuda (GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  checkpoint->add_flag("--keep", o->run.keep, "Leave the checkpoint in DIR/checkpoint-benchmark-<pid>");
  checkpoint->add_flag("--json", o->json, "Print one JSON object instead of the table");
  checkpoint->footer(
      "A Llama-shaped model with random weights and moments is saved (single-file format: write, fsync, rename),\n"
      "zeroed and loaded back (CRC32C verification of every file, then the tensors), first warm (the files in the\n"
      "page cache), then cold: the files dropped from the page cache with posix_fadvise(DONTNEED), when the kernel\n"
      "drops them (the table says how many pages stayed). Each load must give back the saved bytes (else exit 3).\n"
      "GB/s are the data files' bytes over the time. Needs about 20 bytes of memory per parameter (weights,\n"
      "gradients, moments) on the device and the checkpoint's size free in DIR.\n\n"
      "Examples:\n  primus-cli -- benchmark checkpoint --size-gb 2 --dir /tmp/ckpt-bench\n"
      "  primus-cli -- benchmark checkpoint --size-gb 14.8 --dir /local_nvme --device cuda --json");
  checkpoint->final_callback([&launch, &action, o] {
    action = [&launch, o] {
      if (launch.dry_run) {
        print_dry_run(launch, "", {}, nullptr);
        return static_cast<int>(kExitOk);
      }
      o->run.device = o->device == "cuda" ? Device{DeviceType::kCuda, 0} : kCpuDevice;
      const CheckpointBenchmarkResult result = run_checkpoint_benchmark(o->run);
      fmt::print("{}", o->json ? checkpoint_benchmark_json(result) : format_checkpoint_benchmark(result));
      std::fflush(stdout);
      return static_cast<int>(kExitOk);
    };
  });
}

struct KernelCommandOptions {
  std::string config_path;
  KernelBenchmarkOptions timing;
  std::string jsonl;
  std::string fp8;  // gemm only: "", tensorwise or blockwise
};

// `benchmark gemm` or `benchmark attention` of a config on its device (`device`, `bf16`), rank 0's shapes.
int run_kernel_benchmark(const std::string& kind, const KernelCommandOptions& o, const std::vector<std::string>& overrides) {
  LoadedConfig loaded = load_experiment_config(o.config_path, overrides);
  const TrainingArgs& t = loaded.config.train;
  const Device device = select_device(t.device);
  // Before the tokenizer is read for the vocabulary: the refusal names the option, not a missing file.
  if (!o.fp8.empty() && device.is_cpu()) throw UsageError(fp8_gemm_device_error(device));
  const ModelArgs args = with_vocab_size(loaded.config.model, t);
  std::ofstream jsonl;
  if (!o.jsonl.empty()) {
    jsonl.open(o.jsonl, std::ios::trunc);
    if (!jsonl) throw UsageError(fmt::format("--jsonl {}: cannot write this file", o.jsonl));
  }
  const DType dtype = compute_dtype(t, device);
  std::vector<KernelTiming> timings;
  std::optional<double> peak;
  if (!o.fp8.empty()) {
    timings = benchmark_fp8_gemms(args, t, device,
                                  o.fp8 == "blockwise" ? Fp8GemmRecipe::kBlockwise : Fp8GemmRecipe::kTensorwise,
                                  o.timing);
    peak = fp8_dense_peak_tflops(device);
  } else {
    timings = kind == "gemm" ? benchmark_gemms(args, t, device, dtype, o.timing)
                             : benchmark_attention(args, t, device, dtype, o.timing);
    peak = dense_peak_tflops(device, dtype);
  }
  fmt::print("{} of {} on {} (median of {} runs after {} warm-up){}\n{}", kind, o.config_path, device.str(),
             o.timing.iters, o.timing.warmup, peak ? fmt::format("; peak {} TFLOP/s dense", *peak) : "",
             format_kernel_timings(timings, peak));
  for (const KernelTiming& timing : timings) jsonl << kernel_timing_json(timing, peak).dump() << "\n";
  std::fflush(stdout);
  if (jsonl && !(jsonl.flush())) throw RuntimeError(fmt::format("--jsonl {}: the write failed", o.jsonl));
  return static_cast<int>(kExitOk);
}

void add_kernel_benchmark_command(CLI::App& benchmark, const LaunchOptions& launch, Action& action,
                                  const std::string& kind, const std::string& description, const std::string& footer) {
  CLI::App* command = benchmark.add_subcommand(kind, description);
  auto o = std::make_shared<KernelCommandOptions>();
  command->add_option("--config", o->config_path, "Experiment YAML file")->required()->type_name("FILE");
  command->add_option("--warmup", o->timing.warmup, "Untimed runs first (default 3)")->check(CLI::NonNegativeNumber);
  command->add_option("--iters", o->timing.iters, "Timed runs; the median is reported (default 10)")
      ->check(CLI::PositiveNumber);
  command->add_option("--jsonl", o->jsonl, "Also write one JSON object per timing to FILE")->type_name("FILE");
  if (kind == "gemm") {
    command
        ->add_option("--fp8", o->fp8,
                     "Time the fp8 GEMMs of the linear modules instead, with RECIPE's scaling: tensorwise or blockwise "
                     "(GPU only)")
        ->type_name("RECIPE")
        ->check(CLI::IsMember({"tensorwise", "blockwise"}));
  }
  command->allow_extras();
  command->footer(footer);
  command->final_callback([&launch, &action, command, o, kind] {
    action = [&launch, command, o, kind] {
      const std::vector<std::string> overrides = normalize_overrides(command->remaining());
      if (launch.dry_run) {
        LoadedConfig loaded = load_experiment_config(o->config_path, overrides);
        print_dry_run(launch, o->config_path, overrides, &loaded);
        return static_cast<int>(kExitOk);
      }
      return run_kernel_benchmark(kind, *o, overrides);
    };
  });
}

}  // namespace

void add_benchmark_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* benchmark = root.add_subcommand(
      "benchmark", "Micro-benchmarks: train (the whole step), gemm, attention, comm, checkpoint");
  benchmark->require_subcommand(1);
  CLI::App* train = benchmark->add_subcommand(
      "train", "Time warm-up plus N training steps of a config on random tokens; prints a table and a JSON line");
  auto config_path = std::make_shared<std::string>();
  auto options = std::make_shared<BenchmarkOptions>();
  train->add_option("--config", *config_path, "Experiment YAML file")->required()->type_name("FILE");
  train->add_option("--warmup", options->warmup_steps, "Untimed steps first (default 3)")->check(CLI::NonNegativeNumber);
  train->add_option("--steps", options->timed_steps, "Timed steps (default 10)")->check(CLI::PositiveNumber);
  train->add_option("--trace", options->trace_path,
                    "After the timed steps, record one more step into a Perfetto trace at FILE (host and device "
                    "tracks of phases, layers and ops; tools/trace_summary.py sums it)")
      ->type_name("FILE");
  train->allow_extras();
  train->footer(
      "Overrides: KEY=VALUE as for 'train pretrain' (e.g. micro_batch_size=8). data_path is ignored: the\n"
      "benchmark draws random tokens. FLOPs per token = 6 x matmul parameters (output layer included) +\n"
      "12 x layers x seq x heads x head_dim; MFU is against 989 TFLOP/s (H100/H200 dense bf16). The memory\n"
      "estimate is logged first; out of device memory exits 3 with it and what to try. Progress bars go to\n"
      "stderr on a terminal (else a line every 5 s; PRIMUS_PROGRESS=0: none).\n\n"
      "Examples:\n  primus-cli -- benchmark train --config configs/examples/default_cpu.yaml --steps 5");
  train->final_callback([&launch, &action, train, config_path, options] {
    action = [&launch, train, config_path, options] {
      std::vector<std::string> overrides = normalize_overrides(train->remaining());
      LoadedConfig loaded = load_experiment_config(*config_path, overrides);
      if (launch.dry_run) {
        print_dry_run(launch, *config_path, overrides, &loaded);
        return static_cast<int>(kExitOk);
      }
      options->progress = ProgressOutput::standard_error();
      fmt::print("{}", format_benchmark(loaded.config, run_benchmark_train(loaded.config, *options)));
      std::fflush(stdout);
      return static_cast<int>(kExitOk);
    };
  });
  add_benchmark_comm_command(
      *benchmark, launch, action, "comm",
      "Collective bandwidth (all_reduce, reduce_scatter, all_gather, all_to_all, send/recv) over all ranks");
  add_benchmark_comm_command(*benchmark, launch, action, "nccl", "The same as comm (nccl-tests' name for it)");
  add_benchmark_checkpoint_command(*benchmark, launch, action);
  add_kernel_benchmark_command(
      *benchmark, launch, action, "gemm",
      "Every GEMM of one rank of a config (q/k/v/o, gate_up, down, experts, router, output layer), 3 passes each",
      "Overrides: KEY=VALUE as for 'train pretrain'. Each linear module of a layer at the shapes one rank runs\n"
      "(tokens = micro_batch_size x seq_length / context_parallel_size; tensor parallelism divides the column-\n"
      "parallel outputs and the row-parallel inputs), in its three GEMMs: forward y = x w^T, data gradient\n"
      "dx = dy w, weight gradient dw += dy^T x; the output layer as one logits chunk of the loss; a MoE layer's\n"
      "experts as grouped GEMMs at an even routing. On the config's device in its dtype (bf16 with bf16: true);\n"
      "TFLOP/s from 2 M N K, % of the dense peak on an H100/H200.\n"
      "--fp8 tensorwise|blockwise: the fp8 GEMMs (cuBLASLt, device-side scales) of the same linear modules instead:\n"
      "forward from the x and W codes (bf16 out), data gradient from dy and W^T's codes (bf16 out), weight gradient\n"
      "from dy^T's and x^T's codes (f32, accumulating); tensorwise: e4m3 operands and e5m2 gradients (hybrid), one\n"
      "scale each; blockwise: e4m3, 1x128 tiles of x and dy, 128x128 blocks of W. Only the GEMM is timed. % of the\n"
      "dense fp8 peak (1979 TFLOP/s on an H100/H200). The experts and the output layer (bf16 in fp8 training) are\n"
      "left out. On the CPU it exits 2.\n\n"
      "Examples:\n  primus-cli -- benchmark gemm --config configs/H200/llama3.2_1B-bf16-pretrain.yaml --jsonl gemm.jsonl\n"
      "  primus-cli -- benchmark gemm --config configs/H200/llama3.2_3B-bf16-pretrain.yaml --fp8 blockwise");
  add_kernel_benchmark_command(
      *benchmark, launch, action, "attention",
      "Forward and backward of the attention kernel at a config's shapes (causal, GQA)",
      "Overrides: KEY=VALUE as for 'train pretrain'. q [micro_batch_size, seq_length / cp, heads / tp, head_dim],\n"
      "k and v with the key/value heads; cuDNN's fused attention on a GPU, the reference kernel on the CPU.\n"
      "FLOPs with the causal half: forward 2 B T^2 H D, backward 2.5 x that.\n\n"
      "Examples:\n  primus-cli -- benchmark attention --config configs/H200/llama3.2_3B-bf16-pretrain.yaml");
}

}  // namespace primus::cli
