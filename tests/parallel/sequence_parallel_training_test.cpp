// Sequence parallelism and replicated key/value heads end to end on CPU ranks over Gloo: whole `train pretrain` jobs
// of the built primus-cli (support/training_job.h) against one process at the same global batch: the losses,
// gradient norms and evaluation losses of every step and every parameter tensor of the saved checkpoint within
// relative 1e-5. Under sequence parallelism every norm's gradient is partial per tensor-parallel rank and is summed
// over the group once per step, together with the q/k norms' and the replicated key/value projections' (one
// collective); a missing or doubled sum shows in the norm weights and the gradient norm. Then a checkpoint saved
// with one key/value group replicated over 4 ranks (each k/v row written by one of them) resumes at tp 1, and
// layouts that do not split exit 2 naming the keys.
// The vocabulary is given (384) so that every tensor-parallel size has the same one, as in
// tensor_parallel_training_test.cpp.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "support/cli_process.h"
#include "support/test_support.h"
#include "support/training_job.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using testing::expect_same_run;
using testing::Job;
using testing::read_run;
using testing::run_job;
using testing::RunResult;
using testing::with;

const std::vector<std::string> kVocab{"vocab_size=384"};
const std::vector<std::string> kSp2{"tensor_model_parallel_size=2", "sequence_parallel=true"};
const std::vector<std::string> kSp4{"tensor_model_parallel_size=4", "sequence_parallel=true"};
// Buckets of 7001 parameters: the distributed optimizer's shards cut the norms and slices inside.
const std::vector<std::string> kDistOpt{"use_distributed_optimizer=true", "ddp_bucket_size=7001"};

// One job in a fresh workspace, its run read back.
RunResult train(const std::string& label, int ranks, const std::vector<std::string>& overrides) {
  return testing::train("sp_" + label, ranks, with(kVocab, overrides));
}

// `shape` on one rank, then in each layout of `layouts` (ranks, overrides), each against the one-rank run.
void expect_layouts_equal_one_rank(const std::string& label, const std::vector<std::string>& shape,
                                   const std::vector<std::pair<int, std::vector<std::string>>>& layouts) {
  const RunResult one = train(label + "_single", 1, shape);
  if (::testing::Test::HasFatalFailure()) return;
  for (const auto& [ranks, layout] : layouts) {
    const std::string description = fmt::format("{}: {} ranks {}", label, ranks, fmt::join(layout, " "));
    expect_same_run(one, train(label, ranks, with(shape, layout)), description);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// 4 key/value groups, so that the heads split over 4 tensor-parallel ranks too. The sample at the end runs its
// forwards of any length unsplit.
TEST(SequenceParallelTraining, Tp2Tp4AndTp2TimesDp2WithTheDistributedOptimizerEqualOneRank) {
  expect_layouts_equal_one_rank("llama", {"num_query_groups=4"},
                                {{2, with(kSp2, {"sample_length=3"})}, {4, kSp4}, {4, with(kSp2, kDistOpt)}});
}

// q/k norms (summed over the group with or without sequence parallelism) and every other norm, and tied embeddings.
TEST(SequenceParallelTraining, Qwen3WithTiedEmbeddingsAtTp2EqualsOneRank) {
  expect_layouts_equal_one_rank("qwen3", {"qk_layernorm=true", "untie_embeddings_and_output_weights=false"},
                                {{2, kSp2}});
}

// cp 2 × tp 2: the rows split over tp are this rank's two chunks of each sequence (2 × 32 / 2 = 32 rows).
TEST(SequenceParallelTraining, WithContextParallelEqualsOneRank) {
  expect_layouts_equal_one_rank("cp2", {}, {{4, with(kSp2, {"context_parallel_size=2"})}});
}

// One and two key/value groups over 4 tensor-parallel ranks: replicated on 4 and on 2 ranks each.
TEST(ReplicatedKeyValueHeadsTraining, OneAndTwoGroupsAtTp4EqualOneRank) {
  expect_layouts_equal_one_rank("mqa", {"num_query_groups=1"}, {{4, kSp4}});
  expect_layouts_equal_one_rank("gqa2", {"num_query_groups=2"}, {{4, {"tensor_model_parallel_size=4"}}});
}

// Saved at tp 4 with one key/value group (every k/v row held by 4 ranks, written by one), resumed at tp 1: the
// uninterrupted one-rank curve.
TEST(ReplicatedKeyValueHeadsTraining, CheckpointAtTp4ResumesAtTp1) {
  const std::vector<std::string> shape{"num_query_groups=1"};
  const RunResult one = train("mqa_resume_single", 1, shape);
  if (::testing::Test::HasFatalFailure()) return;
  Job first{testing::temp_dir("sp_mqa_first"), with(kVocab, with(shape, with(kSp4, {"train_iters=10"}))), 4};
  run_job(first);
  if (::testing::Test::HasFatalFailure()) return;
  Job second{testing::temp_dir("sp_mqa_resume"), with(kVocab, shape), 1};
  fs::copy(first.workspace + "/dp", second.workspace + "/dp", fs::copy_options::recursive);
  run_job(second);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string log = testing::read_text(second.workspace + "/rank0.out");
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  expect_same_run(one, read_run(second.workspace), "one key/value group: tp 4 with sequence parallelism, then tp 1");
}

// Layouts that do not split exit 2 on every rank, naming the keys: a micro-batch's rows that tp does not divide
// under sequence parallelism, and key/value groups that neither divide tp nor are a multiple of it.
TEST(SequenceParallelLayouts, BadLayoutsExitTwoNamingTheKeys) {
  const std::string dir = testing::temp_dir("sp_bad");
  const std::string config = testing::write_config(dir);
  const std::vector<std::tuple<int, std::string, std::string>> cases = {
      {2, "tensor_model_parallel_size=2 sequence_parallel=true micro_batch_size=1 seq_length=33",
       "sequence_parallel: micro_batch_size 1 x seq_length 33 = 33 rows of the hidden state are not divisible by "
       "tensor_model_parallel_size 2"},
      {4, "tensor_model_parallel_size=4 num_attention_heads=12 num_query_groups=3",
       "num_query_groups 3 must be a multiple of tensor_model_parallel_size 4, or divide it"},
  };
  for (const auto& [ranks, overrides, message] : cases) {
    const std::string out = dir + "/bad.out";
    const std::string command =
        fmt::format("OMP_NUM_THREADS=1 '{}' direct --nproc-per-node {} --master-port {} -- train pretrain --config "
                    "'{}' vocab_size=384 {} >'{}' 2>&1",
                    testing::cli_path().string(), ranks, testing::free_port(), config, overrides, out);
    const int status = std::system(command.c_str());
    const std::string output = testing::read_text(out);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << overrides << ": status " << status << "\n" << output;
    EXPECT_NE(output.find(message), std::string::npos) << overrides << ":\n" << output;
  }
}

}  // namespace
}  // namespace primus
