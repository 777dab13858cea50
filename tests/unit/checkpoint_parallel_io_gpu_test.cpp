// A checkpoint loaded into a CUDA model (through page-locked staging in rounds, parallel_io.h) holds the same bytes
// as the same checkpoint loaded into a CPU model, with tensors of several 16 MiB pieces and more pieces than one
// round's staging slots; and a CUDA model's save (its tensors copied to the host piece by piece on the writer's
// threads) writes the same files as the CPU model's. Skipped, with the reason, where there is no CUDA build or no
// GPU.
#include <gtest/gtest.h>

#include <random>

#include "checkpoint/checkpoint.h"
#include "core/file_io.h"
#include "ops/ops.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr Device kGpu{DeviceType::kCuda, 0};

// About 12M parameters: a 32 MiB embedding and output layer (two pieces each), 150 MB of checkpoint.
ModelArgs wide_args() {
  ModelArgs args = testing::tiny_llama_args();
  args.hidden_size = 256;
  args.num_attention_heads = 4;
  args.num_query_groups = 4;
  args.kv_channels = 64;
  args.ffn_hidden_size = 1024;
  args.num_layers = 2;
  args.vocab_size = 32768;
  args.untie_embeddings_and_output_weights = true;
  return args;
}

struct State {
  explicit State(Device device) : model(make_model(wide_args(), 16, device)), optimizer(model->params(), {}) {}
  std::unique_ptr<Model> model;
  AdamW optimizer;
  std::vector<Tensor> tensors() const {
    return {model->params().flat_params(), optimizer.exp_avg(0), optimizer.exp_avg_sq(0)};
  }
  std::string host_bytes() const {
    std::string all;
    for (const Tensor& t : tensors()) {
      const Tensor host = ops::to_device(t, kCpuDevice);
      all.append(static_cast<const char*>(host.data()), host.nbytes());
    }
    return all;
  }
};

TEST(CheckpointParallelIoGpu, ACudaLoadEqualsTheCpuLoad) {
  PRIMUS_SKIP_WITHOUT_GPU();
  State saved(kCpuDevice);
  uint64_t seed = std::random_device{}();
  for (Tensor t : saved.tensors()) ops::fill_normal(t, seed++, 1.0);
  const std::string root = testing::temp_dir("ckpt-parallel-gpu");
  const TrainerState state{.iteration = 3, .consumed_train_samples = 6, .optimizer_steps = 3, .seed = 1, .fp8_scaling = {}};
  save_checkpoint(root, *saved.model, saved.optimizer, state, "x: 1\n");

  State cpu(kCpuDevice);
  load_checkpoint(root + "/iter_0000003", *cpu.model, cpu.optimizer, {}, CheckpointIo{2});
  ASSERT_TRUE(cpu.host_bytes() == saved.host_bytes());
  for (int threads : {1, 2, 0}) {
    State gpu(kGpu);
    load_checkpoint(root + "/iter_0000003", *gpu.model, gpu.optimizer, {}, CheckpointIo{threads});
    EXPECT_TRUE(gpu.host_bytes() == cpu.host_bytes()) << threads << " threads";
  }
}

TEST(CheckpointParallelIoGpu, ACudaSaveWritesTheCpuSavesFiles) {
  PRIMUS_SKIP_WITHOUT_GPU();
  State cpu(kCpuDevice);
  uint64_t seed = std::random_device{}();
  for (Tensor t : cpu.tensors()) ops::fill_normal(t, seed++, 1.0);
  State gpu(kGpu);
  const std::vector<Tensor> from = cpu.tensors();
  std::vector<Tensor> to = gpu.tensors();
  for (size_t i = 0; i < to.size(); ++i) ops::copy(to[i], from[i]);
  ops::synchronize(kGpu);
  const std::string root = testing::temp_dir("ckpt-parallel-gpu-save");
  const TrainerState state{.iteration = 1, .consumed_train_samples = 2, .optimizer_steps = 1, .seed = 1, .fp8_scaling = {}};
  save_checkpoint(root + "/cpu", *cpu.model, cpu.optimizer, state, "x: 1\n", {}, CheckpointIo{4});
  save_checkpoint(root + "/gpu", *gpu.model, gpu.optimizer, state, "x: 1\n", {}, CheckpointIo{4});
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "manifest.json"}) {
    EXPECT_EQ(read_file(root + "/gpu/iter_0000001/" + file), read_file(root + "/cpu/iter_0000001/" + file)) << file;
  }
}

}  // namespace
}  // namespace primus
