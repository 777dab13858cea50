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
  const int64_t step = (bucket_size + dp - 1) / dp * dp;
  for (int64_t begin = 0; begin < numel; begin += step) buckets_.push_back({begin, std::min(numel, begin + step)});
  std::reverse(buckets_.begin(), buckets_.end());
}

int64_t BucketLayout::shard_size(size_t k) const { return (buckets_[k].size() + dp_ - 1) / dp_; }

FlatRange BucketLayout::shard(size_t k, int rank) const {
  const FlatRange& b = buckets_[k];
  const int64_t s = shard_size(k);
  return {std::min(b.end, b.begin + rank * s), std::min(b.end, b.begin + (rank + 1) * s)};
}

std::vector<FlatRange> BucketLayout::owned(int rank) const {
  std::vector<FlatRange> ranges;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const FlatRange r = shard(k, rank);
    if (!r.empty()) ranges.push_back(r);
  }
  return ranges;
}

GradReducer::GradReducer(Communicator& dp, Tensor grads, BucketLayout layout, Mode mode, bool overlap)
    : dp_(dp), grads_(std::move(grads)), layout_(std::move(layout)), mode_(mode), overlap_(overlap), comm_(dp.device()) {
  PRIMUS_CHECK(grads_.numel() == layout_.numel() && grads_.dtype() == DType::kF32,
               "[ddp] gradient buffer {} does not match a bucket layout of {} elements", grads_.describe(),
               layout_.numel());
  PRIMUS_CHECK(layout_.dp() == dp_.size(), "[ddp] bucket layout for dp {} on a group of {}", layout_.dp(), dp_.size());
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {
    if (mode_ == Mode::kReduceScatter && layout_.buckets()[k].size() % layout_.dp() != 0) {
      PRIMUS_CHECK(!padded_bucket_, "[ddp] only the top bucket may be uneven");
      padded_bucket_ = k;
      staging_ = ops::zeros({layout_.shard_size(k) * layout_.dp()}, DType::kF32, grads_.device());
    }
  }
  ready_from_ = layout_.numel();
  next_bucket_ = layout_.buckets().size();  // nothing to launch before start()
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
  if (mode_ == Mode::kReduceScatter && padded_bucket_) {  // this rank's part of the padded bucket
    const size_t k = *padded_bucket_;
    const FlatRange mine = layout_.shard(k, dp_.rank());
    if (!mine.empty()) {
      Tensor dst = grads_.slice_elements(mine.begin, {mine.size()});
      ops::copy(dst, staging_.slice_elements(dp_.rank() * layout_.shard_size(k), {mine.size()}));
    }
  }
}

bool GradReducer::padded(size_t k) const { return padded_bucket_ && *padded_bucket_ == k; }

void GradReducer::launch(size_t k) {
  const ops::ProfileScope scope(mode_ == Mode::kAllReduce ? "ddp: all_reduce bucket" : "ddp: reduce_scatter bucket");
  const FlatRange b = layout_.buckets()[k];
  Tensor bucket = grads_.slice_elements(b.begin, {b.size()});
  if (mode_ == Mode::kAllReduce) {
    comm_.launch(fmt::format("all_reduce bucket {} ({} elements)", k, b.size()),
                   [this, bucket](Stream stream) mutable { dp_.all_reduce(bucket, ReduceOp::kSum, stream); });
    return;
  }
  const int64_t s = layout_.shard_size(k);
  if (!padded(k)) {
    Tensor out = grads_.slice_elements(b.begin + dp_.rank() * s, {s});
    comm_.launch(fmt::format("reduce_scatter bucket {} ({} elements)", k, b.size()),
                   [this, bucket, out](Stream stream) mutable {
      dp_.reduce_scatter(bucket, out, ReduceOp::kSum, stream);
    });
    return;
  }
  // dp does not divide this bucket: it is reduced in the staging buffer with zeros after it; finish() copies
  // this rank's part back. The copy in is compute-stream work, so the communication stream waits for it.
  ops::fill(staging_, 0.0f);
  Tensor head = staging_.slice_elements(0, {b.size()});
  ops::copy(head, bucket);
  Tensor out = staging_.slice_elements(dp_.rank() * s, {s});
  comm_.launch(fmt::format("reduce_scatter bucket {} ({} elements, padded)", k, b.size()),
                 [this, out](Stream stream) mutable { dp_.reduce_scatter(staging_, out, ReduceOp::kSum, stream); });
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
    Tensor bucket = flat.slice_elements(b.begin, {b.size()});
    if (!padded(k)) {
      Tensor in = flat.slice_elements(b.begin + dp_.rank() * s, {s});
      gathering_[k] = comm_.launch(fmt::format("all_gather weights bucket {}", k),
                                   [this, in, bucket](Stream stream) mutable { dp_.all_gather(in, bucket, stream); });
      continue;
    }
    if (!gather_staging_.defined() || gather_staging_.dtype() != flat.dtype()) {
      gather_staging_ = ops::zeros({s * layout_.dp()}, flat.dtype(), flat.device());
    }
    const FlatRange mine = layout_.shard(k, dp_.rank());
    Tensor in = gather_staging_.slice_elements(dp_.rank() * s, {s});
    if (!mine.empty()) {
      Tensor dst = in.slice_elements(0, {mine.size()});
      ops::copy(dst, flat.slice_elements(mine.begin, {mine.size()}));
    }
    Tensor staging = gather_staging_;
    gathering_[k] = comm_.launch(fmt::format("all_gather weights bucket {} (padded)", k),
                                 [this, in, staging](Stream stream) mutable { dp_.all_gather(in, staging, stream); });
  }
  if (wait) wait_all_gathered();
}

void GradReducer::wait_gathered(FlatRange r) {
  for (size_t k = 0; k < gathering_.size(); ++k) {
    const FlatRange b = layout_.buckets()[k];
    if (!gathering_[k] || b.end <= r.begin || b.begin >= r.end) continue;
    comm_.wait(*gathering_[k]);
    gathering_[k].reset();
    if (padded(k)) finish_padded_gather();
  }
}

void GradReducer::finish_padded_gather() {
  const FlatRange b = layout_.buckets()[*padded_bucket_];
  Tensor bucket = gathered_flat_.slice_elements(b.begin, {b.size()});
  ops::copy(bucket, gather_staging_.slice_elements(0, {b.size()}));
}

}  // namespace primus
