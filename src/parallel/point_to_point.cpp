// The point-to-point helpers of communicator.h that need no backend: the error text of a batch and the default
// start_batch_send_recv for communicators without a way to post several transfers at once.
#include <algorithm>
#include <fmt/format.h>

#include "ops/communicator.h"

namespace primus {

std::string describe_transfers(const std::vector<PeerTransfer>& sends, const std::vector<PeerTransfer>& recvs) {
  std::string out;
  auto add = [&](const char* direction, const PeerTransfer& t) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} rank {} (tag {}, {} elements)", direction, t.peer, t.tag, t.tensor.numel());
  };
  for (const PeerTransfer& t : sends) add("to", t);
  for (const PeerTransfer& t : recvs) add("from", t);
  return out.empty() ? "nothing" : out;
}

void Communicator::batch_send_recv(const std::vector<PeerTransfer>& sends, const std::vector<PeerTransfer>& recvs,
                                   Stream stream) {
  start_batch_send_recv(sends, recvs, stream)->wait();
}

std::unique_ptr<PendingTransfers> Communicator::start_batch_send_recv(const std::vector<PeerTransfer>& sends,
                                                                      const std::vector<PeerTransfer>& recvs,
                                                                      Stream stream) {
  // Peer by peer in ascending order, the lower rank of each pair sending first: every pair's exchange is then
  // ordered the same way on both sides, and the pairs in one global order, so blocking sends cannot wait in a cycle.
  std::vector<int> peers;
  for (const PeerTransfer& t : sends) peers.push_back(t.peer);
  for (const PeerTransfer& t : recvs) peers.push_back(t.peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  auto by_tag = [](const PeerTransfer& a, const PeerTransfer& b) { return a.tag < b.tag; };
  for (const int peer : peers) {
    std::vector<PeerTransfer> to, from;
    for (const PeerTransfer& t : sends) if (t.peer == peer) to.push_back(t);
    for (const PeerTransfer& t : recvs) if (t.peer == peer) from.push_back(t);
    // Both sides order one pair's messages by tag: the sender's sends and the receiver's receives line up.
    std::sort(to.begin(), to.end(), by_tag);
    std::sort(from.begin(), from.end(), by_tag);
    auto send_all = [&] { for (const PeerTransfer& t : to) send(t.tensor, peer, stream); };
    auto recv_all = [&] {
      for (PeerTransfer& t : from) recv(t.tensor, peer, stream);
    };
    if (rank() <= peer) {
      send_all();
      recv_all();
    } else {
      recv_all();
      send_all();
    }
  }
  return std::make_unique<CompletedTransfers>();
}

}  // namespace primus
