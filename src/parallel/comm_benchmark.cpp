// The collective bandwidth sweep of comm_benchmark.h: sizes, buffers, timing with the slowest rank's time,
// nccl-tests' bus-bandwidth factors, and the table and JSON lines rank 0 prints.
#include "parallel/comm_benchmark.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace primus {

namespace {

using Clock = std::chrono::steady_clock;

std::string squeezed(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c != '_' && c != '-') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

// nccl-tests' factor from algorithm bandwidth to bus bandwidth: the fraction of the data every link carries.
double bus_factor(const std::string& op, int n) {
  if (n <= 1) return op == "send_recv" ? 1.0 : 0.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "send_recv") return 1.0;
  return static_cast<double>(n - 1) / n;  // reduce_scatter, all_gather, all_to_all
}

bool splits_into_blocks(const std::string& op) {
  return op == "reduce_scatter" || op == "all_gather" || op == "all_to_all";
}

int64_t elements_for(const std::string& op, int64_t bytes, int n) {
  int64_t elements = std::max<int64_t>(1, bytes / static_cast<int64_t>(sizeof(float)));
  if (splits_into_blocks(op)) elements = std::max<int64_t>(n, elements / n * n);
  return elements;
}

std::vector<int64_t> sizes(const CommBenchmarkOptions& options) {
  std::vector<int64_t> out;
  for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    out.push_back(bytes);
    const double next = std::round(static_cast<double>(bytes) * options.step_factor);
    bytes = std::max(bytes + 1, static_cast<int64_t>(std::min(next, 9.0e18)));
  }
  return out;
}

// The largest value of `v` over the ranks (a collective; the tensor lives where the communicator works).
int64_t max_over_ranks(Communicator& comm, int64_t v) {
  Tensor host = Tensor::empty({1}, DType::kI64);
  *static_cast<int64_t*>(host.data()) = v;
  if (comm.device().is_cpu()) {
    comm.all_reduce(host, ReduceOp::kMax);
    return *static_cast<int64_t*>(host.data());
  }
  Tensor device = ops::to_device(host, comm.device());
  comm.all_reduce(device, ReduceOp::kMax);
  Tensor back = ops::to_device(device, kCpuDevice);
  return *static_cast<int64_t*>(back.data());
}

// The buffers of one op, allocated once at the largest size; each size uses views of their first elements.
struct Buffers {
  Tensor a;  // the input (all_reduce's buffer, send_recv's message)
  Tensor b;  // the output where there is one
};

Buffers allocate(const std::string& op, int64_t max_elements, int n, Device device) {
  auto make = [&](int64_t elements) { return ops::zeros({elements}, DType::kF32, device); };
  Buffers buffers;
  if (op == "all_reduce" || op == "send_recv") {
    buffers.a = make(max_elements);
  } else if (op == "reduce_scatter") {
    buffers.a = make(max_elements);
    buffers.b = make(max_elements / n);
  } else if (op == "all_gather") {
    buffers.a = make(max_elements / n);
    buffers.b = make(max_elements);
  } else {  // all_to_all
    buffers.a = make(max_elements);
    buffers.b = make(max_elements);
  }
  return buffers;
}

// One iteration of `op` over `elements` (the nccl-tests size; see the header).
void step(Communicator& comm, const std::string& op, Buffers& buffers, int64_t elements) {
  const int n = comm.size();
  if (op == "all_reduce") {
    Tensor buf = buffers.a.slice_elements(0, {elements});
    comm.all_reduce(buf, ReduceOp::kSum);
  } else if (op == "reduce_scatter") {
    Tensor out = buffers.b.slice_elements(0, {elements / n});
    comm.reduce_scatter(buffers.a.slice_elements(0, {elements}), out, ReduceOp::kSum);
  } else if (op == "all_gather") {
    Tensor out = buffers.b.slice_elements(0, {elements});
    comm.all_gather(buffers.a.slice_elements(0, {elements / n}), out);
  } else if (op == "all_to_all") {
    Tensor out = buffers.b.slice_elements(0, {elements});
    comm.all_to_all(buffers.a.slice_elements(0, {elements}), out);
  } else {  // send_recv: pairs (0,1), (2,3), ...; a last rank without a partner idles
    const int partner = comm.rank() ^ 1;
    if (partner >= n) return;
    Tensor msg = buffers.a.slice_elements(0, {elements});
    if (comm.rank() % 2 == 0) {
      comm.send(msg, partner);
    } else {
      comm.recv(msg, partner);
    }
  }
}

std::string format_bytes(int64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:g} {}", std::round(v * 100.0) / 100.0, units[u]);
}

}  // namespace

const std::vector<std::string>& comm_benchmark_ops() {
  static const std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"};
  return ops;
}

int64_t parse_byte_size(const std::string& text, const std::string& option) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = squeezed(text.substr(digits));
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  int shift = -1;
  if (unit.empty() || unit == "b") shift = 0;
  if (unit == "k" || unit == "kb" || unit == "kib") shift = 10;
  if (unit == "m" || unit == "mb" || unit == "mib") shift = 20;
  if (unit == "g" || unit == "gb" || unit == "gib") shift = 30;
  if (digits == 0 || digits > 12 || shift < 0) {
    throw UsageError(fmt::format("{}: '{}' is not a size in bytes (examples: 1024, 4K, 1MiB, 1G)", option, text));
  }
  return std::stoll(text.substr(0, digits)) << shift;
}

void validate_comm_benchmark_options(CommBenchmarkOptions& options) {
  if (options.min_bytes < 1)
    throw UsageError(fmt::format("--min-bytes must be at least 1 (got {})", options.min_bytes));
  if (options.max_bytes < options.min_bytes) {
    throw UsageError(fmt::format("--max-bytes {} is below --min-bytes {}", options.max_bytes, options.min_bytes));
  }
  if (!(options.step_factor > 1.0)) {
    throw UsageError(fmt::format("--step-factor must be above 1 (got {})", options.step_factor));
  }
  if (options.iters < 1) throw UsageError(fmt::format("--iters must be at least 1 (got {})", options.iters));
  if (options.warmup < 0) throw UsageError(fmt::format("--warmup must not be negative (got {})", options.warmup));
  if (options.ops.empty()) throw UsageError("--ops names no collective");
  for (std::string& op : options.ops) {
    auto known = std::find_if(comm_benchmark_ops().begin(), comm_benchmark_ops().end(),
                              [&](const std::string& name) { return squeezed(name) == squeezed(op); });
    if (known == comm_benchmark_ops().end()) {
      throw UsageError(
          fmt::format("--ops: unknown collective '{}' (known: {})", op, fmt::join(comm_benchmark_ops(), ", ")));
    }
    op = *known;
  }
}

Device select_comm_device(const std::string& choice, int local_rank) {
  if (choice != "cpu" && choice != "cuda" && choice != "auto") {
    throw UsageError(fmt::format("--device must be cpu, cuda or auto (got '{}')", choice));
  }
  if (choice == "cpu") return kCpuDevice;
#if PRIMUS_WITH_CUDA
  std::string why;
  const int count = cuda_device_count(&why);
  if (count > 0) {
    if (local_rank >= count) {
      throw UsageError(
          fmt::format("LOCAL_RANK {} needs GPU {}, but only {} are visible; start at "
                      "most {} processes per node",
                      local_rank, local_rank, count, count));
    }
    start_cuda_backend(local_rank);
    return Device{DeviceType::kCuda, local_rank};
  }
  if (choice == "cuda") throw UsageError(fmt::format("--device cuda, but no CUDA device is usable: {}", why));
  spdlog::info("--device auto: no usable CUDA device ({}), so the CPU (Gloo)", why);
#else
  if (choice == "cuda") throw UsageError("--device cuda, but this primus-cli was built without CUDA");
#endif
  return kCpuDevice;
}

std::vector<CommBenchmarkRow> run_comm_benchmark(Communicator& comm, const CommBenchmarkOptions& options,
                                                 const std::function<void(const CommBenchmarkRow&)>& on_row) {
  const int n = comm.size();
  const Device device = comm.device();
  const std::vector<int64_t> byte_sizes = sizes(options);
  std::vector<CommBenchmarkRow> rows;
  for (const std::string& op : options.ops) {
    if (op == "send_recv" && n < 2) {
      if (comm.rank() == 0) spdlog::info("benchmark comm: send_recv needs two ranks; skipped in a world of one");
      continue;
    }
    Buffers buffers = allocate(op, elements_for(op, byte_sizes.back(), n), n, device);
    for (int64_t bytes : byte_sizes) {
      const int64_t elements = elements_for(op, bytes, n);
      for (int i = 0; i < options.warmup; ++i) step(comm, op, buffers, elements);
      ops::synchronize(device);
      comm.barrier();  // every rank starts the timed loop together
      const auto start = Clock::now();
      for (int i = 0; i < options.iters; ++i) step(comm, op, buffers, elements);
      ops::synchronize(device);
      const int64_t elapsed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      CommBenchmarkRow row;
      row.op = op;
      row.elements = elements;
      row.bytes = elements * static_cast<int64_t>(sizeof(float));
      row.time_us = static_cast<double>(max_over_ranks(comm, elapsed_ns)) / 1e3 / options.iters;
      row.algbw_gbps = row.time_us > 0 ? static_cast<double>(row.bytes) / (row.time_us * 1e3) : 0.0;
      row.busbw_gbps = row.algbw_gbps * bus_factor(op, n);
      rows.push_back(row);
      if (on_row) on_row(row);
    }
  }
  return rows;
}

std::string comm_benchmark_title(const Communicator& comm, const CommBenchmarkOptions& options) {
  return fmt::format(
      "benchmark comm: {} on {}, {} rank{}, f32, {} warm-up + {} timed iterations a size; times "
      "are the slowest rank's mean, GB/s = 1e9 B/s",
      comm.backend_name(), comm.device().str(), comm.size(), comm.size() == 1 ? "" : "s", options.warmup,
      options.iters);
}

std::string comm_benchmark_header() {
  return fmt::format("{:<15} {:>12} {:>10} {:>11} {:>12} {:>12} {:>12}", "op", "bytes", "size", "elements", "time_us",
                     "algbw_GB/s", "busbw_GB/s");
}

std::string comm_benchmark_table_row(const CommBenchmarkRow& row) {
  return fmt::format("{:<15} {:>12} {:>10} {:>11} {:>12.2f} {:>12.3f} {:>12.3f}", row.op, row.bytes,
                     format_bytes(row.bytes), row.elements, row.time_us, row.algbw_gbps, row.busbw_gbps);
}

std::string comm_benchmark_json(const Communicator& comm, const CommBenchmarkOptions& options,
                                const CommBenchmarkRow& row) {
  return fmt::format(
      "{{\"op\":\"{}\",\"backend\":\"{}\",\"device\":\"{}\",\"world_size\":{},\"dtype\":\"f32\",\"bytes\":{},"
      "\"elements\":{},\"warmup\":{},\"iters\":{},\"time_us\":{:.6g},\"algbw_gbps\":{:.6g},\"busbw_gbps\":{:.6g}}}",
      row.op, comm.backend_name(), comm.device().str(), comm.size(), row.bytes, row.elements, options.warmup,
      options.iters, row.time_us, row.algbw_gbps, row.busbw_gbps);
}

}  // namespace primus
