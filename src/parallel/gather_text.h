// Host values of every rank, gathered on every rank in rank order: small records that ranks exchange outside the
// training tensors (checkpoint shard descriptions, preflight reports, pipeline stages' fp8 scaling state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/communicator.h"

namespace primus {

// Each rank's `mine` (the same length on every rank), concatenated in rank order. Collective.
std::vector<int64_t> all_gather_i64(Communicator& comm, const std::vector<int64_t>& mine);

// Each rank's text (any lengths), in rank order: the lengths first, then the bytes packed into int64 words (the
// communicators' widest integer) padded to the longest. Collective.
std::vector<std::string> all_gather_text(Communicator& comm, const std::string& text);

}  // namespace primus
