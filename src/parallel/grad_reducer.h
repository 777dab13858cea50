// Data-parallel gradient reduction as Megatron-Core's DDP does it: the flat gradient buffer is cut into
// buckets, and each bucket is reduced across the data-parallel ranks as soon as backward has finished its
// gradients (overlap_grad_reduce), on the communication stream, while backward goes on with the layers below.
// Plain data parallelism all-reduces a bucket; the distributed optimizer reduce-scatters it, so each rank
// ends with the reduced gradient of its shard only, and after the optimizer step all-gathers the weights.
//
// Bucket layout (BucketLayout): boundaries at multiples of B = ddp_bucket_size rounded up to the dp size,
// from offset 0 up; the top bucket holds the rest. Backward finishes gradients from the top of the buffer
// down (the output layer first, the embedding last: Model::backward), so buckets are launched top
// first. A bucket of n elements is split into dp equal shards of ceil(n / dp); rank r owns shard r (cut at
// the bucket's end). Only a bucket whose size dp does not divide (the top one) goes through a padded copy.
//
// Expert parallelism: the ranges holding this rank's experts are reduced over the expert-data-parallel group (the
// ranks holding the same experts) instead, and the distributed optimizer shards them over it. The layout is then cut
// into regions, the expert ranges and the ranges between them, each bucketed as above with its own group's size; a
// region's top bucket that its group does not divide is split into an even part and a tail of fewer elements than
// the group has ranks, which alone goes through a (tiny) padded copy. Without expert ranges the layout is as above.
//
// Gradients are already scaled by 1 / (tokens of the global batch), so the reduction is a plain sum.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ops/param_store.h"
#include "parallel/comm_stream.h"
#include "ops/communicator.h"

namespace primus {

class BucketLayout {
 public:
  // numel: elements of the flat buffer; bucket_size: elements per bucket (>= 1); dp: data-parallel size.
  BucketLayout(int64_t numel, int64_t bucket_size, int dp);
  // With expert ranges (sorted, disjoint, inside [0, numel)) reduced over a group of expert_dp ranks.
  BucketLayout(int64_t numel, int64_t bucket_size, int dp, const std::vector<FlatRange>& expert, int expert_dp);

  int64_t numel() const { return numel_; }
  int dp() const { return dp_; }
  int expert_dp() const { return expert_dp_; }
  // Buckets in the order backward finishes them (top of the buffer first).
  const std::vector<FlatRange>& buckets() const { return buckets_; }
  // Whether bucket k holds expert gradients (reduced over the expert-data-parallel group), and that group's size or dp.
  bool expert(size_t k) const { return expert_[k]; }
  int group_size(size_t k) const { return expert_[k] ? expert_dp_ : dp_; }
  // Elements per shard of bucket k: ceil(size / its group's size).
  int64_t shard_size(size_t k) const;
  // The part of bucket k that the rank of index r in its group owns (empty when the bucket is smaller than the
  // shards before it).
  FlatRange shard(size_t k, int rank) const;
  // Every range a rank owns, in bucket order: of index `rank` in the data-parallel group and `expert_rank` in the
  // expert-data-parallel one.
  std::vector<FlatRange> owned(int rank, int expert_rank = 0) const;

 private:
  // Buckets of [begin, end) for a group of `group` ranks, appended bottom up.
  void cut(FlatRange region, int64_t bucket_size, int group, bool expert, bool split_tail);

  int64_t numel_;
  int dp_;
  int expert_dp_ = 1;
  std::vector<FlatRange> buckets_;
  std::vector<bool> expert_;  // per bucket
};

class GradReducer {
 public:
  enum class Mode { kAllReduce, kReduceScatter };

  // grads: the flat gradient buffer [numel] f32 (on the communicator's device); dp: the data-parallel group;
  // expert_dp: the expert-data-parallel group, for a layout with expert buckets (else null).
  // overlap: launch each bucket during backward (else all of them in finish()).
  GradReducer(Communicator& dp, Tensor grads, BucketLayout layout, Mode mode, bool overlap,
              Communicator* expert_dp = nullptr);

  // Call before the backward whose gradients complete the step (the last micro-batch's), then pass
  // grads_ready() to that backward as its hook, then call finish().
  void start();
  // Backward's hook: gradients of [begin, end) are final.
  void grads_ready(int64_t begin, int64_t end);
  // Launches what is left and makes the compute stream (and so the host, for the CPU) wait for every
  // reduction: afterwards the gradients are reduced (all of them, or this rank's shards).
  void finish();

  // After the optimizer updated this rank's shards of `flat` (weights, fp32 or bf16, laid out like the
  // gradients): every rank gets every shard, bucket by bucket from the bottom of the buffer up (the order forward
  // reads them). wait: the compute stream waits for all of them now; else wait_gathered() before a range is read
  // (overlap_param_gather).
  void all_gather_shards(Tensor& flat, bool wait = true);
  // The compute stream waits for the gathers of the buckets that hold [r.begin, r.end) (no-op once done).
  void wait_gathered(FlatRange r);
  void wait_all_gathered() { wait_gathered({0, layout_.numel()}); }
  // Where the collectives run.
  CommStream& comm() { return comm_; }

  const BucketLayout& layout() const { return layout_; }
  Mode mode() const { return mode_; }

 private:
  void launch(size_t k);
  bool padded(size_t k) const { return staging_[k].defined(); }
  // Bucket k's group.
  Communicator& group(size_t k) const { return layout_.expert(k) ? *expert_dp_ : dp_; }
  // The gathered padded bucket k from its staging buffer into `gathered_flat_`.
  void finish_padded_gather(size_t k);

  Communicator& dp_;
  Communicator* expert_dp_;
  Tensor grads_;
  BucketLayout layout_;
  Mode mode_;
  bool overlap_;
  int64_t ready_from_ = 0;   // gradients at and above this offset are final
  size_t next_bucket_ = 0;   // next bucket (in layout order) to launch
  CommStream comm_;
  // Per bucket, for one its group does not divide (sharded mode), else undefined: [group × its shard size] f32, and
  // the same in the weights' dtype.
  std::vector<Tensor> staging_;
  std::vector<Tensor> gather_staging_;
  // Weight gathers not waited for yet, per bucket (all_gather_shards without wait).
  std::vector<std::optional<CommStream::Ticket>> gathering_;
  Tensor gathered_flat_;  // the buffer they gather into
};

}  // namespace primus
