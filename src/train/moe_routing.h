// The MoE figures of a training step over the whole global batch, from each rank's routing tallies.
#pragma once

#include "models/model.h"
#include "observe/metric_sinks.h"
#include "parallel/data_parallel.h"

namespace primus {

struct Pipeline;  // train/pipeline_step.h

// Every MoE layer's routing in the last training step (Model::moe_routing of each rank) summed over the data-parallel
// group (dp × cp, whose ranks route different tokens) and, with an active pipeline, over the stages (which hold
// different layers), so every rank returns the same figures for all MoE layers. Collective over those groups: every
// rank calls it on the same steps. Counts are summed in f32, exact up to 2^24 routing entries per expert.
MoeMetrics reduce_moe_routing(const Model& model, DataParallel& dp, const Pipeline* pipeline);

// Aux-loss-free balancing (DeepSeek-V3, Megatron's moe_router_enable_expert_bias): each MoE layer this rank holds
// moves its expert bias by rate × sign(mean load − the expert's load) of `routing` (the global batch's, so every
// rank holding the layer moves it alike). The bias is an fp32 master weight the optimizer leaves alone.
void update_expert_bias(Model& model, const MoeMetrics& routing, double rate);

}  // namespace primus
