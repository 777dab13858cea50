#include "parallel/comm_stream.h"

#include <algorithm>
#include <chrono>

#include "ops/profile.h"

namespace primus {

HostCommQueue::HostCommQueue() : thread_([this] { run(); }) {}

HostCommQueue::~HostCommQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

uint64_t HostCommQueue::submit(std::function<void()> task) {
  uint64_t number = 0;
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
    number = ++submitted_;
  }
  changed_.notify_all();
  return number;
}

void HostCommQueue::rethrow_locked() {
  if (!error_) return;
  std::exception_ptr error = error_;
  error_ = nullptr;
  std::rethrow_exception(error);
}

void HostCommQueue::wait(uint64_t number) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return completed_ >= number; });
  rethrow_locked();
}

void HostCommQueue::wait_all() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return completed_ >= submitted_; });
  rethrow_locked();
}

bool HostCommQueue::done(uint64_t number) {
  std::lock_guard lock(mutex_);
  return completed_ >= number;
}

void HostCommQueue::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping with nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    const bool skip = error_ != nullptr;  // after a failure the rest would only wait on a broken peer
    lock.unlock();
    try {
      if (!skip) task();
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    ++completed_;
    changed_.notify_all();
  }
}

CommStream::CommStream(Device device) : device_(device) {
  if (device.is_cpu()) host_ = std::make_unique<HostCommQueue>();
}

CommStream::Ticket CommStream::launch(std::string name, std::function<void(Stream)> collective) {
  if (host_) {
    release_finished();
    Ticket ticket;
    ticket.host = host_->submit([name = std::move(name), collective = std::move(collective)] {
      const auto begin = std::chrono::steady_clock::now();
      collective(Stream{});
      ops::Trace::add_span("communication (gloo thread)", name, begin, std::chrono::steady_clock::now());
    });
    return ticket;
  }
  // The communication stream waits for the compute work queued so far (the data the collective reads), then the
  // collective is queued on it.
  Backend& backend = backend_for(device_);
  const Stream comm = backend.stream(StreamKind::kComm);
  const std::unique_ptr<DeviceEvent> produced = backend.record_event(backend.stream(StreamKind::kCompute));
  backend.wait_event(comm, *produced);
  collective(comm);
  Ticket ticket;
  ticket.event = backend.record_event(comm);
  return ticket;
}

void CommStream::wait(const Ticket& ticket) {
  if (host_) {
    host_->wait(ticket.host);
    release_finished();
    return;
  }
  if (ticket.event) backend_for(device_).wait_event(backend_for(device_).stream(StreamKind::kCompute), *ticket.event);
}

void CommStream::wait_all() {
  if (host_) {
    host_->wait_all();
    release_finished();
    return;
  }
  Backend& backend = backend_for(device_);
  const std::unique_ptr<DeviceEvent> done = backend.record_event(backend.stream(StreamKind::kComm));
  backend.wait_event(backend.stream(StreamKind::kCompute), *done);
}

void CommStream::release_after_use(const Tensor& t) {
  if (!host_) {
    Backend& backend = backend_for(device_);
    backend.record_stream(t, backend.stream(StreamKind::kComm));
    t.release_storage();
    return;
  }
  reclaim(t);  // one pending release per storage
  // An empty task queued behind the collectives launched so far marks when they are all done.
  pending_.push_back({host_->submit([] {}), t});
  release_finished();
}

void CommStream::reclaim(const Tensor& t) {
  if (!host_) return;  // a device's releases are never pending
  auto same = [&](const PendingRelease& p) { return p.tensor.shares_storage(t); };
  for (const PendingRelease& p : pending_) {
    if (same(p)) host_->wait(p.after);
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), same), pending_.end());
}

void CommStream::release_finished() {
  auto finished = [&](const PendingRelease& p) {
    if (!host_->done(p.after)) return false;
    p.tensor.release_storage();
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), finished), pending_.end());
}

}  // namespace primus
