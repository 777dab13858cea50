// Where a rank's collectives run beside its compute: the device's communication stream, or for a host communicator
// (Gloo) a thread of its own. Each collective is queued after the compute work queued so far (the data it reads is
// ready) and returns a ticket; compute that needs the result waits for the ticket, so everything launched before
// that point overlaps with compute. Buffers a collective still uses are freed through release_after_use.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"

namespace primus {

// Runs tasks on a thread of its own, in order: the host backend's communication stream. wait(n) returns when the
// first n submitted tasks are done and rethrows the first failure.
class HostCommQueue {
 public:
  HostCommQueue();
  ~HostCommQueue();
  HostCommQueue(const HostCommQueue&) = delete;
  HostCommQueue& operator=(const HostCommQueue&) = delete;

  // Returns the task's number, 1 for the first.
  uint64_t submit(std::function<void()> task);
  void wait(uint64_t number);
  void wait_all();
  bool done(uint64_t number);

 private:
  void run();
  void rethrow_locked();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

class CommStream {
 public:
  // A collective's place in the queue: a task number on the host, an event on a device.
  struct Ticket {
    uint64_t host = 0;
    std::shared_ptr<DeviceEvent> event;
  };

  explicit CommStream(Device device);
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `collective` (given the stream to run on) after the compute work queued so far. `name` labels it on a
  // profile's communication track.
  Ticket launch(std::string name, std::function<void(Stream)> collective);
  // Compute work queued from now on (and, for the host, the caller) waits for the ticket's collective.
  void wait(const Ticket& ticket);
  // ... for every collective launched so far.
  void wait_all();
  // Frees `t`'s whole storage once the collectives launched so far no longer use it (at once on a device, whose
  // allocator holds the block back; on the host when they are done).
  void release_after_use(const Tensor& t);
  // Before `t`'s storage is materialized again: a release still pending for it is dropped (the storage is kept),
  // after waiting for the collectives that use it.
  void reclaim(const Tensor& t);

 private:
  void release_finished();

  Device device_;
  std::unique_ptr<HostCommQueue> host_;  // host communicators only
  struct PendingRelease {
    uint64_t after = 0;  // host task number
    Tensor tensor;
  };
  std::vector<PendingRelease> pending_;
};

}  // namespace primus
