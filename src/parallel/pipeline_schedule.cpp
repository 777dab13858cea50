#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"

namespace primus {

namespace {

void check_spec(const PipelineScheduleSpec& s) {
  if (s.stages < 1 || s.chunks < 1 || s.micro_batches < 1) {
    throw UsageError(fmt::format("[pipeline] {} stages, {} chunks per stage and {} micro-batches: each must be >= 1",
                                 s.stages, s.chunks, s.micro_batches));
  }
  if (s.chunks > 1 && s.micro_batches % s.stages != 0) {
    throw UsageError(fmt::format(
        "[config] the interleaved pipeline schedule (num_layers_per_virtual_pipeline_stage or "
        "num_virtual_stages_per_pipeline_rank: {} virtual stages) needs the micro-batches per step ({} = "
        "global_batch_size / (micro_batch_size x data-parallel size)) to be a multiple of "
        "pipeline_model_parallel_size ({})",
        s.chunks, s.micro_batches, s.stages));
  }
}

uint32_t tag_of(const PipelineScheduleSpec& s, int micro_batch, int consumer, bool gradient) {
  const int64_t tag = (static_cast<int64_t>(micro_batch) * s.stages * s.chunks + consumer) * 2 + (gradient ? 1 : 0);
  PRIMUS_CHECK(tag < (int64_t{1} << 24), "[pipeline] {} micro-batches x {} virtual stages exceed the tags", micro_batch,
               s.stages * s.chunks);
  return static_cast<uint32_t>(tag);
}

}  // namespace

std::vector<PipelineCompute> pipeline_compute_order(const PipelineScheduleSpec& s, int stage) {
  check_spec(s);
  PRIMUS_CHECK(stage >= 0 && stage < s.stages, "[pipeline] stage {} of {}", stage, s.stages);
  const int m = s.micro_batches, p = s.stages, v = s.chunks;
  std::vector<PipelineCompute> order;
  if (v == 1) {
    const int warmup = s.forward_only ? m : std::min(p - stage - 1, m);
    for (int i = 0; i < warmup; ++i) order.push_back({false, i, 0});
    if (s.forward_only) return order;
    for (int i = 0; i < m - warmup; ++i) {
      order.push_back({false, warmup + i, 0});
      order.push_back({true, i, 0});
    }
    for (int i = m - warmup; i < m; ++i) order.push_back({true, i, 0});
    return order;
  }
  // Virtual micro-batch j: groups of p micro-batches run through chunk 0, then chunk 1, ... (backward from the last).
  const int total = m * v;
  auto compute_of = [&](int j, bool backward) {
    const int in_group = j % (p * v);
    int chunk = in_group / p;
    if (backward) chunk = v - 1 - chunk;
    return PipelineCompute{backward, (j / (p * v)) * p + in_group % p, chunk};
  };
  const int warmup = s.forward_only ? total : std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  for (int j = 0; j < warmup; ++j) order.push_back(compute_of(j, false));
  if (s.forward_only) return order;
  for (int j = 0; j < total - warmup; ++j) {
    order.push_back(compute_of(warmup + j, false));
    order.push_back(compute_of(j, true));
  }
  for (int j = total - warmup; j < total; ++j) order.push_back(compute_of(j, true));
  return order;
}

PipelineSchedule make_pipeline_schedule(const PipelineScheduleSpec& s) {
  check_spec(s);
  const int p = s.stages, last_virtual = s.stages * s.chunks - 1;
  std::vector<std::vector<PipelineCompute>> orders;
  for (int stage = 0; stage < p; ++stage) orders.push_back(pipeline_compute_order(s, stage));
  PipelineSchedule schedule{s, std::vector<std::vector<PipelineTick>>(p)};
  // What has arrived at each stage by the start of a tick: (micro-batch, consumer virtual stage, gradient); and the
  // forwards each stage has run.
  std::vector<std::set<std::tuple<int, int, bool>>> arrived(p);
  std::vector<std::set<std::pair<int, int>>> forwarded(p);
  std::vector<size_t> next(p, 0);
  auto done = [&] {
    for (int stage = 0; stage < p; ++stage) {
      if (next[stage] < orders[stage].size()) return false;
    }
    return true;
  };
  while (!done()) {
    std::vector<PipelineTick> ticks(p);
    std::vector<std::tuple<int, int, int, bool>> delivered;  // (stage, micro-batch, consumer, gradient)
    bool progressed = false;
    for (int stage = 0; stage < p; ++stage) {
      if (next[stage] >= orders[stage].size()) continue;
      const PipelineCompute c = orders[stage][next[stage]];
      const int k = c.chunk * p + stage;
      bool ready;
      if (!c.backward) {
        ready = k == 0 || arrived[stage].count({c.micro_batch, k, false}) > 0;
      } else {
        ready = forwarded[stage].count({c.micro_batch, c.chunk}) > 0 &&
                (k == last_virtual || arrived[stage].count({c.micro_batch, k, true}) > 0);
      }
      if (!ready) continue;
      progressed = true;
      ++next[stage];
      ticks[stage].compute = c;
      if (!c.backward) forwarded[stage].insert({c.micro_batch, c.chunk});
      const int consumer = c.backward ? k - 1 : k + 1;
      if ((!c.backward && k == last_virtual) || (c.backward && k == 0)) continue;  // nothing goes out
      const int peer = consumer % p;
      const uint32_t tag = tag_of(s, c.micro_batch, consumer, c.backward);
      ticks[stage].sends.push_back({peer, c.micro_batch, c.chunk, c.backward, tag});
      ticks[peer].recvs.push_back({stage, c.micro_batch, consumer / p, c.backward, tag});
      delivered.emplace_back(peer, c.micro_batch, consumer, c.backward);
    }
    if (!progressed) {
      std::string where;
      for (int stage = 0; stage < p; ++stage) {
        if (next[stage] >= orders[stage].size()) continue;
        const PipelineCompute& c = orders[stage][next[stage]];
        where += fmt::format(" stage {} waits to run {} of micro-batch {} chunk {};", stage,
                             c.backward ? "backward" : "forward", c.micro_batch, c.chunk);
      }
      throw RuntimeError(fmt::format("[pipeline] the {} schedule of {} stages and {} micro-batches cannot go on:{}",
                                     describe(s), p, s.micro_batches, where));
    }
    for (const auto& [stage, mb, consumer, gradient] : delivered) arrived[stage].insert({mb, consumer, gradient});
    for (int stage = 0; stage < p; ++stage) schedule.stages[stage].push_back(std::move(ticks[stage]));
  }
  return schedule;
}

std::string describe(const PipelineScheduleSpec& s) {
  if (s.forward_only) return "forward-only";
  if (s.chunks == 1) return "1F1B";
  return fmt::format("interleaved 1F1B ({} virtual stages)", s.chunks);
}

}  // namespace primus
