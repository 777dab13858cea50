// A small key-value store for rendezvous: rank 0 serves it over TCP at MASTER_ADDR:MASTER_PORT, every rank
// (rank 0 included) is a client. Ranks publish their Gloo addresses or the NCCL unique id under a key and
// wait for the others'. Values are set once; get waits for the key. Every wait has a timeout, and the
// error names the key and so what was missing ("rank 3 never published its address").
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace primus {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // Waits until `key` is set (at most the store's timeout), then returns its value.
  virtual std::vector<char> get(const std::string& key) = 0;
  // Waits until every key is set; throws RuntimeError naming the first missing key after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer at `key` (0 when unset) and returns the new value (barriers).
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// Rank 0 (`serve`) listens on `port` of every interface and serves until destroyed; every instance,
// server included, connects as a client to addr:port, retrying until `timeout`.
std::unique_ptr<Store> make_tcp_store(const std::string& addr, int port, bool serve,
                                      std::chrono::milliseconds timeout);

}  // namespace primus
