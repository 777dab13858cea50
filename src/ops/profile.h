// Named scopes around training phases, layers and ops, for profilers.
//
// Every ProfileScope opens an NVTX range on the GPU backend (always, so Nsight Systems shows phase, layer and
// op names). While a Trace records, a scope also keeps its host begin and end times and a device mark at each
// end; Trace::stop_and_write then writes a Chrome trace-event JSON file (Perfetto, chrome://tracing) with two
// tracks: "host" (when the work was issued) and the device (when it ran on the device's stream). Scopes nest as
// they were opened, so ops appear under the layer that ran them. Outside a trace a scope costs one virtual
// call per end and no device work.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace primus::ops {

// The names of the scopes open on this thread, outermost first, joined by " / " ("" when none): where the host is
// in a step, for diagnostics (the memory-peak trace).
std::string open_scopes();

class ProfileScope {
 public:
  explicit ProfileScope(std::string name);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  int64_t record_ = -1;  // index of this scope's record in the active trace, or -1
};

class Trace {
 public:
  // Starts recording scopes with marks on `device`'s queue. One trace at a time.
  static void start(Device device);
  static bool active();
  // Stops recording, waits for the device's marks and writes the trace to `path` (atomically). Returns the
  // number of scopes written.
  static int64_t stop_and_write(const std::string& path);
  // Work that ran on another host thread (the Gloo communication thread's collectives) as one span on a track
  // of its own, so a trace shows it beside the compute it overlapped. Safe from any thread; ignored when no
  // trace records.
  static void add_span(const std::string& track, std::string name, std::chrono::steady_clock::time_point begin,
                       std::chrono::steady_clock::time_point end);
};

}  // namespace primus::ops
