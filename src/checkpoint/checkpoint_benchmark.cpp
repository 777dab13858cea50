// The checkpoint benchmark (checkpoint_benchmark.h): a model-shaped checkpoint saved, dropped from the page cache
// and loaded back, timed phase by phase.
#include "checkpoint/checkpoint_benchmark.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/parallel_jobs.h"
#include "models/model.h"
#include "ops/ops.h"

namespace primus {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t parameter_count(const ModelArgs& args) {
  int64_t n = 0;
  for (const ParamSpec& spec : model_family(args).param_specs(args)) n += shape_numel(spec.shape);
  return n;
}

// A Llama shape of about `elements` parameters: the widest hidden size (heads of 64) that leaves room for at least
// four layers beside embeddings of 32 × hidden rows, then as many layers as fit.
ModelArgs shape_for(int64_t elements) {
  ModelArgs args;
  args.preset = "checkpoint-benchmark";
  args.untie_embeddings_and_output_weights = true;
  args.max_position_embeddings = 16;
  for (int64_t hidden : {4096, 2048, 1024, 512, 256, 128, 64}) {
    args.hidden_size = hidden;
    args.ffn_hidden_size = 4 * hidden;
    args.num_attention_heads = hidden / 64;
    args.num_query_groups = args.num_attention_heads;
    args.kv_channels = 64;
    args.vocab_size = 32 * hidden;
    args.num_layers = 1;
    const int64_t one = parameter_count(args);
    args.num_layers = 2;
    const int64_t layer = parameter_count(args) - one;
    const int64_t layers = (elements - (one - layer)) / layer;
    args.num_layers = std::max<int64_t>(1, layers);
    if (layers >= 4) break;
  }
  return args;
}

// CRC32C of a tensor's bytes on any device, through the host in 64 MiB pieces.
uint32_t fingerprint(const Tensor& t, uint32_t crc) {
  if (t.device().is_cpu()) return crc32c(t.data(), t.nbytes(), crc);
  constexpr int64_t kPiece = int64_t{16} << 20;
  const Tensor flat = t.reshape({t.numel()});
  for (int64_t at = 0; at < flat.numel(); at += kPiece) {
    const int64_t n = std::min(kPiece, flat.numel() - at);
    Tensor host = Tensor::empty({n}, flat.dtype());
    ops::copy(host, flat.slice_elements(at, {n}));
    crc = crc32c(host.data(), host.nbytes(), crc);
  }
  return crc;
}

std::vector<Tensor> saved_tensors(const Model& model, const AdamW& optimizer) {
  std::vector<Tensor> tensors = {model.params().flat_params()};
  for (size_t r = 0; r < optimizer.owned().size(); ++r) {
    tensors.push_back(optimizer.exp_avg(r));
    tensors.push_back(optimizer.exp_avg_sq(r));
  }
  return tensors;
}

uint32_t state_fingerprint(const Model& model, const AdamW& optimizer) {
  uint32_t crc = 0;
  for (const Tensor& t : saved_tensors(model, optimizer)) crc = fingerprint(t, crc);
  return crc;
}

void zero_state(const Model& model, const AdamW& optimizer) {
  for (Tensor t : saved_tensors(model, optimizer)) ops::zero(t);
  ops::synchronize(model.device());
}

// Loads the checkpoint into the zeroed model and optimizer, timing verification and reading apart, and checks
// that the saved bytes came back.
CheckpointLoadTime timed_load(const std::string& dir, Model& model, AdamW& optimizer, const CheckpointIo& io,
                              uint32_t expected, const char* which) {
  zero_state(model, optimizer);
  const Clock::time_point start = Clock::now();
  Clock::time_point reading = start;
  bool read_started = false;
  load_checkpoint(
      dir, model, optimizer,
      [&](const CheckpointProgress& p) {
        if (!read_started && std::string_view(p.phase) == "load") {
          reading = Clock::now();
          read_started = true;
        }
      },
      io);
  ops::synchronize(model.device());
  const Clock::time_point end = Clock::now();
  const uint32_t got = state_fingerprint(model, optimizer);
  if (got != expected) {
    throw RuntimeError(fmt::format("[benchmark checkpoint] the {} load of {} gave back other bytes than were saved "
                                   "(CRC32C {:#010x}, saved {:#010x})",
                                   which, dir, got, expected));
  }
  return {std::chrono::duration<double>(reading - start).count(), std::chrono::duration<double>(end - reading).count()};
}

// Asks the kernel to drop every file of `dir` from the page cache; returns the fraction of their pages still
// resident afterwards (mincore), which says whether a following load reads the disk.
double drop_from_page_cache(const std::string& dir) {
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t pages = 0;
  uint64_t resident = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string path = entry.path().string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw RuntimeError(fmt::format("[benchmark checkpoint] cannot open {}", path));
    const auto size = static_cast<size_t>(entry.file_size());
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (size > 0) {
      void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        std::vector<unsigned char> in_core((size + static_cast<size_t>(page) - 1) / static_cast<size_t>(page));
        if (::mincore(map, size, in_core.data()) == 0) {
          pages += in_core.size();
          for (unsigned char c : in_core) resident += c & 1u;
        }
        ::munmap(map, size);
      }
    }
    ::close(fd);
  }
  return pages == 0 ? 1.0 : static_cast<double>(resident) / static_cast<double>(pages);
}

double gb_per_s(int64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0; }

}  // namespace

CheckpointBenchmarkResult run_checkpoint_benchmark(const CheckpointBenchmarkOptions& o) {
  if (!(o.size_gb > 0) || o.size_gb > 1e4) {
    throw UsageError(fmt::format("--size-gb must be in (0, 10000], got {}", o.size_gb));
  }
  if (o.threads < 0 || o.threads > 256) throw UsageError(fmt::format("--threads must be in [0, 256], got {}", o.threads));
  if (o.dir.empty()) throw UsageError("--dir must name a folder to write the checkpoint into");
  std::error_code error;
  fs::create_directories(o.dir, error);
  if (error || !fs::is_directory(o.dir)) {
    throw UsageError(fmt::format("--dir {}: not a folder that can be created or written", o.dir));
  }

  const ModelArgs args = shape_for(static_cast<int64_t>(o.size_gb * 1e9 / 12));
  std::unique_ptr<Model> model = make_model(args, args.max_position_embeddings, o.device);
  AdamW optimizer(model->params(), AdamWConfig{});
  // Random weights and moments, so that a load that misplaced or skipped bytes cannot match.
  uint64_t seed = 1234;
  for (Tensor t : saved_tensors(*model, optimizer)) ops::fill_normal(t, seed++, 1.0);
  ops::synchronize(model->device());
  const uint32_t saved = state_fingerprint(*model, optimizer);

  CheckpointBenchmarkResult r;
  r.device = o.device.str();
  r.shape = fmt::format("hidden {}, {} layers, ffn {}, vocab {}", args.hidden_size, args.num_layers,
                        args.ffn_hidden_size, args.vocab_size);
  r.parameters = model->params().numel();
  r.threads = o.threads > 0 ? o.threads : default_io_threads();
  r.crc32c = crc32c_hardware_available() ? "sse4.2" : "software";
  const CheckpointIo io{r.threads};

  const std::string save_dir = fmt::format("{}/checkpoint-benchmark-{}", o.dir, ::getpid());
  const TrainerState state{.iteration = 1, .consumed_train_samples = 0, .optimizer_steps = 1, .seed = 1, .fp8_scaling = {}};
  try {
    const Clock::time_point start = Clock::now();
    r.bytes = save_checkpoint(save_dir, *model, optimizer, state, "# benchmark checkpoint\n", {}, io);
    r.save_s = seconds_since(start);
    const std::string checkpoint = save_dir + "/" + checkpoint_dir_name(state.iteration);
    r.warm = timed_load(checkpoint, *model, optimizer, io, saved, "warm");
    r.resident_after_drop = drop_from_page_cache(checkpoint);
    // A drop the kernel mostly ignored would time the page cache again: no cold number then.
    r.cold_measured = r.resident_after_drop < 0.05;
    if (r.cold_measured) r.cold = timed_load(checkpoint, *model, optimizer, io, saved, "cold");
  } catch (...) {
    if (!o.keep) fs::remove_all(save_dir, error);
    throw;
  }
  if (o.keep) {
    r.kept_dir = save_dir;
  } else {
    fs::remove_all(save_dir, error);
  }
  return r;
}

std::string format_checkpoint_benchmark(const CheckpointBenchmarkResult& r) {
  auto load_line = [&](const char* name, const CheckpointLoadTime& t) {
    return fmt::format("  {:<18}{:9.2f} s {:8.2f} GB/s   (verify {:.2f} s at {:.2f} GB/s, read {:.2f} s at {:.2f} GB/s)\n",
                       name, t.total_s(), gb_per_s(r.bytes, t.total_s()), t.verify_s, gb_per_s(r.bytes, t.verify_s),
                       t.read_s, gb_per_s(r.bytes, t.read_s));
  };
  std::string text = fmt::format(
      "benchmark checkpoint: {:.2f} GB ({} parameters; {}) on {}, {} I/O threads, CRC32C {}\n", r.bytes / 1e9,
      r.parameters, r.shape, r.device, r.threads, r.crc32c);
  text += fmt::format("  {:<18}{:9.2f} s {:8.2f} GB/s   (write, fsync, rename)\n", "save", r.save_s,
                      gb_per_s(r.bytes, r.save_s));
  text += load_line("load (warm)", r.warm);
  if (r.cold_measured) {
    text += load_line("load (cold)", r.cold);
  } else {
    text += fmt::format("  {:<18}not measured\n", "load (cold)");
  }
  text += fmt::format("  page cache: posix_fadvise(DONTNEED) left {:.1f}% of the files' pages resident{}\n",
                      100 * r.resident_after_drop,
                      r.cold_measured ? "" : " (too many: a load would read memory, not the disk)");
  text += "  round trip: both loads gave back the saved weights and moments (CRC32C)\n";
  if (!r.kept_dir.empty()) text += fmt::format("  kept: {}\n", r.kept_dir);
  return text;
}

std::string checkpoint_benchmark_json(const CheckpointBenchmarkResult& r) {
  auto load = [&](const CheckpointLoadTime& t) {
    return nlohmann::json{{"s", t.total_s()},
                          {"gb_per_s", gb_per_s(r.bytes, t.total_s())},
                          {"verify_s", t.verify_s},
                          {"read_s", t.read_s}};
  };
  nlohmann::json j = {{"device", r.device},
                      {"shape", r.shape},
                      {"parameters", r.parameters},
                      {"bytes", r.bytes},
                      {"threads", r.threads},
                      {"crc32c", r.crc32c},
                      {"save_s", r.save_s},
                      {"save_gb_per_s", gb_per_s(r.bytes, r.save_s)},
                      {"load_warm", load(r.warm)},
                      {"load_cold", r.cold_measured ? load(r.cold) : nlohmann::json(nullptr)},
                      {"resident_after_drop", r.resident_after_drop},
                      {"round_trip", true}};
  if (!r.kept_dir.empty()) j["kept_dir"] = r.kept_dir;
  return j.dump() + "\n";
}

}  // namespace primus
