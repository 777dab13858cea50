// The typed result of loading an experiment config: every value the program uses, already validated.
// Layers and trainers read these structs; nothing looks options up by string after loading.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace primus {

// Model shape keys (Megatron-LM argument names). Filled from the model preset, then overrides.
struct ModelArgs {
  std::string preset;                  // as written in modules.<m>.model (name or path)
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;        // resolved: equals num_attention_heads unless group_query_attention
  int64_t kv_channels = 0;             // resolved head dim: hidden_size / heads unless given
  int64_t vocab_size = 0;              // 0 when not given: the trainer uses the tokenizer's size, padded
  int64_t make_vocab_size_divisible_by = 128;
  int64_t max_position_embeddings = 0;
  double rotary_base = 10000.0;
  bool use_rope_scaling = false;       // Llama 3.1 frequency scaling
  double rope_scaling_factor = 8.0;
  double rope_scaling_low_freq_factor = 1.0;
  double rope_scaling_high_freq_factor = 4.0;
  int64_t rope_scaling_original_max_position_embeddings = 8192;
  double norm_epsilon = 1e-5;
  bool qk_layernorm = false;           // Qwen3: RMSNorm over head_dim on q and k before RoPE
  bool untie_embeddings_and_output_weights = false;
  double init_method_std = 0.02;
  // Multi-head latent attention (DeepSeek-V2/V3; Megatron's keys, docs/mla.md). Per head the query and key are
  // qk_head_dim features without RoPE then qk_pos_emb_head_dim with it; the value has v_head_dim.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;          // 0: a full-rank q_proj (DeepSeek-V2-Lite), else q_a_proj, q_a_layernorm, q_b_proj
  int64_t kv_lora_rank = 0;         // the joint key/value compression
  int64_t qk_head_dim = 0;          // HF's qk_nope_head_dim
  int64_t qk_pos_emb_head_dim = 0;  // HF's qk_rope_head_dim
  int64_t v_head_dim = 0;
  // YaRN RoPE (position_embedding_type: yarn; Megatron's names). Frequencies of wavelengths longer than the original
  // context are interpolated by rotary_scaling_factor, those shorter than it kept, with a ramp between beta_fast and
  // beta_slow rotations; mscale and mscale_all_dim set the attention temperature.
  bool yarn = false;
  double rotary_scaling_factor = 40.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.707;
  double mscale_all_dim = 0.707;
  // Multi-token prediction (DeepSeek-V3, Megatron's keys): mtp_num_layers modules after the last layer, module k
  // predicting the token k + 1 positions ahead from the previous depth's hidden state and the embedding of token
  // i + k; their mean loss is added to the main loss with weight mtp_loss_scaling_factor. 0: none.
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;
  // Mixture of experts (Megatron's keys; num_experts 0: a dense model). Validated by the config loader.
  int64_t num_experts = 0;
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 0;                  // resolved: ffn_hidden_size when not given
  int64_t moe_shared_expert_intermediate_size = 0;  // 0: no shared expert
  std::vector<int64_t> moe_layer_freq = {1};        // one frequency (layer i % f == 0), or 0/1 per layer
  int64_t moe_first_k_dense_replace = 0;            // the first k layers stay dense
  std::string moe_router_score_function = "softmax";  // softmax | sigmoid
  bool moe_router_pre_softmax = false;              // softmax over all experts, weights not renormalised
  double moe_router_topk_scaling_factor = 1.0;
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;
  std::string moe_router_load_balancing_type = "aux_loss";  // aux_loss | seq_aux_loss | none
  bool moe_router_enable_expert_bias = false;
  int64_t moe_router_num_groups = 1;                // 1: no grouped selection
  int64_t moe_router_group_topk = 1;
  // Expert capacity (token dropping): 0 is dropless.
  double moe_expert_capacity_factor = 0.0;
  std::string moe_token_drop_policy = "probs";  // probs | position
  bool moe_pad_expert_input_to_capacity = false;

  // Whether layer i's MLP is a mixture of experts (num_experts > 0, past the first dense layers, and marked by
  // moe_layer_freq).
  bool is_moe_layer(int64_t i) const {
    if (num_experts == 0 || i < moe_first_k_dense_replace) return false;
    if (moe_layer_freq.size() == 1) return moe_layer_freq[0] > 0 && i % moe_layer_freq[0] == 0;
    return moe_layer_freq[static_cast<size_t>(i)] != 0;
  }
  // A multi-token prediction module's transformer layer is of the last decoder layer's kind (Megatron builds it from
  // the last layer's spec): MLA + MoE for DeepSeek-V3.
  bool is_mtp_moe_layer() const { return num_layers > 0 && is_moe_layer(num_layers - 1); }
};

// Multi-token prediction runs on one pipeline stage, without tensor or context parallelism or FSDP (the config, the
// trainer and the model refuse the rest); projection plans every layout.
// Why a layout cannot run the modules, or "" when it can.
inline std::string mtp_layout_refusal(const ModelArgs& m, int64_t tp, int64_t pp, int64_t cp, bool fsdp) {
  if (m.mtp_num_layers == 0) return "";
  if (pp > 1) {
    return "mtp_num_layers: multi-token prediction needs the embedding on the last pipeline stage as well (for the "
           "tokens k ahead), which pipeline parallelism does not keep there yet; set pipeline_model_parallel_size: 1";
  }
  if (tp > 1 || cp > 1) {
    return "mtp_num_layers: multi-token prediction is not split over tensor- or context-parallel ranks yet; set "
           "tensor_model_parallel_size: 1 and context_parallel_size: 1";
  }
  if (fsdp) {
    return "mtp_num_layers: multi-token prediction reads the embedding after the output layer, which FSDP's units do "
           "not keep gathered; set use_megatron_fsdp: false";
  }
  return "";
}

// fp8 needs fp8 tensor cores. The CPU engine refuses it, except as the reference the tests check the recipes with
// (PRIMUS_FP8_CPU_REFERENCE=1: fp8 GEMMs as dequantised fp32 ones, slow).
inline constexpr const char* kFp8NeedsGpu =
    "fp8 needs a GPU with fp8 tensor cores (Hopper sm_90 or newer, MI300X/MI355X)";
inline bool fp8_cpu_reference_requested() {
  const char* value = std::getenv("PRIMUS_FP8_CPU_REFERENCE");
  return value != nullptr && std::string(value) == "1";
}

// Training keys (Megatron-LM argument names).
struct TrainingArgs {
  int64_t train_iters = 0;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 1;
  int64_t seq_length = 0;
  int64_t data_parallel_size = 1;      // derived: WORLD_SIZE / (tensor × pipeline × context parallel)
  int64_t world_size = 1;              // WORLD_SIZE of the torchrun environment (1 without one)
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;                  // the experts split over ranks of dp × cp
  std::string moe_token_dispatcher_type = "alltoall";      // alltoall (allgather and flex are refused)
  bool sequence_parallel = false;
  // Pipeline layout (0: unset). Checked with the model and the world size by parallel/parallel_dims.h.
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // unset: no interleaving (or the next key)
  int64_t num_virtual_stages_per_pipeline_rank = 0;   // unset: no interleaving (or the key above)
  int64_t decoder_first_pipeline_num_layers = 0;      // unset: an even split
  int64_t decoder_last_pipeline_num_layers = 0;       // unset: an even split
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  int64_t ddp_bucket_size = 0;         // parameters; resolved: max(40M, 1M × data_parallel_size)
  bool use_megatron_fsdp = false;
  std::string data_parallel_sharding_strategy = "no_shard";  // no_shard | optim | optim_grads | optim_grads_params
  double distributed_timeout_minutes = 10.0;
  double lr = 0.0;
  double min_lr = 0.0;
  int64_t lr_warmup_iters = 0;
  std::string lr_decay_style = "cosine";  // constant | linear | cosine
  int64_t lr_decay_iters = 0;          // resolved: train_iters when not given
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;              // 0 disables clipping
  int64_t seed = 1234;
  int64_t log_interval = 100;
  int64_t eval_interval = 1000;        // 0 disables evaluation
  int64_t eval_iters = 100;
  std::string save;                    // checkpoint directory; empty: <run dir>/checkpoints
  int64_t save_interval = 0;           // 0: save only at the end
  bool deterministic_mode = false;     // GPU runs repeat bit for bit
  bool async_save = false;             // checkpoint files written by a background thread
  int64_t keep_latest_k = 0;           // checkpoints kept; 0: all
  int64_t keep_interval = 0;           // iterations whose checkpoints stay beyond keep_latest_k; 0: none
  std::string load;                    // directory to resume from; empty: same as save
  std::string pretrained_checkpoint;   // Hugging Face model directory to start from (weights only)
  bool mock_data = false;
  std::vector<std::string> data_path;  // text files or directories (byte-level tokenizer for now)
  std::string split = "969,30,1";
  // Documents packed into a sample, separated by the tokenizer's EOD id (Megatron's switches).
  bool reset_position_ids = false;     // RoPE positions restart after each EOD
  bool reset_attention_mask = false;   // attention stays within each document
  bool eod_mask_loss = false;          // no loss where the input is EOD
  std::string tokenizer_type = "ByteLevelTokenizer";
  std::string tokenizer_model;         // file or directory for every tokenizer but ByteLevelTokenizer
  std::string tensorboard_dir;         // TensorBoard event files; empty: none
  // Which TensorBoard scalars beyond lm loss, grad-norm and lm loss validation (Megatron's switches and defaults).
  bool log_learning_rate_to_tensorboard = true;
  bool log_throughput = false;
  bool log_timers_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool moe_per_layer_logging = false;  // TensorBoard: MoE figures per layer too
  double moe_router_bias_update_rate = 1e-3;  // the expert bias's step per training step
  std::string mlflow_tracking_dir;     // MLflow file store (mlruns/) to log the run into; empty: none
  std::string mlflow_experiment_name;  // resolved: exp_name when not given
  bool bf16 = false;                   // mixed precision (CUDA only)
  // fp8 (docs/fp8.md; Megatron's keys, checked by the config loader). fp8_format empty: off.
  std::string fp8_format;                            // "" | e4m3 | hybrid (e4m3 forward, e5m2 gradients)
  std::string fp8_recipe = "delayed";                // tensorwise | delayed | blockwise
  int64_t fp8_margin = 0;                            // delayed: scales / 2^margin
  int64_t fp8_amax_history_len = 1;                  // delayed
  std::string fp8_amax_compute_algo = "most_recent";  // delayed: most_recent | max
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  std::string device = "auto";         // auto | cpu | cuda
  bool profile = false;                // Chrome/Perfetto trace of [profile_step_start, profile_step_end)
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<int64_t> profile_ranks = {0};
  std::string recompute_granularity;   // "" (none) | full | selective
  std::string recompute_method;        // uniform | block (resolved for full)
  int64_t recompute_num_layers = 0;    // resolved for full
  int64_t sample_length = 0;           // tokens to generate at the end of training (0: none)
  std::string sample_prompt;
};

// One value of the `container:` section with where it was written ("exp.yaml:12: container.options.image"),
// so that `primus-cli container` can name it when it rejects the value.
struct SourcedValue {
  std::string value;
  std::string where;
};

// The `container:` section, as Primus's launcher YAML writes it (`container.options.image`, `.volume`,
// `.env`, and run options such as `ipc`, `network`, `device`), plus `container.runtime`. Read by
// `primus-cli container`, where the command-line flags win; ignored by the other modes.
struct ContainerSettings {
  std::optional<SourcedValue> image;
  std::optional<SourcedValue> runtime;  // podman | docker (checked by the container mode)
  std::vector<SourcedValue> volumes;    // "SRC[:DST[:OPTIONS]]"
  std::vector<SourcedValue> env;        // "NAME=VALUE", or "NAME" for the host's value
  // Further `podman|docker run` options, in file order: ("ipc", "host"), ("device", "/dev/infiniband"),
  // ("privileged", "") for a flag that takes no value.
  std::vector<std::pair<std::string, SourcedValue>> options;
};

// The `slurm:` section, read by `primus-cli slurm` (as Primus users write it; flags on the command line win).
// Unset: absent from the file. Validated when loaded (nodes >= 1, gpus_per_node >= 0, a Slurm time format).
struct SlurmSettings {
  std::optional<int64_t> nodes;          // --nodes
  std::optional<int64_t> gpus_per_node;  // --gpus-per-node; also the workers started on each node
  std::string partition;                 // --partition
  std::string time;                      // --time, e.g. 4:00:00, 2-00:00:00, 90
  std::string job_name;                  // --job-name
  std::string account;                   // --account
  std::string output;                    // --output (sbatch), a path with Slurm's %j etc.
  std::string error;                     // --error (sbatch)
  // Where each given key was written ("exp.yaml:12"), by its canonical name (job_name, gpus_per_node, ...).
  std::map<std::string, std::string> sources;
  bool empty() const { return sources.empty(); }
};

struct ExperimentConfig {
  std::string source_path;             // the experiment file as given
  std::string work_group;
  std::string user_name;
  std::string exp_name;
  std::string workspace;
  std::map<std::string, std::string> env;  // applied to the process environment before the run
  ContainerSettings container;             // for `primus-cli container`
  SlurmSettings slurm;                     // used only by `primus-cli slurm`
  std::string module_name;             // "pre_trainer"
  std::string framework;               // "megatron"
  ModelArgs model;
  TrainingArgs train;
  std::string effective_yaml;          // the merged config, written to <run dir>/config.yaml
  std::string run_dir() const { return workspace + "/" + exp_name; }
};

}  // namespace primus
