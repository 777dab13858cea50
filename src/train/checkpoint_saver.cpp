#include "train/checkpoint_saver.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "checkpoint/sharded_checkpoint.h"
#include "ops/ops.h"

namespace primus {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct CheckpointSaver::InFlight {
  std::unique_ptr<CheckpointSave> save;
  Clock::time_point start;
  double blocked_s = 0.0;  // training's wait: the whole save when synchronous, the snapshot when asynchronous
  std::thread writer;
  std::atomic<bool> written{false};
};

CheckpointSaver::CheckpointSaver(const Model& model, const AdamW& optimizer, DataParallel& dp,
                                 CheckpointSaverOptions options)
    : model_(model), optimizer_(optimizer), dp_(dp), options_(std::move(options)) {
  if (options_.async_save) {
    const Clock::time_point start = Clock::now();
    snapshot_.reserve(dp_.checkpoint_ranges(), model_.params().flat_params().device());
    spdlog::info("async_save: {:.2f} GB of {} host memory for checkpoint snapshots ({:.1f} s)",
                 static_cast<double>(snapshot_.bytes()) / 1e9,
                 model_.params().flat_params().device().is_cpu() ? "" : "pinned", seconds_since(start));
  }
}

CheckpointSaver::~CheckpointSaver() {
  if (in_flight_ && in_flight_->writer.joinable()) in_flight_->writer.join();
}

void CheckpointSaver::save(const TrainerState& state) {
  // A save still writing holds the snapshot buffer: training waits for it, and that wait counts as this save's.
  const Clock::time_point called = Clock::now();
  wait();
  auto flight = std::make_unique<InFlight>();
  flight->start = Clock::now();
  dp_.wait_for_communication();  // the save's collectives (and the state it copies) come after every queued one
  flight->save = std::make_unique<CheckpointSave>(options_.save_dir, model_, dp_.checkpoint_ranges(), &dp_.job(),
                                                  state, options_.config_yaml);
  if (!options_.async_save) {
    flight->save->write(live_state(model_.params(), optimizer_), options_.progress);
    flight->written = true;
    in_flight_ = std::move(flight);
    commit();
    return;
  }
  snapshot_.take(dp_.checkpoint_ranges(), live_state(model_.params(), optimizer_),
                 model_.params().flat_params().device());
  flight->blocked_s = seconds_since(called);
  InFlight* f = flight.get();
  f->writer = std::thread([this, f] {
    f->save->write(snapshot_.state());
    f->written = true;
  });
  const double previous_s = std::chrono::duration<double>(f->start - called).count();
  spdlog::info("checkpoint {}: {:.2f} GB copied to the host in {:.2f} s{}; writing in the background",
               checkpoint_dir_name(state.iteration), static_cast<double>(snapshot_.bytes()) / 1e9,
               seconds_since(f->start),
               previous_s >= 0.05 ? fmt::format(" after waiting {:.1f} s for the previous save to be written (the "
                                                "disk is slower than save_interval needs)",
                                                previous_s)
                                  : "");
  in_flight_ = std::move(flight);
}

void CheckpointSaver::poll() {
  if (!in_flight_) return;
  if (dp_.any(!in_flight_->written)) return;  // some rank is still writing
  commit();
}

void CheckpointSaver::wait() {
  if (!in_flight_) return;
  commit();
}

void CheckpointSaver::commit() {
  std::unique_ptr<InFlight> flight = std::move(in_flight_);
  if (flight->writer.joinable()) flight->writer.join();
  const Clock::time_point commit_start = Clock::now();
  const int64_t bytes = flight->save->finish();
  const double total_s = seconds_since(flight->start);
  const double mb = static_cast<double>(bytes) / 1e6;
  if (options_.async_save) {
    spdlog::info("saved checkpoint {} ({:.1f} MB written in {:.1f} s in the background, {:.0f} MB/s; training "
                 "waited {:.2f} s)",
                 flight->save->checkpoint_dir(), mb, total_s, mb / std::max(total_s, 1e-9),
                 flight->blocked_s + seconds_since(commit_start));
  } else {
    spdlog::info("saved checkpoint {} ({:.1f} MB in {:.1f} s, {:.0f} MB/s)", flight->save->checkpoint_dir(), mb,
                 total_s, mb / std::max(total_s, 1e-9));
  }
  if (dp_.job().rank() == 0) {
    const TrainerState& state = flight->save->state();
    const std::vector<std::string> removed = apply_retention(options_.save_dir, state.iteration, options_.retention);
    if (!removed.empty()) {
      spdlog::info("keep_latest_k {}: removed {}", options_.retention.keep_latest_k, fmt::join(removed, ", "));
    }
  }
}

}  // namespace primus
