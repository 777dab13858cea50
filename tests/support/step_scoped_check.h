// A model trained with a single rank's step-scoped buffers (parallel/unit_residency.h, driven as train_step drives
// it) against a twin with the flat buffers, on the CPU and on the GPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "core/rng.h"
#include "models/model.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "parallel/unit_residency.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus::testing {

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = ops::to_device(a, kCpuDevice), y = ops::to_device(b, kCpuDevice);
  return x.nbytes() == y.nbytes() && std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// Three AdamW steps of `micro_batches` micro-batches each, fresh random tokens every step: the same losses and
// gradient norms as the flat buffers' twin and, at the end, the same weights, bit for bit (the same kernels run on the
// same values in the same order; no clipping, whose factor would come from sums taken in another order). And the
// buffers' residency at the step's turns: after the first forward no gradient of a block is allocated; after the last
// backward every gradient is and, in mixed precision, no compute copy; after the update the reverse.
inline void expect_step_scoped_buffers_match_flat(const ModelArgs& args, Device device, DType dtype,
                                                  int micro_batches) {
  constexpr int64_t kSeq = 32;
  const std::unique_ptr<Model> flat = make_model(args, kSeq, device, dtype);
  const std::unique_ptr<Model> scoped = make_model(args, kSeq, device, dtype);
  for (Model* m : {flat.get(), scoped.get()}) {
    m->params().initialize(31);
    m->weights_changed();
  }
  const AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  AdamW flat_optimizer(flat->params(), config);
  AdamW scoped_optimizer(scoped->params(), config);
  UnitResidency residency(scoped->params(), scoped->param_units(), scoped->expert_weight_ranges(), dtype);
  scoped->bind_units(residency.take_buffers());
  scoped->set_param_hooks(&residency);
  const std::vector<FlatRange> units = scoped->param_units();
  auto in_block = [&](size_t piece) {
    const int64_t begin = residency.pieces()[piece].begin;
    return begin >= units.front().end && begin < units.back().begin;
  };
  const size_t pieces = residency.pieces().size();
  ASSERT_GT(pieces, units.size() - 1);  // at least the units (more with experts cut out)
  Rng rng(5);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    flat->params().zero_grads();
    residency.begin_step();
    double flat_loss = 0.0, scoped_loss = 0.0;
    for (int mb = 0; mb < micro_batches; ++mb) {
      const Tensor tokens = random_ids({2, kSeq}, args.vocab_size, rng);
      const Tensor labels = random_ids({2, kSeq}, args.vocab_size, rng);
      const float scale = 1.0f / static_cast<float>(2 * kSeq * micro_batches);
      flat_loss += train_micro_batch(*flat, tokens, labels, scale).loss_sum;
      Tensor loss_sum = ops::zeros({1}, DType::kF32, device);
      const std::unique_ptr<MicroBatchContext> ctx = scoped->forward(
          ops::to_device(tokens, device), ops::to_device(labels, device), scale, loss_sum, PackedSequence{});
      if (mb == 0) {
        for (size_t p = 0; p < pieces; ++p) {
          EXPECT_FALSE(in_block(p) && residency.grads_resident(p)) << "piece " << p << " after the first forward";
        }
      }
      residency.before_step_backward(mb + 1 == micro_batches);
      scoped->backward(*ctx);
      scoped_loss += static_cast<double>(ops::to_device(loss_sum, kCpuDevice).f32()[0]);
    }
    EXPECT_EQ(flat_loss, scoped_loss);
    for (size_t p = 0; p < pieces; ++p) {
      EXPECT_TRUE(residency.grads_resident(p)) << "piece " << p << " after the last backward";
      EXPECT_FALSE(dtype != DType::kF32 && residency.compute_resident(p)) << "piece " << p << " after backward";
    }
    const double flat_norm = std::sqrt(ops::sum_squares(flat->params().flat_grads()));
    const double scoped_norm = std::sqrt(residency.grad_sum_squares());
    EXPECT_NEAR(flat_norm, scoped_norm, 1e-6 * flat_norm);
    const double lr = 1e-2;
    flat_optimizer.step(flat->params(), lr, 1.0, flat->compute_weights());
    scoped_optimizer.begin_step();
    residency.update_pieces([&](FlatRange range, const Tensor& grads, const Tensor& compute) {
      scoped_optimizer.update(scoped->params(), range, grads, compute, lr);
    });
    for (size_t p = 0; p < pieces; ++p) {
      EXPECT_FALSE(residency.grads_resident(p)) << "piece " << p << " after the update";
      EXPECT_TRUE(residency.compute_resident(p)) << "piece " << p << " after the update";
    }
  }
  EXPECT_TRUE(same_bytes(flat->params().flat_params(), scoped->params().flat_params()));
  EXPECT_TRUE(same_bytes(flat_optimizer.exp_avg_sq(), scoped_optimizer.exp_avg_sq()));
}

}  // namespace primus::testing
