#include "train/step_projection.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "core/error.h"
#include "models/gemm_shapes.h"
#include "models/model.h"
#include "parallel/parallel_dims.h"
#include "train/benchmark.h"
#include "train/train_step.h"

namespace primus {

namespace {

// A ring step's latency inside a node and across nodes (NCCL's small-message figures are a few microseconds over
// NVLink and ~10-20 over InfiniBand): assumed, not measured here.
constexpr double kLinkLatencyUs = 5.0;
constexpr double kNicLatencyUs = 15.0;
// The share of the NIC's line rate a collective's bus bandwidth reaches across nodes (assumed).
constexpr double kNicEfficiency = 0.9;
// AdamW's bytes per element of the optimizer's shard (read master, gradient, both moments; write master and moments)
// and per element of the rank's parameters (write the compute copy, zero the gradient, read it for the norm).
constexpr double kAdamShardBytes = 28.0;
constexpr double kAdamRankBytes = 10.0;

// Where a group of ranks lies: `span` consecutive rank numbers hold it (Megatron's order: tp fastest, cp, dp, pp).
struct Link {
  double gbytes_per_s = 0.0;
  double latency_us = 0.0;
  bool crosses_nodes = false;
};

Link link_for_span(int64_t span, const GpuModel& gpu, const ClusterShape& cluster) {
  if (span <= cluster.gpus_per_node) return {gpu.link_gbytes_per_s, kLinkLatencyUs, false};
  const double nic = cluster.nic_gbit_per_s / 8.0 * kNicEfficiency;
  return {std::min(gpu.link_gbytes_per_s, nic), kNicLatencyUs, true};
}

// A ring collective over `ranks` moving `traffic` bytes in and out of each rank in `steps` steps.
double ring_ms(double traffic, int64_t steps, const Link& link) {
  return traffic / (link.gbytes_per_s * 1e9) * 1e3 + static_cast<double>(steps) * link.latency_us * 1e-3;
}
// S bytes all-reduced, reduce-scattered (S the whole buffer), all-gathered (S the whole result) or exchanged
// all-to-all (S what each rank sends in all) over n ranks.
double all_reduce_ms(double bytes, int64_t n, const Link& link) {
  return n <= 1 ? 0.0 : ring_ms(2.0 * (n - 1) / n * bytes, 2 * (n - 1), link);
}
double reduce_scatter_ms(double bytes, int64_t n, const Link& link) {
  return n <= 1 ? 0.0 : ring_ms(static_cast<double>(n - 1) / n * bytes, n - 1, link);
}
double all_to_all_ms(double bytes, int64_t n, const Link& link) { return reduce_scatter_ms(bytes, n, link); }

// Flash attention runs smaller heads at a lower share of the peak: the engine measured 393 TFLOP/s at head dim 64
// against 456 at 128 on the H200 (docs/perf/attention.md); linear between, flat above 128.
double attention_rate(const GpuModel& gpu, int64_t head_dim) {
  const double share_at_64 = 393.0 / 456.0;
  const double d = std::clamp(static_cast<double>(head_dim), 64.0, 128.0);
  return gpu.attention_tflops * (share_at_64 + (1.0 - share_at_64) * (d - 64.0) / 64.0);
}

std::string tflop(double flops) { return fmt::format("{:.1f} TFLOP", flops / 1e12); }
std::string gbytes(double bytes) {
  return bytes < 1e9 ? fmt::format("{:.1f} MB", bytes / 1e6) : fmt::format("{:.1f} GB", bytes / 1e9);
}

// The compute of one micro-batch on one rank of a stage, and how each part was costed.
struct MicroBatchCost {
  double gemm_ms = 0.0, gemm_flops = 0.0;
  double grouped_ms = 0.0, grouped_flops = 0.0;  // the experts' grouped GEMMs (MoE layers), apart from the rest
  double attention_ms = 0.0, attention_flops = 0.0;
  double memory_ms = 0.0, memory_bytes = 0.0;
  double forward_ms = 0.0;  // of the above, the forward's (what overlaps the next step's weight gathering)
  double tp_ms = 0.0, ep_ms = 0.0, cp_ms = 0.0, cp_exposed_ms = 0.0;
  std::set<std::string> measured_gemms, table_gemms;  // "op pass" of the GEMMs costed each way
  bool measured_attention = false;
  double total_ms() const { return gemm_ms + grouped_ms + attention_ms + memory_ms + tp_ms + ep_ms + cp_exposed_ms; }
};

class StageCoster {
 public:
  StageCoster(const ModelArgs& whole, const TrainingArgs& t, const ParallelDims& dims, const GpuModel& gpu,
              const ClusterShape& cluster, const MeasuredRates* measured)
      : whole_(whole),
        rank_(tensor_parallel_shapes(whole, dims.tp())),
        t_(t),
        dims_(dims),
        gpu_(gpu),
        cluster_(cluster),
        measured_(measured),
        recompute_(RecomputeConfig::from(t)),
        a_(t.bf16 ? 2.0 : 4.0),
        tokens_(t.micro_batch_size * t.seq_length / dims.cp()),
        qk_width_(whole.multi_latent_attention ? whole.qk_head_dim + whole.qk_pos_emb_head_dim : whole.kv_channels),
        v_width_(whole.multi_latent_attention ? whole.v_head_dim : whole.kv_channels) {}

  MicroBatchCost micro_batch(int stage) const {
    MicroBatchCost cost;
    for (int chunk = 0; chunk < dims_.vpp(); ++chunk) {
      const LayerRange range = dims_.layers(stage, chunk);
      for (int64_t i = range.begin; i < range.end; ++i) add_layer(i, cost);
    }
    if (stage == dims_.pp() - 1) {
      add_output_layer(cost);
      // Multi-token prediction modules (on the last stage): eh_proj and a layer of the last layer's kind, never
      // recomputed, the norms of the embedding and of the hidden state and the concatenation (a forward reads and
      // writes [N, C] twice and [N, 2C] once), and the shared output layer with its loss again.
      for (int64_t k = 0; k < whole_.mtp_num_layers; ++k) {
        add_block(mtp_gemms(rank_, dims_.ep()), whole_.is_mtp_moe_layer(), false, cost);
        add_memory_passes(3.0, a_ * 8.0 * static_cast<double>(rank_.hidden_size) * static_cast<double>(tokens_),
                          cost);
        add_output_layer(cost);
      }
    }
    return cost;
  }

 private:
  // The time of one pass of `g` over this micro-batch, at its measured rate if there is one, else the larger of
  // its FLOPs at the table's GEMM rate and its bytes at the HBM bandwidth.
  double gemm_pass_ms(const GemmShape& g, const char* pass, int64_t tokens, MicroBatchCost& cost) const {
    const double flops = g.pass_flops(tokens);
    (g.experts > 0 ? cost.grouped_flops : cost.gemm_flops) += flops;
    if (measured_ != nullptr) {
      if (const std::optional<double> rate = measured_->find(g.op, pass)) {
        cost.measured_gemms.insert(g.op + " " + pass);
        return flops / (*rate * 1e9);
      }
    }
    cost.table_gemms.insert(g.op + " " + pass);
    const double rows = static_cast<double>(tokens * g.rows_per_token);
    const double weights = static_cast<double>(std::max<int64_t>(1, g.experts)) * g.in * g.out;
    const double bytes = std::string_view(pass) == "weight_grad"
                             ? a_ * rows * (g.in + g.out) + 8.0 * weights  // fp32 gradient read and written
                             : a_ * (rows * (g.in + g.out) + weights);
    const double share = g.experts > 0 ? gpu_.grouped_gemm_efficiency : gpu_.gemm_efficiency;
    return std::max(flops / (gpu_.bf16_tflops * share * 1e9), bytes / (gpu_.hbm_gbytes_per_s * 1e6));
  }

  // A linear's forward, data and weight gradient; a recomputed layer runs its forward twice.
  void add_gemm(const GemmShape& g, int64_t tokens, bool recomputed, MicroBatchCost& cost) const {
    const double forward = gemm_pass_ms(g, "forward", tokens, cost);
    cost.forward_ms += forward;
    (g.experts > 0 ? cost.grouped_ms : cost.gemm_ms) += forward * (recomputed ? 2 : 1) +
                                                        gemm_pass_ms(g, "data_grad", tokens, cost) +
                                                        gemm_pass_ms(g, "weight_grad", tokens, cost);
    if (recomputed) (g.experts > 0 ? cost.grouped_flops : cost.gemm_flops) += g.pass_flops(tokens);
  }

  bool recomputed(int64_t layer) const {
    if (recompute_.granularity != RecomputeConfig::Granularity::kFull) return false;
    const auto [first, end] = recompute_.chunk(layer, whole_.num_layers);
    return first != end;
  }

  // A memory-bound forward of `forward_bytes` run `passes` times (forward, backward twice its work, a recompute).
  void add_memory_passes(double passes, double forward_bytes, MicroBatchCost& cost) const {
    cost.memory_bytes += passes * forward_bytes;
    cost.memory_ms += passes * forward_bytes / (gpu_.elementwise_gbytes_per_s * 1e6);
    cost.forward_ms += forward_bytes / (gpu_.elementwise_gbytes_per_s * 1e6);
  }

  void add_layer(int64_t i, MicroBatchCost& cost) const {
    const bool moe = whole_.is_moe_layer(i);
    add_block(layer_gemms(rank_, dims_.ep(), moe), moe, recomputed(i), cost);
  }

  // A transformer layer running `gemms` (a MoE layer when `moe`), recomputed in full when `again`.
  void add_block(const std::vector<GemmShape>& gemms, bool moe, bool again, MicroBatchCost& cost) const {
    const double passes = again ? 4.0 : 3.0;  // forward, backward (twice the forward's work), the recompute
    for (const GemmShape& g : gemms) add_gemm(g, tokens_, again, cost);

    // Attention: forward B·S²·Hq·(Dqk + Dv) / cp (QKᵀ and PV, the causal half; 2·B·S²·Hq·D when the widths are
    // equal), backward 2.5 × that.
    const double s = static_cast<double>(t_.seq_length);
    const double forward_flops = static_cast<double>(t_.micro_batch_size) * s * s *
                                 static_cast<double>(rank_.num_attention_heads * (qk_width_ + v_width_)) / dims_.cp();
    const std::optional<double> fwd_rate = measured_ ? measured_->find("attention", "forward") : std::nullopt;
    const std::optional<double> bwd_rate = measured_ ? measured_->find("attention", "backward") : std::nullopt;
    const double table_rate = attention_rate(gpu_, qk_width_);
    const double forward_ms = forward_flops / ((fwd_rate ? *fwd_rate : table_rate) * 1e9);
    const double backward_ms = 2.5 * forward_flops / ((bwd_rate ? *bwd_rate : table_rate) * 1e9);
    cost.measured_attention = fwd_rate && bwd_rate;
    const double attention_ms = forward_ms * (again ? 2 : 1) + backward_ms;
    cost.attention_ms += attention_ms;
    cost.attention_flops += forward_flops * (again ? 4.5 : 3.5);
    cost.forward_ms += forward_ms;

    // Memory-bound passes (see the header): a forward's worth of element traffic, times the passes.
    const double n = static_cast<double>(tokens_);
    const double c = static_cast<double>(rank_.hidden_size);
    const double norm_rows = dims_.sequence_parallel() ? n / dims_.tp() : n;
    // q and k (k per query head under MLA, whose keys are expanded from the latent) and v; RoPE and norms pass them.
    const double heads = rank_.multi_latent_attention
                             ? static_cast<double>(rank_.num_attention_heads * (2 * qk_width_ + v_width_)) / 2.0
                             : static_cast<double>((rank_.num_attention_heads + rank_.num_query_groups) *
                                                   rank_.kv_channels);
    double per_token = 2.0 * heads * (rank_.qk_layernorm ? 2.0 : 1.0);
    if (moe) {
      const double k = static_cast<double>(whole_.moe_router_topk);
      per_token += 3.0 * (k * whole_.moe_ffn_hidden_size + whole_.moe_shared_expert_intermediate_size) + 4.0 * k * c;
    } else {
      per_token += 3.0 * static_cast<double>(rank_.ffn_hidden_size);
    }
    if (recompute_.granularity == RecomputeConfig::Granularity::kSelective) {
      per_token += moe ? 0.0 : static_cast<double>(rank_.ffn_hidden_size);  // the SwiGLU product again
    }
    add_memory_passes(passes, a_ * (10.0 * c * norm_rows + per_token * n), cost);

    // Tensor parallelism: two all-reduces of [N, C] in forward, two in backward (a recompute repeats the forward's);
    // sequence parallelism's reduce-scatter + all-gather pairs move the same bytes.
    const double activation_bytes = a_ * n * c;
    const Link tp_link = link_for_span(dims_.tp(), gpu_, cluster_);
    cost.tp_ms += (again ? 6 : 4) * all_reduce_ms(activation_bytes, dims_.tp(), tp_link);

    // Expert parallelism: dispatch and combine of the routed rows, forward and backward.
    if (moe && dims_.ep() > 1) {
      const double routed = activation_bytes * static_cast<double>(whole_.moe_router_topk);
      const Link ep_link = link_for_span(int64_t{dims_.tp()} * dims_.ep(), gpu_, cluster_);
      cost.ep_ms += (again ? 6 : 4) * all_to_all_ms(routed, dims_.ep(), ep_link);
    }

    // Context parallelism: the ring passes K and V (forward) and K, V, dK, dV (backward) cp − 1 times; the transfers
    // overlap the attention blocks, so only their excess over the attention shows.
    if (dims_.cp() > 1) {
      const double kv = 2.0 * a_ * n * static_cast<double>(rank_.num_query_groups * rank_.kv_channels);
      const Link cp_link = link_for_span(int64_t{dims_.tp()} * dims_.cp(), gpu_, cluster_);
      const int64_t steps = dims_.cp() - 1;
      const double forward_ring = ring_ms(kv * steps, steps, cp_link);
      const double ring = forward_ring * (again ? 2 : 1) + 2.0 * forward_ring;
      cost.cp_ms += ring;
      cost.cp_exposed_ms += std::max(0.0, ring - attention_ms);
    }
  }

  void add_output_layer(MicroBatchCost& cost) const {
    add_gemm(output_gemm(rank_), tokens_, false, cost);
    // The loss reads each logits chunk once for the softmax and writes its gradient over it (models/llama.cpp).
    const double bytes = 3.0 * a_ * static_cast<double>(tokens_) * static_cast<double>(rank_.vocab_size);
    cost.memory_bytes += bytes;
    cost.memory_ms += bytes / (gpu_.elementwise_gbytes_per_s * 1e6);
  }

  const ModelArgs& whole_;
  const ModelArgs rank_;
  const TrainingArgs& t_;
  const ParallelDims& dims_;
  const GpuModel& gpu_;
  const ClusterShape& cluster_;
  const MeasuredRates* measured_;
  const RecomputeConfig recompute_;
  const double a_;
  const int64_t tokens_;
  const int64_t qk_width_, v_width_;  // a head's query/key and value features (they differ under MLA)
};

// The performance figures of a known GPU when `gpu` (the driver's name, say) matches one by name.
GpuModel with_performance(const GpuModel& gpu) {
  if (gpu.bf16_tflops > 0.0) return gpu;
  for (const GpuModel& known : known_gpus()) {
    if (gpu.name.find(known.name) != std::string::npos) {
      GpuModel out = known;
      out.memory_bytes = gpu.memory_bytes;
      out.source = gpu.source;
      return out;
    }
  }
  std::string names;
  for (const GpuModel& known : known_gpus()) names += (names.empty() ? "" : ", ") + known.name;
  throw UsageError(fmt::format("--gpu: no performance figures for {} (known: {}); name one with --gpu", gpu.name, names));
}

}  // namespace

std::optional<double> MeasuredRates::find(const std::string& op, const std::string& pass) const {
  for (const Rate& r : rates) {
    if (r.op == op && r.pass == pass) return r.tflops;
  }
  return std::nullopt;
}

MeasuredRates read_measured_rates(const std::vector<std::string>& paths) {
  MeasuredRates measured;
  for (const std::string& path : paths) {
    std::ifstream in(path);
    if (!in) throw UsageError(fmt::format("--rates {}: cannot read this file", path));
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const auto bad = [&](std::string_view why) {
        return UsageError(fmt::format("--rates {} line {}: {} (expected the JSON lines of `benchmark gemm|attention "
                                      "--jsonl`)", path, number, why));
      };
      if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
      for (const char* key : {"op", "pass", "tflops"}) {
        if (!j.contains(key)) throw bad(fmt::format("no \"{}\"", key));
      }
      if (!j["op"].is_string() || !j["pass"].is_string() || !j["tflops"].is_number() || j["tflops"].get<double>() <= 0) {
        throw bad("\"op\" and \"pass\" must be strings and \"tflops\" a positive number");
      }
      measured.rates.push_back({j["op"].get<std::string>(), j["pass"].get<std::string>(), j["tflops"].get<double>()});
    }
    measured.source += (measured.source.empty() ? "" : ", ") + path;
  }
  return measured;
}

PerformanceProjection project_performance(const ExperimentConfig& config, const GpuModel& named_gpu,
                                          const ClusterShape& cluster, const MeasuredRates* measured) {
  const GpuModel gpu = with_performance(named_gpu);
  const TrainingArgs& t = config.train;
  const ModelArgs args = with_vocab_size(config.model, t);
  const ParallelDims dims = parallel_dims_for(args, t, cluster.world());
  PerformanceProjection p;
  p.gpu = gpu;
  p.cluster = cluster;
  p.layout = dims.describe();
  p.model_parallel_ranks = int64_t{dims.tp()} * dims.pp() * dims.cp() * dims.ep();
  p.micro_batches = t.global_batch_size / (t.micro_batch_size * dims.dp());
  p.tokens_per_step = t.global_batch_size * t.seq_length;

  // The slowest stage sets the pace of the pipeline.
  const StageCoster coster(args, t, dims, gpu, cluster, measured);
  MicroBatchCost mb = coster.micro_batch(0);
  for (int s = 1; s < dims.pp(); ++s) {
    MicroBatchCost other = coster.micro_batch(s);
    if (other.total_ms() > mb.total_ms()) mb = other, p.slowest_stage = s;
  }
  const double m = static_cast<double>(p.micro_batches);
  auto add = [&p](std::string name, double ms, std::string how) {
    if (ms > 0.0) p.parts.push_back({std::move(name), ms, std::move(how)});
  };
  add("GEMMs", m * mb.gemm_ms,
      fmt::format("{} at {:.0f} TFLOP/s", tflop(m * mb.gemm_flops), mb.gemm_flops * m / (m * mb.gemm_ms * 1e9)));
  add("experts' grouped GEMMs", m * mb.grouped_ms,
      fmt::format("{} at {:.0f} TFLOP/s", tflop(m * mb.grouped_flops), mb.grouped_flops / (mb.grouped_ms * 1e9)));
  add("attention", m * mb.attention_ms,
      fmt::format("{} (causal) at {:.0f} TFLOP/s", tflop(m * mb.attention_flops),
                  mb.attention_flops / (mb.attention_ms * 1e9)));
  add("norms, RoPE, SwiGLU, adds, loss", m * mb.memory_ms,
      fmt::format("{} moved at {:.0f} GB/s", gbytes(m * mb.memory_bytes), gpu.elementwise_gbytes_per_s));
  add("tensor-parallel all-reduce", m * mb.tp_ms, fmt::format("4 of [N, C] a layer over tp {}", dims.tp()));
  add("expert-parallel all-to-all", m * mb.ep_ms, fmt::format("dispatch and combine over ep {}", dims.ep()));
  add("context-parallel ring (exposed)", m * mb.cp_exposed_ms,
      fmt::format("{:.1f} of {:.1f} ms not hidden by attention", m * mb.cp_exposed_ms, m * mb.cp_ms));
  const double per_micro_batch = mb.total_ms();
  if (dims.pp() > 1) {
    add("pipeline bubble", static_cast<double>(dims.pp() - 1) / dims.vpp() * per_micro_batch,
        fmt::format("(p - 1)/v = {}/{} micro-batches of {:.1f} ms", dims.pp() - 1, dims.vpp(), per_micro_batch));
    // Each micro-batch's activations forward and gradients backward, at every virtual stage's boundary.
    const double rows = static_cast<double>(t.micro_batch_size * t.seq_length / dims.cp()) /
                        (dims.sequence_parallel() ? dims.tp() : 1);
    const double bytes = (t.bf16 ? 2.0 : 4.0) * rows * static_cast<double>(args.hidden_size);
    const int64_t stride = int64_t{dims.tp()} * dims.cp() * dims.dp();
    const Link link = link_for_span(stride + 1, gpu, cluster);
    add("pipeline send/receive", 2.0 * m * dims.vpp() * ring_ms(bytes, 1, link),
        fmt::format("{} a micro-batch each way{}", gbytes(bytes), link.crosses_nodes ? " across nodes" : ""));
  }

  // Data-parallel gradient reduction (and the distributed optimizer's weight all-gather).
  const DType dtype = t.bf16 ? DType::kBF16 : DType::kF32;
  const MemoryPlan plan = plan_memory(args, t, Device{DeviceType::kCuda, 0}, dtype, p.slowest_stage);
  const int64_t grad_ranks = int64_t{dims.dp()} * dims.cp();
  if (grad_ranks > 1) {
    const Link link = link_for_span(int64_t{dims.tp()} * grad_ranks, gpu, cluster);
    const double grads = 4.0 * static_cast<double>(plan.parameters);
    const bool sharded = plan.sharded_optimizer || !plan.fully_sharded.empty();
    const double reduce = sharded ? reduce_scatter_ms(grads, grad_ranks, link) : all_reduce_ms(grads, grad_ranks, link);
    // Overlapped, the buckets reduce while backward goes on: what shows is the last bucket, or the reduction's excess
    // over the last micro-batch's backward.
    const double bucket_share = std::min(1.0, static_cast<double>(ddp_bucket_size(t)) / plan.parameters);
    const double backward = per_micro_batch - mb.forward_ms;
    const double reduce_shown =
        t.overlap_grad_reduce ? std::max(bucket_share * reduce, reduce - backward) : reduce;
    add(sharded ? "gradient reduce-scatter" : "gradient all-reduce", reduce_shown,
        fmt::format("{} fp32 over {} ranks{}: {:.1f} ms{}", gbytes(grads), grad_ranks,
                    link.crosses_nodes ? " across nodes" : "", reduce,
                    t.overlap_grad_reduce ? ", overlapped with backward" : ""));
    if (sharded) {
      const double weights = (t.bf16 ? 2.0 : 4.0) * static_cast<double>(plan.parameters);
      const double gather = reduce_scatter_ms(weights, grad_ranks, link);
      const double gather_shown =
          t.overlap_param_gather ? std::max(bucket_share * gather, gather - mb.forward_ms) : gather;
      add("weight all-gather", gather_shown,
          fmt::format("{} over {} ranks: {:.1f} ms{}", gbytes(weights), grad_ranks, gather,
                      t.overlap_param_gather ? ", overlapped with the next forward" : ""));
    }
  }
  const double shard = static_cast<double>(plan.optimizer_bytes) / 8.0;
  const double adam_bytes = kAdamShardBytes * shard + kAdamRankBytes * static_cast<double>(plan.parameters);
  add("optimizer (AdamW)", adam_bytes / (gpu.hbm_gbytes_per_s * 1e6),
      fmt::format("{} moved at {:.0f} GB/s", gbytes(adam_bytes), gpu.hbm_gbytes_per_s));

  for (const StepPart& part : p.parts) p.step_ms += part.ms;
  p.tokens_per_s_per_gpu = static_cast<double>(p.tokens_per_step) / (p.step_ms * 1e-3) / cluster.world();
  p.tflops_per_gpu = model_family(args).flops_per_token(args, t.seq_length) * p.tokens_per_s_per_gpu / 1e12;
  p.mfu = p.tflops_per_gpu / gpu.bf16_tflops;
  p.rates_source = gpu.rates_source;
  if (measured != nullptr) {
    p.rates_source = fmt::format("{} of {} GEMM passes and {} measured ({}); the rest from the table: {}",
                                 mb.measured_gemms.size(), mb.measured_gemms.size() + mb.table_gemms.size(),
                                 mb.measured_attention ? "attention" : "not attention", measured->source,
                                 gpu.rates_source);
  }
  return p;
}

std::string format_performance_projection(const PerformanceProjection& p) {
  std::string text = fmt::format("{} on {} node(s) x {} {} (NIC {:.0f} Gb/s per GPU)\n", p.layout, p.cluster.nnodes,
                                 p.cluster.gpus_per_node, p.gpu.name, p.cluster.nic_gbit_per_s);
  text += fmt::format("{} micro-batches per rank a step, {} tokens a step{}\n", p.micro_batches, p.tokens_per_step,
                      p.slowest_stage > 0 ? fmt::format("; pipeline stage {} is the slowest", p.slowest_stage) : "");
  text += fmt::format("  {:<34}{:>10}  {:>6}  {}\n", "part of the step", "ms", "share", "how");
  for (const StepPart& part : p.parts) {
    text += fmt::format("  {:<34}{:>10.1f}  {:>5.1f}%  {}\n", part.name, part.ms, 100.0 * part.ms / p.step_ms, part.how);
  }
  text += fmt::format("  {:<34}{:>10.1f}\n", "step", p.step_ms);
  text += fmt::format("tokens/s per GPU {:.0f}, {:.0f} TFLOP/s per GPU, MFU {:.3f} (of {:.0f} TFLOP/s bf16 dense)\n",
                      p.tokens_per_s_per_gpu, p.tflops_per_gpu, p.mfu, p.gpu.bf16_tflops);
  text += fmt::format("rates: {}\n", p.rates_source);
  return text;
}

nlohmann::json performance_projection_json(const PerformanceProjection& p) {
  nlohmann::json parts = nlohmann::json::array();
  for (const StepPart& part : p.parts) parts.push_back({{"name", part.name}, {"ms", part.ms}, {"how", part.how}});
  return {{"gpu", p.gpu.name},
          {"nnodes", p.cluster.nnodes},
          {"gpus_per_node", p.cluster.gpus_per_node},
          {"layout", p.layout},
          {"micro_batches", p.micro_batches},
          {"tokens_per_step", p.tokens_per_step},
          {"slowest_stage", p.slowest_stage},
          {"parts", parts},
          {"step_ms", p.step_ms},
          {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu},
          {"tflops_per_gpu", p.tflops_per_gpu},
          {"mfu", p.mfu},
          {"rates", p.rates_source}};
}

}  // namespace primus
