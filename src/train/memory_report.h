// The memory table logged at the start of `train pretrain` and `benchmark train`, and the out-of-memory
// message that repeats it with what to try.
//
// Bytes per device, P parameters, N = micro_batch_size × seq_length tokens of one micro-batch (seq_length /
// context_parallel_size on each rank under context parallelism), a = bytes of an
// activation element (2 in bf16 mixed precision, else 4); rstd and lse are always fp32:
//   parameters          4·P    fp32 master weights
//   compute copy        2·P    bf16 copy of the weights (mixed precision only)
//   gradients           4·P    fp32
//   optimizer state     8·P    AdamW exp_avg and exp_avg_sq, fp32
//   activations                what one micro-batch's forward keeps for its backward (models/llama.cpp,
//                              layers/attention.h, layers/basic_layers.h):
//     a layer     N·a·(4C + 2·Hq·D + 2·Hkv·D + 3F) + 4·N·(2 + Hq)
//                 = the inputs of both RMSNorms, of attention and of the MLP [N, C] each; q and the attention
//                   output [N, Hq·D]; k and v [N, Hkv·D]; gate|up [N, 2F]; the SwiGLU output [N, F]; two rstd
//                   [N] and the attention lse [B, Hq, T]. q/k norm (Qwen3) adds the un-normed q and k and their
//                   rstd: N·a·(Hq + Hkv)·D + 4·N·(Hq + Hkv).
//     selective   drops the SwiGLU output: N·a·F less per layer.
//     full        a recomputed layer keeps nothing but, for the first layer of each chunk, the chunk's input
//                 [N, C] (uniform: chunks of recompute_num_layers layers; block: the first recompute_num_layers
//                 layers, one chunk each); backward runs a chunk's forward again, holding its layers whole.
//     output      the final norm's input [N, C] and rstd [N], and the loss gradient dhidden [N, C]; while the
//                 loss runs also the final norm's output [N, C], losses and lse [N] fp32 and one logits chunk
//                 of at most LmLoss::max_logits_bytes (1 GiB): rows × V × a.
//     multi-token prediction (mtp_num_layers D, on the last stage): each module keeps the shifted tokens'
//                 embedding [N, C] (enorm's input), eh_proj's input [N, 2C], two rstd [N], its layer (of the last
//                 layer's kind, never recomputed), its final norm's input and rstd and its loss gradient [N, C];
//                 its loss's transients are those of the output layer's (one loss runs at a time).
//     sequence parallel (tp ranks): the norms' inputs and rstd, a chunk's input, the final norm's input and rstd and
//                 dhidden hold N/tp rows; the gathered inputs of attention, the MLP and the output layer hold N.
//     peak        the larger of: everything saved plus the output layer's transients at the loss; with full
//                 recompute, the layers below a chunk plus the chunk's layers whole while backward recomputes
//                 it (or forward builds it).
//   fp8 (fp8_format; docs/fp8.md), on top: the codes of every fp8 Linear weight, W and Wᵀ, 2·P_fp8 (kept for the
//                 step); and per micro-batch one byte per element of each fp8 Linear input, xᵀ's codes kept for
//                 backward: N·(C + Hq·D) a layer for attention (not MLA, whose projections keep none), N·(C + F) for
//                 the dense MLP or N·(C + S) for a MoE layer's shared expert of S (F or S left out under selective
//                 recompute); under full recompute only one chunk's layers hold them. Those codes replace bf16 copies:
//                 the activations above lose N·a·C for attention's input and N·a·(C + F) for the dense MLP's input and
//                 SwiGLU output, N·a·S for a shared expert's product (its input stays: the router reads it).
// Not counted: the gradient temporaries of one layer's backward (a few [N, C] and [N, F] tensors), cuBLASLt
// and cuDNN workspaces, the RoPE table, token ids, the CUDA context, and the caching allocator's rounding (up
// to 25% of a request).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "core/error.h"
#include "models/model.h"

namespace primus {

struct ActivationEstimate {
  int64_t tokens = 0;              // N: tokens of one micro-batch
  int64_t layer_bytes = 0;         // the largest layer keeping all it saves (MoE and dense layers differ)
  int64_t saved_bytes = 0;         // held from the end of forward until backward: layers and output layer
  int64_t layers_saved_bytes = 0;  // of saved_bytes, the layers' (what each further micro-batch in flight adds)
  int64_t logits_chunk_bytes = 0;  // the output layer's logits buffer
  int64_t mtp_bytes = 0;           // of saved_bytes, the multi-token prediction modules' (mtp_num_layers)
  int64_t peak_bytes = 0;          // the most held at once (see above)
};

// sequence_parallel_ranks: under sequence parallelism (tensor_model_parallel_size ranks) each rank holds 1/tp of the
// residual stream's rows: the norms' inputs and rstd, a chunk's input, dhidden; the gathered inputs of attention
// and the MLP stay whole. expert_parallel_ranks > 1: a MoE layer's all-to-all dispatcher keeps the rows that came
// back too ([N·k, C]); its experts' rows are counted at an even routing (an imbalanced one holds more).
ActivationEstimate estimate_activations(const ModelArgs& args, int64_t micro_batch_size, int64_t seq_length,
                                        DType activation_dtype, const RecomputeConfig& recompute,
                                        int64_t sequence_parallel_ranks = 1, int64_t expert_parallel_ranks = 1);

struct MemoryPlan {
  ModelArgs model;  // what the plan is for (vocab_size resolved)
  // One rank's share of it that the activations were estimated for: its tensor-parallel slices, its stage's layers.
  ModelArgs rank_model;
  int64_t sequence_parallel_ranks = 1;  // tensor_model_parallel_size under sequence_parallel, else 1
  TrainingArgs train;
  std::string device;  // "cuda:0", "cpu"
  int64_t parameters = 0;
  int64_t micro_batch_size = 0;
  int64_t seq_length = 0;  // the tokens of each sequence this rank computes: seq_length / context_parallel_size
  DType activation_dtype = DType::kF32;
  std::string recompute;  // "none", "selective", "full (uniform, 1 layer a chunk)", ...
  int64_t param_bytes = 0;
  int64_t compute_copy_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optimizer_bytes = 0;       // this rank's: 1/dp of it with the distributed optimizer
  int64_t comm_bytes = 0;            // the distributed optimizer's staging buffer
  int64_t data_parallel_size = 1;    // the ranks the optimizer state shards over: data × context parallel
  bool sharded_optimizer = false;
  // use_megatron_fsdp optim_grads / optim_grads_params: "ZeRO-2" / "ZeRO-3", else empty. Then param_bytes are
  // the fp32 master shards, compute_copy_bytes the compute shards (bf16) plus the gathered units' weights held
  // at once, grad_bytes the gradient shards plus the units' gradients held at once.
  std::string fully_sharded;
  // Pipeline parallelism: "stage 0 of 2: layers 0-1, embedding", and the micro-batches whose activations the stage
  // holds at once (1F1B: pp − stage; interleaved: its warm-up's virtual micro-batches, rounded up to whole stages here;
  // the activation bytes count each virtual micro-batch as one model chunk's layers).
  std::string pipeline_stage;
  int64_t micro_batches_in_flight = 1;
  ActivationEstimate activations;
  int64_t device_total_bytes = 0;  // CUDA: as the driver reports it; 0 on the CPU
  int64_t device_free_bytes = 0;   // CUDA: free when the plan was made

  // FSDP: of the units' buffers above, what is released while the activations peak (at the loss), so that the peak
  // of the whole is less than the sum of the rows' peaks. One rank (step_scoped_buffers): the larger of the loss's
  // moment (no gradients of the blocks yet) and the end of backward (no compute copy) is the peak; this is the rest.
  int64_t not_at_once_bytes = 0;
  bool step_scoped_buffers = false;
  // fp8 (above): the weights' codes, and the inputs' codes kept for backward by the micro-batches in flight.
  int64_t fp8_weight_codes_bytes = 0;
  int64_t fp8_input_codes_bytes = 0;
  int64_t fp8_freed_inputs_bytes = 0;  // of activations.peak_bytes, the bf16 inputs those codes replace

  int64_t static_bytes() const {
    return param_bytes + compute_copy_bytes + grad_bytes + optimizer_bytes + comm_bytes + fp8_weight_codes_bytes;
  }
  int64_t total_bytes() const {
    return static_bytes() + activations.peak_bytes + fp8_input_codes_bytes - fp8_freed_inputs_bytes - not_at_once_bytes;
  }
};

// `args.vocab_size` must be resolved. A pure estimate: the device is only named (see add_device_memory). At
// pipeline_model_parallel_size > 1 the plan is pipeline stage `stage`'s: its parameters only, its layers'
// activations times the micro-batches it holds at once.
MemoryPlan plan_memory(const ModelArgs& args, const TrainingArgs& t, Device device, DType compute_dtype,
                       int stage = 0);
// Fills the device's total and free memory on CUDA (the backend must be started); nothing on the CPU.
void add_device_memory(MemoryPlan& plan, Device device);

// Throws UsageError (exit 2, before anything is allocated) when the plan cannot fit: the parameters, gradients and
// optimizer state alone exceed the memory of the device (CUDA) or of the host (CPU), or the whole estimate is more
// than twice it (the estimate leaves things out, so a plan just above the memory only gets log_memory_plan's
// warning). The message names the keys to change.
void check_memory_plan_fits(const MemoryPlan& plan);

// The table, one line each, for logs and error messages.
std::vector<std::string> format_memory_table(const MemoryPlan& plan);
// Logs the table (info), and a warning when the estimate exceeds the device's memory.
void log_memory_plan(const MemoryPlan& plan);

// What to change when a plan does not fit: a smaller micro_batch_size, recompute, a shorter seq_length, sharding,
// each with the activation estimate it would give.
std::vector<std::string> memory_suggestions(const MemoryPlan& plan);
// "out of memory on DEVICE: a request for X did not fit", the allocator's own line, the table, and what to try
// (a smaller micro_batch_size, recompute, a shorter seq_length, sharding) with the activation estimates
// those settings would give.
std::string out_of_memory_message(const OutOfMemoryError& error, const MemoryPlan& plan);

// 1.50 GiB / 12.00 MiB / 3.0 KiB
std::string format_memory_bytes(int64_t bytes);

}  // namespace primus
