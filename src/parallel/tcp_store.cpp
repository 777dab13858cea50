// The TCP key-value store of store.h: rank 0 runs a server thread (one poll loop over the listening socket
// and every client connection), every rank holds one client connection. Blocking waits are answered by the
// server when the keys arrive or when the waiter's deadline passes, so a client never polls and a timeout
// always says which key was missing.
//
// Wire format (both ends are this file, so integers travel in host byte order):
//   request  u8 op | u32 key bytes | key | op payload
//     kSet   u64 value bytes | value                    reply u8 kOk
//     kGet                                              reply u8 kOk | u64 bytes | value, or u8 kMissing
//     kAdd   i64 delta                                  reply u8 kOk | i64 new value
//     kWait  u64 timeout_ms | u32 more keys | (u32 bytes | key)...   (the request's key is the first)
//                                                       reply u8 kOk, or u8 kTimeout | u32 bytes | missing key
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "parallel/store.h"

namespace primus {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4 };
enum Reply : uint8_t { kOk = 0, kMissing = 1, kTimeout = 2 };

// Keys and values are small (addresses, ids); the limits only stop a corrupt stream from allocating wildly.
constexpr uint32_t kMaxKeyBytes = 1u << 20;
constexpr uint64_t kMaxValueBytes = 1ull << 30;

std::string seconds_str(milliseconds ms) { return fmt::format("{:g} s", static_cast<double>(ms.count()) / 1000.0); }

std::string errno_str(int err) { return std::strerror(err); }

// --- byte buffers -------------------------------------------------------------------------------------------

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}
void put_bytes(std::string& out, const char* data, size_t n) { out.append(data, n); }

// Reads fixed-width fields off the front of a buffer that may not hold a whole message yet.
class Reader {
 public:
  Reader(const std::string& buf) : buf_(buf) {}
  template <typename T>
  bool get(T& value) {
    if (buf_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&value, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_bytes(std::string& out, uint64_t n) {
    if (buf_.size() - pos_ < n) return false;
    out.assign(buf_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& buf_;
  size_t pos_ = 0;
};

// --- sockets ------------------------------------------------------------------------------------------------

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Writes all of `data` to a non-blocking socket, waiting at most `limit` for room. False if the peer is gone.
bool write_all(int fd, const std::string& data, milliseconds limit) {
  size_t done = 0;
  const auto deadline = Clock::now() + limit;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(left.count()));
      continue;
    }
    return false;
  }
  return true;
}

// --- server -------------------------------------------------------------------------------------------------

class StoreServer {
 public:
  explicit StoreServer(int port) {
    listen_fd_ = open_listener(port);
    if (::pipe(wake_) != 0) {
      int err = errno;
      ::close(listen_fd_);
      throw RuntimeError(fmt::format("[distributed] store: pipe() failed: {}", errno_str(err)));
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~StoreServer() {
    char byte = 1;
    // The loop exits when the wake pipe becomes readable; a failed write only means it is already awake.
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &byte, 1);
    thread_.join();
    for (auto& [fd, conn] : conns_) ::close(fd);
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

 private:
  struct Pending {
    int fd;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  // Every interface, IPv6 and IPv4 through one dual-stack socket where the host has IPv6, else IPv4 only.
  static int open_listener(int port) {
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = -1;
    int one = 1, zero = 0;
    if (fd >= 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_addr = in6addr_any;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      if (rc != 0 && errno != EAFNOSUPPORT && errno != EADDRNOTAVAIL) throw_bind_error(fd, port, errno);
      if (rc != 0) ::close(fd);
    }
    if (rc != 0) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) throw RuntimeError(fmt::format("[distributed] store: socket() failed: {}", errno_str(errno)));
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) throw_bind_error(fd, port, errno);
    }
    if (::listen(fd, 1024) != 0) throw_bind_error(fd, port, errno);
    set_nonblocking(fd);
    return fd;
  }

  [[noreturn]] static void throw_bind_error(int fd, int port, int err) {
    ::close(fd);
    std::string hint = err == EADDRINUSE ? " (another process listens there: a running job, or a previous one "
                                           "still ending; choose another MASTER_PORT)"
                                         : "";
    throw RuntimeError(fmt::format("[distributed] store: rank 0 cannot listen on port {} (MASTER_PORT): {}{}", port,
                                   errno_str(err), hint));
  }

  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& [fd, conn] : conns_) fds.push_back({fd, POLLIN, 0});
      int wait_ms = -1;
      if (!pending_.empty()) {
        auto first = std::min_element(pending_.begin(), pending_.end(),
                                      [](const Pending& a, const Pending& b) { return a.deadline < b.deadline; });
        auto left = std::chrono::duration_cast<milliseconds>(first->deadline - Clock::now()).count();
        wait_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 60'000));
      }
      int n = ::poll(fds.data(), fds.size(), wait_ms);
      if (n < 0 && errno != EINTR) return;  // cannot happen with valid descriptors; clients then time out
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) accept_all();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents) read_from(fds[i].fd);
      }
      expire_waits();
    }
  }

  void accept_all() {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      conns_[fd];
    }
  }

  void read_from(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    char chunk[65536];
    for (;;) {
      ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n > 0) {
        it->second.append(chunk, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      drop(fd);  // closed by the client (its process ended) or broken
      return;
    }
    // Handle every complete request in the buffer; a partial one waits for more bytes.
    while (conns_.count(fd)) {
      std::string& buf = conns_[fd];
      std::optional<size_t> used = handle_one(fd, buf);
      if (!used) break;
      if (conns_.count(fd)) conns_[fd].erase(0, *used);
    }
  }

  // Parses and serves one request from the front of `buf`; nullopt when it is not complete yet.
  std::optional<size_t> handle_one(int fd, const std::string& buf) {
    Reader r(buf);
    uint8_t op = 0;
    uint32_t key_bytes = 0;
    std::string key;
    if (!r.get(op) || !r.get(key_bytes)) return std::nullopt;
    if (key_bytes > kMaxKeyBytes) return bad_request(fd);
    if (!r.get_bytes(key, key_bytes)) return std::nullopt;
    std::string reply;
    switch (op) {
      case kSet: {
        uint64_t n = 0;
        std::string value;
        if (!r.get(n)) return std::nullopt;
        if (n > kMaxValueBytes) return bad_request(fd);
        if (!r.get_bytes(value, n)) return std::nullopt;
        data_[key] = std::move(value);
        put(reply, kOk);
        respond(fd, reply);
        wake_waiters();
        return r.pos();
      }
      case kGet: {
        auto it = data_.find(key);
        if (it == data_.end()) {
          put(reply, kMissing);
        } else {
          put(reply, kOk);
          put<uint64_t>(reply, it->second.size());
          put_bytes(reply, it->second.data(), it->second.size());
        }
        respond(fd, reply);
        return r.pos();
      }
      case kAdd: {
        int64_t delta = 0;
        if (!r.get(delta)) return std::nullopt;
        int64_t value = 0;
        if (auto it = data_.find(key); it != data_.end()) value = std::strtoll(it->second.c_str(), nullptr, 10);
        value += delta;
        data_[key] = std::to_string(value);
        put(reply, kOk);
        put(reply, value);
        respond(fd, reply);
        wake_waiters();
        return r.pos();
      }
      case kWait: {
        uint64_t timeout_ms = 0;
        uint32_t more = 0;
        if (!r.get(timeout_ms) || !r.get(more)) return std::nullopt;
        Pending wait{fd, {key}, Clock::now() + milliseconds(timeout_ms)};
        for (uint32_t i = 0; i < more; ++i) {
          uint32_t n = 0;
          std::string k;
          if (!r.get(n)) return std::nullopt;
          if (n > kMaxKeyBytes) return bad_request(fd);
          if (!r.get_bytes(k, n)) return std::nullopt;
          wait.keys.push_back(std::move(k));
        }
        if (!first_missing(wait.keys)) {
          put(reply, kOk);
          respond(fd, reply);
        } else {
          pending_.push_back(std::move(wait));
        }
        return r.pos();
      }
      default:
        return bad_request(fd);
    }
  }

  std::optional<size_t> bad_request(int fd) {
    drop(fd);  // not our protocol (a port scanner, a stray client): forget it
    return std::nullopt;
  }

  const std::string* first_missing(const std::vector<std::string>& keys) const {
    for (const std::string& k : keys) {
      if (!data_.count(k)) return &k;
    }
    return nullptr;
  }

  void wake_waiters() {
    for (size_t i = 0; i < pending_.size();) {
      if (!first_missing(pending_[i].keys)) {
        std::string reply;
        put(reply, kOk);
        int fd = pending_[i].fd;
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        respond(fd, reply);
        i = 0;  // respond may have dropped a connection and its waits
      } else {
        ++i;
      }
    }
  }

  void expire_waits() {
    const auto now = Clock::now();
    for (size_t i = 0; i < pending_.size();) {
      if (pending_[i].deadline <= now) {
        const std::string* missing = first_missing(pending_[i].keys);
        std::string reply;
        put(reply, kTimeout);
        std::string key = missing ? *missing : std::string();
        put<uint32_t>(reply, static_cast<uint32_t>(key.size()));
        put_bytes(reply, key.data(), key.size());
        int fd = pending_[i].fd;
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        respond(fd, reply);
        i = 0;
      } else {
        ++i;
      }
    }
  }

  void respond(int fd, const std::string& reply) {
    if (!write_all(fd, reply, milliseconds(10'000))) drop(fd);
  }

  void drop(int fd) {
    if (!conns_.erase(fd)) return;
    ::close(fd);
    std::erase_if(pending_, [fd](const Pending& p) { return p.fd == fd; });
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  // Only the server thread touches these.
  std::map<int, std::string> conns_;  // fd -> bytes received and not yet handled
  std::map<std::string, std::string> data_;
  std::vector<Pending> pending_;
};

// --- client -------------------------------------------------------------------------------------------------

class TcpStore final : public Store {
 public:
  TcpStore(const std::string& addr, int port, bool serve, milliseconds timeout)
      : addr_(addr), port_(port), timeout_(timeout) {
    if (port < 1 || port > 65535) {
      throw UsageError(fmt::format("[distributed] store: MASTER_PORT={} is not a TCP port (1..65535)", port));
    }
    if (serve) server_ = std::make_unique<StoreServer>(port);
    fd_ = connect_with_retry();
  }

  ~TcpStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void set(const std::string& key, const std::vector<char>& value) override {
    std::string req = request(kSet, key);
    put<uint64_t>(req, value.size());
    put_bytes(req, value.data(), value.size());
    std::lock_guard<std::mutex> lock(mutex_);
    send_request(req, "set", key);
    expect_ok(read_u8(timeout_, "set", key), "set", key);
  }

  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    std::lock_guard<std::mutex> lock(mutex_);
    send_request(request(kGet, key), "get", key);
    uint8_t status = read_u8(timeout_, "get", key);
    if (status != kOk) throw protocol_error("get", key);
    uint64_t n = 0;
    read_exact(&n, sizeof(n), timeout_, "get", key);
    std::vector<char> value(n);
    read_exact(value.data(), n, timeout_, "get", key);
    return value;
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    if (keys.empty()) return;
    std::string req = request(kWait, keys[0]);
    put<uint64_t>(req, static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
    put<uint32_t>(req, static_cast<uint32_t>(keys.size() - 1));
    for (size_t i = 1; i < keys.size(); ++i) {
      put<uint32_t>(req, static_cast<uint32_t>(keys[i].size()));
      put_bytes(req, keys[i].data(), keys[i].size());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    send_request(req, "wait", keys[0]);
    // The server answers at the deadline; the margin covers a slow server, after it the server is gone.
    uint8_t status = read_u8(timeout + milliseconds(10'000), "wait", keys[0]);
    if (status == kOk) return;
    if (status != kTimeout) throw protocol_error("wait", keys[0]);
    uint32_t n = 0;
    read_exact(&n, sizeof(n), timeout_, "wait", keys[0]);
    std::string missing(n, '\0');
    read_exact(missing.data(), n, timeout_, "wait", keys[0]);
    throw RuntimeError(fmt::format("[distributed] rendezvous: timed out after {} waiting for key '{}' ({})",
                                   seconds_str(timeout), missing, where()));
  }

  int64_t add(const std::string& key, int64_t delta) override {
    std::string req = request(kAdd, key);
    put(req, delta);
    std::lock_guard<std::mutex> lock(mutex_);
    send_request(req, "add", key);
    expect_ok(read_u8(timeout_, "add", key), "add", key);
    int64_t value = 0;
    read_exact(&value, sizeof(value), timeout_, "add", key);
    return value;
  }

 private:
  std::string where() const { return fmt::format("MASTER_ADDR={}, MASTER_PORT={}", addr_, port_); }

  static std::string request(Op op, const std::string& key) {
    std::string req;
    put<uint8_t>(req, op);
    put<uint32_t>(req, static_cast<uint32_t>(key.size()));
    put_bytes(req, key.data(), key.size());
    return req;
  }

  // Rank 0 may start after the others (or still be binding): retry refused connections until the timeout.
  int connect_with_retry() {
    const auto deadline = Clock::now() + timeout_;
    std::string last_error = "no attempt";
    milliseconds pause(20);
    const std::string service = std::to_string(port_);
    for (;;) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      int rc = ::getaddrinfo(addr_.c_str(), service.c_str(), &hints, &found);
      if (rc != 0 && rc != EAI_AGAIN) {
        throw UsageError(
            fmt::format("[distributed] rendezvous: MASTER_ADDR={} does not resolve: {}", addr_, gai_strerror(rc)));
      }
      if (rc != 0) last_error = gai_strerror(rc);
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
          last_error = errno_str(errno);
          continue;
        }
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(found);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return fd;
        }
        last_error = errno_str(errno);
        ::close(fd);
      }
      if (found) ::freeaddrinfo(found);
      const auto now = Clock::now();
      if (now >= deadline) {
        throw RuntimeError(
            fmt::format("[distributed] rendezvous: cannot reach the store of rank 0 at {}:{} after {} ({}; is rank 0 "
                        "running and are MASTER_ADDR/MASTER_PORT right? last error: {})",
                        addr_, port_, seconds_str(timeout_), where(), last_error));
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, milliseconds(500));
    }
  }

  void send_request(const std::string& req, const char* what, const std::string& key) {
    size_t done = 0;
    while (done < req.size()) {
      ssize_t n = ::send(fd_, req.data() + done, req.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw lost(what, key, errno_str(errno));
      done += static_cast<size_t>(n);
    }
  }

  void read_exact(void* out, size_t n, milliseconds limit, const char* what, const std::string& key) {
    auto* p = static_cast<char*>(out);
    const auto deadline = Clock::now() + limit;
    while (n > 0) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      pollfd pfd{fd_, POLLIN, 0};
      int ready = left > 0 ? ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30))) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        throw RuntimeError(
            fmt::format("[distributed] rendezvous: the store at {}:{} did not answer a {} of key "
                        "'{}' within {} ({})",
                        addr_, port_, what, key, seconds_str(limit), where()));
      }
      ssize_t got = ::recv(fd_, p, n, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) throw lost(what, key, got == 0 ? "connection closed" : errno_str(errno));
      p += got;
      n -= static_cast<size_t>(got);
    }
  }

  uint8_t read_u8(milliseconds limit, const char* what, const std::string& key) {
    uint8_t v = 0;
    read_exact(&v, 1, limit, what, key);
    return v;
  }

  void expect_ok(uint8_t status, const char* what, const std::string& key) {
    if (status != kOk) throw protocol_error(what, key);
  }

  RuntimeError lost(const char* what, const std::string& key, const std::string& why) const {
    return RuntimeError(
        fmt::format("[distributed] rendezvous: lost the store at {}:{} during a {} of key '{}' ({}; "
                    "rank 0 ended or died?): {}",
                    addr_, port_, what, key, where(), why));
  }

  RuntimeError protocol_error(const char* what, const std::string& key) const {
    return RuntimeError(
        fmt::format("[distributed] rendezvous: unexpected answer from {}:{} to a {} of key '{}' "
                    "(is something else listening on MASTER_PORT?)",
                    addr_, port_, what, key));
  }

  std::string addr_;
  int port_;
  milliseconds timeout_;
  std::unique_ptr<StoreServer> server_;  // rank 0 only; stops after the destructor closed the connection
  int fd_ = -1;
  std::mutex mutex_;  // one request and its reply at a time on the connection
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& addr, int port, bool serve, milliseconds timeout) {
  return std::make_unique<TcpStore>(addr, port, serve, timeout);
}

}  // namespace primus
