#include "parallel/grad_reducer.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

BucketLayout::BucketLayout(int64_t numel, int64_t bucket_size, int dp) : numel_(numel), dp_(dp) {
  PRIMUS_CHECK(numel >= 1 && bucket_size >= 1 && dp >= 1, "[ddp] bucket layout of {} elements, buckets of {}, dp {}",
               numel, bucket_size, dp);
  cut({0, numel}, bucket_size, dp, false, false);
  std::reverse(buckets_.begin(), buckets_.end());
}

BucketLayout::BucketLayout(int64_t numel, int64_t bucket_size, int dp, const std::vector<FlatRange>& expert,
                           int expert_dp)
    : numel_(numel), dp_(dp), expert_dp_(expert_dp) {
  PRIMUS_CHECK(numel >= 1 && bucket_size >= 1 && dp >= 1 && expert_dp >= 1 && dp % expert_dp == 0,
               "[ddp] bucket layout of {} elements, buckets of {}, dp {}, expert-data-parallel {}", numel, bucket_size,
               dp, expert_dp);
  int64_t at = 0;
  for (const FlatRange& r : expert) {
    PRIMUS_CHECK(r.begin >= at && r.begin < r.end && r.end <= numel, "[ddp] expert range [{}, {}) after {} of {}",
                 r.begin, r.end, at, numel);
    if (r.begin > at) cut({at, r.begin}, bucket_size, dp, false, true);
    cut(r, bucket_size, expert_dp, true, true);
    at = r.end;
  }
  if (at < numel) cut({at, numel}, bucket_size, dp, false, true);
  std::reverse(buckets_.begin(), buckets_.end());
  std::reverse(expert_.begin(), expert_.end());
}

void BucketLayout::cut(FlatRange region, int64_t bucket_size, int group, bool expert, bool split_tail) {
  const int64_t step = (bucket_size + group - 1) / group * group;
  for (int64_t begin = region.begin; begin < region.end; begin += step) {
    const FlatRange b{begin, std::min(region.end, begin + step)};
    const int64_t tail = b.size() % group;
    if (split_tail && tail != 0 && b.size() > group) {
      buckets_.push_back({b.begin, b.end - tail});
      buckets_.push_back({b.end - tail, b.end});
      expert_.insert(expert_.end(), 2, expert);
    } else {
      buckets_.push_back(b);
      expert_.push_back(expert);
    }
  }
}

int64_t BucketLayout::shard_size(size_t k) const {
  const int g = group_size(k);
  return (buckets_[k].size() + g - 1) / g;
}

FlatRange BucketLayout::shard(size_t k, int rank) const {
  const FlatRange& b = buckets_[k];
  const int64_t s = shard_size(k);
  return {std::min(b.end, b.begin + rank * s), std::min(b.end, b.begin + (rank + 1) * s)};
}

std::vector<FlatRange> BucketLayout::owned(int rank, int expert_rank) const {
  std::vector<FlatRange> ranges;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const FlatRange r = shard(k, expert_[k] ? expert_rank : rank);
    if (!r.empty()) ranges.push_back(r);
  }
  return ranges;
}

GradReducer::GradReducer(Communicator& dp, Tensor grads, BucketLayout layout, Mode mode, bool overlap,
                         Communicator* expert_dp)
    : dp_(dp),
      expert_dp_(expert_dp),
      grads_(std::move(grads)),
      layout_(std::move(layout)),
      mode_(mode),
      overlap_(overlap),
      comm_(dp.device()) {
  PRIMUS_CHECK(grads_.numel() == layout_.numel() && grads_.dtype() == DType::kF32,
               "[ddp] gradient buffer {} does not match a bucket layout of {} elements", grads_.describe(),
               layout_.numel());
  PRIMUS_CHECK(layout_.dp() == dp_.size(), "[ddp] bucket layout for dp {} on a group of {}", layout_.dp(), dp_.size());
  const size_t buckets = layout_.buckets().size();
  staging_.resize(buckets);
  gather_staging_.resize(buckets);
  for (size_t k = 0; k < buckets; ++k) {
    if (layout_.expert(k)) {
      PRIMUS_CHECK(expert_dp_ != nullptr && expert_dp_->size() == layout_.expert_dp(),
                   "[ddp] bucket layout with expert buckets for an expert-data-parallel group of {}, given {}",
                   layout_.expert_dp(), expert_dp_ != nullptr ? expert_dp_->size() : 0);
    }
    const int g = layout_.group_size(k);
    if (mode_ == Mode::kReduceScatter && layout_.buckets()[k].size() % g != 0) {
      staging_[k] = ops::zeros({layout_.shard_size(k) * g}, DType::kF32, grads_.device());
    }
  }
  ready_from_ = layout_.numel();
  next_bucket_ = buckets;  // nothing to launch before start()
}

void GradReducer::start() {
  ready_from_ = layout_.numel();
  next_bucket_ = 0;
}

void GradReducer::grads_ready(int64_t begin, int64_t end) {
  PRIMUS_CHECK(end == ready_from_ && begin < end, "[ddp] gradients [{}, {}) reported out of order (expected the "
               "range ending at {})", begin, end, ready_from_);
  ready_from_ = begin;
  if (!overlap_) return;
  while (next_bucket_ < layout_.buckets().size() && layout_.buckets()[next_bucket_].begin >= ready_from_) {
    launch(next_bucket_++);
  }
}

void GradReducer::finish() {
  PRIMUS_CHECK(ready_from_ == 0, "[ddp] backward reported gradients down to {} only, not to 0", ready_from_);
  while (next_bucket_ < layout_.buckets().size()) launch(next_bucket_++);
  const ops::ProfileScope scope("ddp: wait for gradient reduction");
  comm_.wait_all();
  if (mode_ != Mode::kReduceScatter) return;
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {  // this rank's parts of the padded buckets
    if (!padded(k)) continue;
    const int rank = group(k).rank();
    const FlatRange mine = layout_.shard(k, rank);
    if (mine.empty()) continue;
    Tensor dst = grads_.slice_elements(mine.begin, {mine.size()});
    ops::copy(dst, staging_[k].slice_elements(rank * layout_.shard_size(k), {mine.size()}));
  }
}

void GradReducer::launch(size_t k) {
  const ops::ProfileScope scope(mode_ == Mode::kAllReduce ? "ddp: all_reduce bucket" : "ddp: reduce_scatter bucket");
  const FlatRange b = layout_.buckets()[k];
  Communicator& g = group(k);
  const char* experts = layout_.expert(k) ? ", experts" : "";
  Tensor bucket = grads_.slice_elements(b.begin, {b.size()});
  if (mode_ == Mode::kAllReduce) {
    comm_.launch(fmt::format("all_reduce bucket {} ({} elements{})", k, b.size(), experts),
                 [&g, bucket](Stream stream) mutable { g.all_reduce(bucket, ReduceOp::kSum, stream); });
    return;
  }
  const int64_t s = layout_.shard_size(k);
  if (!padded(k)) {
    Tensor out = grads_.slice_elements(b.begin + g.rank() * s, {s});
    comm_.launch(fmt::format("reduce_scatter bucket {} ({} elements{})", k, b.size(), experts),
                 [&g, bucket, out](Stream stream) mutable { g.reduce_scatter(bucket, out, ReduceOp::kSum, stream); });
    return;
  }
  // The group does not divide this bucket: it is reduced in its staging buffer with zeros after it; finish() copies
  // this rank's part back. The copy in is compute-stream work, so the communication stream waits for it.
  Tensor staging = staging_[k];
  ops::fill(staging, 0.0f);
  Tensor head = staging.slice_elements(0, {b.size()});
  ops::copy(head, bucket);
  Tensor out = staging.slice_elements(g.rank() * s, {s});
  comm_.launch(fmt::format("reduce_scatter bucket {} ({} elements, padded{})", k, b.size(), experts),
               [&g, staging, out](Stream stream) mutable { g.reduce_scatter(staging, out, ReduceOp::kSum, stream); });
}

void GradReducer::all_gather_shards(Tensor& flat, bool wait) {
  PRIMUS_CHECK(mode_ == Mode::kReduceScatter && flat.numel() == layout_.numel(),
               "[ddp] all_gather_shards of {} needs the sharded mode and a buffer laid out like the gradients",
               flat.describe());
  wait_all_gathered();  // the previous step's, should any be left
  const ops::ProfileScope scope("distributed optimizer: all_gather weights");
  gathered_flat_ = flat;
  gathering_.assign(layout_.buckets().size(), std::nullopt);
  for (size_t k = layout_.buckets().size(); k-- > 0;) {  // the bottom bucket (the embedding) first
    const FlatRange b = layout_.buckets()[k];
    const int64_t s = layout_.shard_size(k);
    Communicator& g = group(k);
    Tensor bucket = flat.slice_elements(b.begin, {b.size()});
    if (!padded(k)) {
      Tensor in = flat.slice_elements(b.begin + g.rank() * s, {s});
      gathering_[k] = comm_.launch(fmt::format("all_gather weights bucket {}", k),
                                   [&g, in, bucket](Stream stream) mutable { g.all_gather(in, bucket, stream); });
      continue;
    }
    Tensor& staging = gather_staging_[k];
    if (!staging.defined() || staging.dtype() != flat.dtype()) {
      staging = ops::zeros({s * layout_.group_size(k)}, flat.dtype(), flat.device());
    }
    const FlatRange mine = layout_.shard(k, g.rank());
    Tensor in = staging.slice_elements(g.rank() * s, {s});
    if (!mine.empty()) {
      Tensor dst = in.slice_elements(0, {mine.size()});
      ops::copy(dst, flat.slice_elements(mine.begin, {mine.size()}));
    }
    Tensor out = staging;
    gathering_[k] = comm_.launch(fmt::format("all_gather weights bucket {} (padded)", k),
                                 [&g, in, out](Stream stream) mutable { g.all_gather(in, out, stream); });
  }
  if (wait) wait_all_gathered();
}

void GradReducer::wait_gathered(FlatRange r) {
  for (size_t k = 0; k < gathering_.size(); ++k) {
    const FlatRange b = layout_.buckets()[k];
    if (!gathering_[k] || b.end <= r.begin || b.begin >= r.end) continue;
    comm_.wait(*gathering_[k]);
    gathering_[k].reset();
    if (padded(k)) finish_padded_gather(k);
  }
}

void GradReducer::finish_padded_gather(size_t k) {
  const FlatRange b = layout_.buckets()[k];
  Tensor bucket = gathered_flat_.slice_elements(b.begin, {b.size()});
  ops::copy(bucket, gather_staging_[k].slice_elements(0, {b.size()}));
}

}  // namespace primus
