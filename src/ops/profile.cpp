#include "ops/profile.h"
#include "ops/scope_tracking.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/file_io.h"

namespace primus::ops {

namespace {

using Clock = std::chrono::steady_clock;

struct ScopeRecord {
  std::string name;
  int depth = 0;
  Clock::time_point host_begin, host_end;
  std::unique_ptr<DeviceMark> device_begin, device_end;
};

struct Span {
  std::string track, name;
  Clock::time_point begin, end;
};

struct TraceState {
  std::atomic<bool> active = false;
  Device device = kCpuDevice;
  Backend* backend = nullptr;
  Clock::time_point host_start;
  std::unique_ptr<DeviceMark> device_start;
  std::vector<ScopeRecord> records;
  int depth = 0;
  std::mutex spans_mutex;  // add_span comes from other threads
  std::vector<Span> spans;
};

TraceState& trace() {
  static TraceState state;
  return state;
}

// The GPU backend's NVTX ranges, when a GPU backend has started (never starts one).
Backend* range_backend() { return started_backend(DeviceType::kCuda); }

double micros(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// Every scope open on this thread, outermost first, while tracked.
std::atomic<bool> tracking_scopes = false;
thread_local std::vector<std::string> open_scope_names;

}  // namespace

void track_open_scopes() { tracking_scopes = true; }

std::string open_scopes() {
  std::string path;
  for (const std::string& name : open_scope_names) path += (path.empty() ? "" : " / ") + name;
  return path;
}

ProfileScope::ProfileScope(std::string name) {
  if (Backend* b = range_backend()) b->range_push(name.c_str());
  if (tracking_scopes) open_scope_names.push_back(name);
  TraceState& t = trace();
  if (!t.active) return;
  ScopeRecord r;
  r.name = std::move(name);
  r.depth = t.depth++;
  r.host_begin = Clock::now();
  r.device_begin = t.backend->mark();
  record_ = static_cast<int64_t>(t.records.size());
  t.records.push_back(std::move(r));
}

ProfileScope::~ProfileScope() {
  if (Backend* b = range_backend()) b->range_pop();
  if (tracking_scopes && !open_scope_names.empty()) open_scope_names.pop_back();
  TraceState& t = trace();
  if (record_ < 0 || !t.active || record_ >= static_cast<int64_t>(t.records.size())) return;
  ScopeRecord& r = t.records[static_cast<size_t>(record_)];
  r.device_end = t.backend->mark();
  r.host_end = Clock::now();
  --t.depth;
}

void Trace::start(Device device) {
  TraceState& t = trace();
  PRIMUS_CHECK(!t.active, "[profile] a trace is already recording");
  t.records.clear();
  t.depth = 0;
  {
    std::lock_guard lock(t.spans_mutex);
    t.spans.clear();
  }
  t.device = device;
  t.backend = &backend_for(device);
  t.host_start = Clock::now();
  t.device_start = t.backend->mark();
  t.active = true;
}

bool Trace::active() { return trace().active; }

int64_t Trace::stop_and_write(const std::string& path) {
  TraceState& t = trace();
  PRIMUS_CHECK(t.active, "[profile] no trace is recording");
  t.active = false;
  nlohmann::json events = nlohmann::json::array();
  const auto track = [&](int pid, const std::string& name) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}});
  };
  track(1, "host (ops issued)");
  track(2, t.device.str() + " (ops ran)");
  int64_t written = 0;
  for (const ScopeRecord& r : t.records) {
    if (!r.device_end) continue;  // still open when the trace stopped
    const nlohmann::json args = {{"depth", r.depth}};
    events.push_back({{"name", r.name}, {"ph", "X"}, {"pid", 1}, {"tid", 0},
                      {"ts", micros(t.host_start, r.host_begin)}, {"dur", micros(r.host_begin, r.host_end)},
                      {"args", args}});
    // Device times count from the mark queued when the trace started, placed at the host's start time.
    const double begin = 1000.0 * t.backend->elapsed_ms(*t.device_start, *r.device_begin);
    const double end = 1000.0 * t.backend->elapsed_ms(*t.device_start, *r.device_end);
    events.push_back({{"name", r.name}, {"ph", "X"}, {"pid", 2}, {"tid", 0}, {"ts", begin},
                      {"dur", std::max(0.0, end - begin)}, {"args", args}});
    ++written;
  }
  {
    std::lock_guard lock(t.spans_mutex);
    std::map<std::string, int> track_pids;
    for (const Span& span : t.spans) {
      auto [it, added] = track_pids.emplace(span.track, 3 + static_cast<int>(track_pids.size()));
      if (added) track(it->second, span.track);
      events.push_back({{"name", span.name}, {"ph", "X"}, {"pid", it->second}, {"tid", 0},
                        {"ts", micros(t.host_start, span.begin)}, {"dur", micros(span.begin, span.end)}});
      ++written;
    }
    t.spans.clear();
  }
  // Where ts 0 lies on the host's monotonic clock (µs): the ranks of one host share that clock, so their traces can
  // be laid side by side (tools/pipeline_bubble.py measures a pipeline flush across the stages so).
  const nlohmann::json other = {
      {"host_monotonic_origin_us",
       fmt::format("{}", std::chrono::duration_cast<std::chrono::microseconds>(t.host_start.time_since_epoch())
                             .count())}};
  const nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", other}};
  write_file_atomic(path, doc.dump());
  t.records.clear();
  t.device_start.reset();
  t.backend = nullptr;
  return written;
}

void Trace::add_span(const std::string& track, std::string name, Clock::time_point begin, Clock::time_point end) {
  TraceState& t = trace();
  if (!t.active) return;
  std::lock_guard lock(t.spans_mutex);
  t.spans.push_back({track, std::move(name), begin, end});
}

}  // namespace primus::ops
