// `primus-cli projection performance`: a training step's time, tokens/s per GPU and MFU for a config at a scale,
// before the job exists, from per-op costs and a model of the interconnect.
//
// One rank of the slowest pipeline stage, per micro-batch (N = micro_batch_size × seq_length / cp tokens, a = bytes
// of an activation element, the rank's shapes under tp as tensor_parallel_shapes gives them):
//   GEMMs        every GEMM of models/gemm_shapes.h in its three passes (a fourth, forward, for a layer recomputed
//                in full), each at the larger of FLOPs / (peak × gemm efficiency) and its bytes / HBM bandwidth;
//                or at the TFLOP/s `benchmark gemm` measured for that op and pass (--rates)
//   attention    causal flash attention: forward B·S²·Hq·(Dqk + Dv) / cp FLOPs (= 2·B·S²·Hq·D unless MLA's widths
//                differ; S the whole sequence: a cp rank's two
//                chunks hold 1/cp of the causal work), backward 2.5 × that, at the attention rate (or measured)
//   memory-bound the engine's passes over activations outside GEMMs and attention (RMSNorm, RoPE, SwiGLU, residual
//                adds, MoE permutation, the loss over the logits), each tensor read or written once per pass, at the
//                bandwidth such kernels reach in a step (GpuModel::elementwise_gbytes_per_s): per layer and token a·(10·C + 2·(Hq + Hkv)·D + 3·F) in forward and twice that in
//                backward (C/tp for the norms' rows under sequence parallelism; a MoE layer's F is top-k × the
//                expert width plus the shared expert's, and its permutation moves 4·top-k·C); the loss 3·a·V/tp
//   tp / ep / cp the collectives inside a micro-batch: 4 all-reduces (or reduce-scatter + all-gather pairs) of
//                [N, C] per layer for tp, 4 all-to-alls of the routed rows per MoE layer for ep, and cp's ring
//                passes of K and V (forward) and of K, V, dK, dV (backward), which overlap attention: only the
//                excess shows
//   multi-token prediction (mtp_num_layers, last stage): per module eh_proj, a layer of the last layer's kind (never
//                recomputed) with its attention and memory-bound passes, 8·C per token more for its norms and the
//                concatenation, and the output layer with its loss once more
// Per step: m = global_batch_size / (micro_batch_size × dp) micro-batches of the above; the pipeline bubble
// (p − 1)/v micro-batches' time (1F1B, interleaved with v virtual stages); the p2p transfer of each micro-batch's
// activations and gradients; the data-parallel gradient all-reduce (the distributed optimizer's reduce-scatter and
// weight all-gather), of which overlap_grad_reduce hides all but max(one bucket, what the last micro-batch's backward
// cannot cover) and overlap_param_gather likewise with the next forward; AdamW's pass over the rank's fp32 state at
// the HBM bandwidth. No launch gaps or per-kernel overheads beyond what the fitted elementwise bandwidth absorbs: a
// micro-batch of one sequence costs what a quarter of four does.
// A collective's time is its ring traffic over the group's bus bandwidth (NVLink/xGMI when the group lies inside a
// node, the NIC when it spans nodes) plus a latency per ring step. Rank order is Megatron's (tp fastest, then cp, dp,
// pp), as parallel/parallel_dims.h lays the groups out.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "train/projection.h"

namespace primus {

// The job's machines: how the ranks are spread over nodes, and the NIC between them.
struct ClusterShape {
  int nnodes = 1;
  int gpus_per_node = 1;
  double nic_gbit_per_s = 400.0;  // per GPU (one NIC each, as DGX/HGX and MI300X platforms have)
  int world() const { return nnodes * gpus_per_node; }
};

// Rates measured on the device (benchmark gemm / benchmark attention --jsonl): TFLOP/s per op and pass.
struct MeasuredRates {
  struct Rate {
    std::string op, pass;
    double tflops = 0.0;
  };
  std::vector<Rate> rates;
  std::string source;  // the files read

  std::optional<double> find(const std::string& op, const std::string& pass) const;
};
// Reads JSONL files of `benchmark gemm|attention --jsonl`; UsageError naming the file and line of a bad one.
MeasuredRates read_measured_rates(const std::vector<std::string>& paths);

// One line of the breakdown: a part of the step, its time per step and how it was costed.
struct StepPart {
  std::string name;  // "GEMMs", "attention", "tp all-reduce", ...
  double ms = 0.0;
  std::string how;   // "147.2 TFLOP at 771 TFLOP/s", "overlapped with backward: 3.1 of 12.4 ms shows"
};

struct PerformanceProjection {
  GpuModel gpu;
  ClusterShape cluster;
  std::string layout;         // ParallelDims::describe()
  int64_t model_parallel_ranks = 1;  // tp × pp × cp × ep: the ranks one sample's work is split over
  int64_t micro_batches = 1;  // per rank per step
  int64_t tokens_per_step = 0;
  int slowest_stage = 0;
  std::vector<StepPart> parts;  // of the slowest stage; sum = step_ms
  double step_ms = 0.0;
  double tokens_per_s_per_gpu = 0.0;
  double tflops_per_gpu = 0.0;  // the model family's FLOPs per token (as `benchmark train` counts them)
  double mfu = 0.0;             // against the GPU's dense bf16 peak
  std::string rates_source;     // the table's, or the measured files' and how many rates they gave
};

// `config` resolved for cluster.world() ranks; layout errors as a job's (UsageError naming the key).
PerformanceProjection project_performance(const ExperimentConfig& config, const GpuModel& gpu,
                                          const ClusterShape& cluster, const MeasuredRates* measured = nullptr);

std::string format_performance_projection(const PerformanceProjection& projection);
nlohmann::json performance_projection_json(const PerformanceProjection& projection);

}  // namespace primus
