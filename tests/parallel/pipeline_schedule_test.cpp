// The pipeline schedules (parallel/pipeline_schedule.h) run together, every stage's ticks side by side, in a
// simulator that knows nothing of how they were made: every send is received by its peer in the same tick with the
// same tag, a computation only uses what arrived in an earlier tick, each (micro-batch, chunk) runs its forward once
// and then its backward once, 1F1B keeps at most `stages` micro-batches in flight on a stage, and the bubble (idle
// ticks) is what the formulas say. Bad layouts exit 2 (UsageError) naming the keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

namespace primus {
namespace {

struct Simulation {
  size_t ticks = 0;
  std::vector<int> max_in_flight;  // per stage: forwards run minus backwards run, at most
  std::vector<int> busy;           // per stage: ticks with a computation
};

// Runs `schedule` and checks every rule; returns what it saw.
Simulation simulate(const PipelineSchedule& schedule) {
  const PipelineScheduleSpec& spec = schedule.spec;
  const int p = spec.stages, v = spec.chunks, m = spec.micro_batches, last_virtual = p * v - 1;
  Simulation sim;
  sim.max_in_flight.assign(p, 0);
  sim.busy.assign(p, 0);
  for (int s = 1; s < p; ++s) EXPECT_EQ(schedule.stages[s].size(), schedule.stages[0].size()) << "stage " << s;
  sim.ticks = schedule.stages[0].size();
  // (micro-batch, consumer virtual stage, gradient) held by each stage, delivered at the end of a tick.
  std::vector<std::set<std::tuple<int, int, bool>>> held(p);
  std::vector<std::map<std::pair<int, int>, int>> forwards(p), backwards(p);  // (mb, chunk) -> times run
  std::vector<int> in_flight(p, 0);
  for (size_t tick = 0; tick < sim.ticks; ++tick) {
    std::vector<std::tuple<int, int, int, bool>> arriving;
    // Sends and receives of this tick must pair up one to one, by (sender, receiver, tag).
    std::multiset<std::tuple<int, int, uint32_t>> sent, received;
    for (int s = 0; s < p; ++s) {
      const PipelineTick& t = schedule.stages[s][tick];
      for (const PipelineTransfer& x : t.sends) sent.insert({s, x.peer, x.tag});
      for (const PipelineTransfer& x : t.recvs) received.insert({x.peer, s, x.tag});
      EXPECT_LE(t.sends.size(), t.compute ? 1u : 0u) << "stage " << s << " tick " << tick;
      if (!t.compute) continue;
      ++sim.busy[s];
      const PipelineCompute c = *t.compute;
      const int k = c.chunk * p + s;
      const std::pair<int, int> key{c.micro_batch, c.chunk};
      if (!c.backward) {
        EXPECT_EQ(forwards[s][key]++, 0) << "second forward of micro-batch " << c.micro_batch << " chunk " << c.chunk;
        if (k > 0) {
          EXPECT_EQ(held[s].erase({c.micro_batch, k, false}), 1u)
              << "stage " << s << " tick " << tick << ": forward of mb " << c.micro_batch << " chunk " << c.chunk
              << " before its input arrived";
        }
        sim.max_in_flight[s] = std::max(sim.max_in_flight[s], ++in_flight[s]);
        if (k < last_virtual) {
          EXPECT_EQ(t.sends.size(), 1u);
          if (!t.sends.empty()) {
            EXPECT_EQ(t.sends[0].peer, (k + 1) % p);
            arriving.emplace_back(t.sends[0].peer, c.micro_batch, k + 1, false);
          }
        }
      } else {
        EXPECT_EQ(forwards[s][key], 1) << "backward of mb " << c.micro_batch << " chunk " << c.chunk
                                       << " before its forward";
        EXPECT_EQ(backwards[s][key]++, 0) << "second backward";
        if (k < last_virtual) {
          EXPECT_EQ(held[s].erase({c.micro_batch, k, true}), 1u)
              << "stage " << s << " tick " << tick << ": backward of mb " << c.micro_batch << " chunk " << c.chunk
              << " before its output's gradient arrived";
        }
        --in_flight[s];
        if (k > 0) {
          EXPECT_EQ(t.sends.size(), 1u);
          if (!t.sends.empty()) {
            EXPECT_EQ(t.sends[0].peer, (k - 1) % p);
            arriving.emplace_back(t.sends[0].peer, c.micro_batch, k - 1, true);
          }
        }
      }
    }
    EXPECT_EQ(sent, received) << "tick " << tick << ": sends and receives do not pair up";
    for (const auto& [s, mb, consumer, gradient] : arriving) held[s].insert({mb, consumer, gradient});
  }
  for (int s = 0; s < p; ++s) {
    EXPECT_TRUE(held[s].empty()) << "stage " << s << ": transfers never used";
    for (int mb = 0; mb < m; ++mb) {
      for (int c = 0; c < v; ++c) {
        const std::pair<int, int> key{mb, c};
        EXPECT_EQ(forwards[s][key], 1) << "stage " << s << " mb " << mb << " chunk " << c;
        EXPECT_EQ(backwards[s][key], spec.forward_only ? 0 : 1) << "stage " << s << " mb " << mb << " chunk " << c;
      }
    }
  }
  return sim;
}

TEST(PipelineSchedule, OneFOneBRunsEveryLayoutWithinStagesInFlight) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 9; ++m) {
      SCOPED_TRACE(::testing::Message() << p << " stages, " << m << " micro-batches");
      const Simulation sim = simulate(make_pipeline_schedule({p, 1, m, false}));
      for (int s = 0; s < p; ++s) {
        EXPECT_LE(sim.max_in_flight[s], p - s) << "stage " << s;
        EXPECT_EQ(sim.busy[s], 2 * m);
      }
      // Each stage idles 2(p − 1) ticks: the bubble (p − 1) / m of the ideal 2m ticks, with the forward and the
      // backward of a micro-batch one tick each.
      EXPECT_EQ(sim.ticks, static_cast<size_t>(2 * (m + p - 1)));
    }
  }
}

TEST(PipelineSchedule, InterleavedRunsEveryLayoutWithASmallerBubble) {
  for (int p = 2; p <= 4; ++p) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = p; m <= 3 * p; m += p) {
        SCOPED_TRACE(::testing::Message() << p << " stages, " << v << " chunks, " << m << " micro-batches");
        const Simulation sim = simulate(make_pipeline_schedule({p, v, m, false}));
        for (int s = 0; s < p; ++s) EXPECT_EQ(sim.busy[s], 2 * m * v);
        // Ticks of one chunk each: the 1F1B pipeline of the same layers takes v · 2(m + p − 1) of them. Interleaving
        // cuts the bubble towards (1/v)(p − 1)/m: strictly fewer ticks, and at most 2(m·v + p − 1) + 2(p − 1) ticks
        // (the lockstep's one tick of latency per hop back from the last stage to the first).
        EXPECT_LT(sim.ticks, static_cast<size_t>(v * 2 * (m + p - 1)));
        EXPECT_LE(sim.ticks, static_cast<size_t>(2 * (m * v + p - 1) + 2 * (p - 1)));
      }
    }
  }
}

// Each stage runs its compute order (pipeline_compute_order) as train/pipeline_step.cpp does, every computation as soon
// as the stage is free and its input has arrived, ticks ignored; transfers take no time, a chunk's forward 1/v and its
// backward 2/v. Returns the bubble: (the last finish − the m · 3 of compute a stage does) / that compute.
double as_soon_as_ready_bubble(const PipelineScheduleSpec& spec) {
  const int p = spec.stages, v = spec.chunks, last_virtual = p * v - 1;
  std::vector<std::vector<PipelineCompute>> order(p);
  for (int s = 0; s < p; ++s) order[s] = pipeline_compute_order(spec, s);
  std::map<std::tuple<int, int, bool>, double> finished;  // (micro-batch, virtual stage, backward) -> time
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s) {
      for (; next[s] < order[s].size(); ++next[s], moved = true) {
        const PipelineCompute c = order[s][next[s]];
        const int k = c.chunk * p + s;
        double ready = 0.0;
        if (c.backward || k > 0) {  // the input: the activation from k − 1, or the gradient from k + 1 (the loss: k's)
          const auto input = !c.backward        ? std::tuple{c.micro_batch, k - 1, false}
                             : k < last_virtual ? std::tuple{c.micro_batch, k + 1, true}
                                                : std::tuple{c.micro_batch, k, false};
          const auto it = finished.find(input);
          if (it == finished.end()) break;  // not yet computed: the stage waits
          ready = it->second;
        }
        free_at[s] = std::max(free_at[s], ready) + (c.backward ? 2.0 : 1.0) / v;
        finished[{c.micro_batch, k, c.backward}] = free_at[s];
      }
    }
  }
  for (int s = 0; s < p; ++s) EXPECT_EQ(next[s], order[s].size()) << "stage " << s << " never finished: a deadlock";
  const double compute = 3.0 * spec.micro_batches;
  return (*std::max_element(free_at.begin(), free_at.end()) - compute) / compute;
}

// The compute orders alone, without the ticks' lockstep, have exactly the formulas' bubble: (p − 1)/m for 1F1B and
// (p − 1)/(v·m) interleaved. A measured bubble above them is the run's (transfers, stages of unequal compute, noise),
// not the order's (docs/perf/pipeline-bubble.md).
TEST(PipelineSchedule, ComputeOrdersRunAsSoonAsReadyHaveTheFormulasBubble) {
  for (int p = 1; p <= 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      for (int m = 1; m <= 12; ++m) {
        if (v > 1 && (p == 1 || m % p != 0)) continue;
        SCOPED_TRACE(::testing::Message() << p << " stages, " << v << " chunks, " << m << " micro-batches");
        EXPECT_NEAR(as_soon_as_ready_bubble({p, v, m, false}), (p - 1.0) / (v * m), 1e-9);
      }
    }
  }
}

TEST(PipelineSchedule, ForwardOnlyRunsEveryForwardOnce) {
  for (const PipelineScheduleSpec spec :
       {PipelineScheduleSpec{2, 1, 3, true}, PipelineScheduleSpec{4, 1, 1, true}, PipelineScheduleSpec{2, 2, 4, true},
        PipelineScheduleSpec{3, 2, 3, true}}) {
    SCOPED_TRACE(describe(spec));
    const Simulation sim = simulate(make_pipeline_schedule(spec));
    EXPECT_EQ(sim.ticks, static_cast<size_t>(spec.micro_batches * spec.chunks + spec.stages - 1));
  }
}

TEST(PipelineSchedule, OneFOneBOrderIsWarmupSteadyCooldown) {
  // Stage 0 of 4 with 6 micro-batches: 3 forwards, then F B alternating, then 3 backwards.
  const std::vector<PipelineCompute> order = pipeline_compute_order({4, 1, 6, false}, 0);
  const std::vector<PipelineCompute> expected{{false, 0, 0}, {false, 1, 0}, {false, 2, 0}, {false, 3, 0},
                                              {true, 0, 0},  {false, 4, 0}, {true, 1, 0},  {false, 5, 0},
                                              {true, 2, 0},  {true, 3, 0},  {true, 4, 0},  {true, 5, 0}};
  EXPECT_EQ(order, expected);
}

TEST(PipelineSchedule, InterleavedNeedsMicroBatchesAMultipleOfTheStages) {
  try {
    make_pipeline_schedule({2, 2, 3, false});
    FAIL() << "3 micro-batches over 2 stages with 2 virtual stages were accepted";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pipeline_model_parallel_size"), std::string::npos) << what;
    EXPECT_NE(what.find("global_batch_size"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(make_pipeline_schedule({2, 1, 3, false}));  // 1F1B takes any number
}

}  // namespace
}  // namespace primus
