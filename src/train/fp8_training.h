// fp8 training (docs/fp8.md, issue 15): a config's recipe, the model's Linear modules put on fp8 GEMMs, and the
// scaling state's step end. The output layer, the router, the experts' grouped GEMMs, attention, norms, the loss and
// the optimizer stay in the compute dtype; the layers of first_last_layers_bf16 keep their plain Linear modules.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "layers/fp8_scaling.h"
#include "models/model.h"
#include "parallel/data_parallel.h"
#include "parallel/parallel_dims.h"

namespace primus {

// The recipe the keys describe (validated by the config loader).
Fp8Recipe fp8_recipe(const TrainingArgs& t);

// Why fp8 cannot run under this layout yet (UsageError text naming the key), or "" when it can.
std::string fp8_layout_refusal(const TrainingArgs& t);

// The transformer layer index in a module or parameter name "model.layers.{i}.…", or -1.
int64_t transformer_layer_index(const std::string& name);

// Whether a module or parameter named "model.layers.{i}.…" belongs to a layer enable_fp8 puts on fp8 GEMMs: a
// transformer layer outside first_last_layers_bf16 (multi-token prediction's, numbered from num_layers, excepted).
bool in_fp8_layer(const std::string& name, int64_t num_layers, const TrainingArgs& t);

// With fp8_format set: every Linear module of the transformer layers outside the bf16 ones becomes an Fp8Linear
// sharing the returned state; null when fp8 is off. Under tensor or context parallelism (`groups`) tensorwise
// amaxes are combined over those ranks at each quantisation. Call after weights_ready (FSDP rebinds the modules)
// and before the first step. Throws UsageError for a layout fp8_layout_refusal names.
std::shared_ptr<Fp8Scaling> enable_fp8(Model& model, const TrainingArgs& t, Device device,
                                       const ProcessGroups& groups);

// After enable_fp8, on a resumed run: the checkpoint's delayed-scaling state (empty when it has none: a bf16
// checkpoint, or a current-scaling recipe) set into `scaling`, or why it is not, logged. RuntimeError when the
// checkpoint's tensors or window lengths differ from this run's. A pipeline stage (not `whole_model`) takes the
// records of its own tensors by name (a checkpoint holds every stage's, whatever layout wrote it).
void restore_fp8_scaling(Fp8Scaling* scaling, const std::vector<Fp8ScalingRecord>& records, bool resumed,
                         bool whole_model);

// What a checkpoint stores: the delayed-scaling state of every stage's tensors, in stage order (gathered over `pp`,
// this rank's pipeline group; the rank's own at pp 1). Collective over pp.
std::vector<Fp8ScalingRecord> fp8_records_of_all_stages(const Fp8Scaling& scaling, Communicator& pp);

// The end of an optimizer step: the delayed recipe's amaxes combined over the data-, context- and tensor-parallel
// ranks (DataParallel::max_in_place) and its next scales set (nothing for the current-scaling recipes). Collective
// over those groups.
void fp8_end_step(Fp8Scaling* scaling, DataParallel& dp);

}  // namespace primus
