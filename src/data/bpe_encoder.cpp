// Byte-level BPE: token table, merge loops (short: linear scan; long: heap + linked list), per-thread cache.
#include "data/bpe_encoder.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <queue>

#include "core/error.h"
#include "data/bpe_text.h"

namespace primus {
namespace {

constexpr uint64_t kEmptyKey = ~0ull;
// Pieces up to this many bytes merge with the O(n * merges) scan; it beats the heap on the short pieces that make
// up almost all text.
constexpr size_t kShortPiece = 48;

uint64_t table_capacity(size_t entries) {
  uint64_t cap = 16;
  while (cap < entries * 2) cap <<= 1;
  return cap;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

uint64_t slot_prefix(std::string_view bytes) {
  uint64_t prefix = 0;
  std::memcpy(&prefix, bytes.data(), std::min<size_t>(8, bytes.size()));
  return prefix;
}

// Never 0 for a non-empty token: the low byte holds the length (at least 1, capped at 255).
uint32_t slot_tag(uint64_t hash, size_t length) {
  return static_cast<uint32_t>((hash >> 40) << 8) | static_cast<uint32_t>(std::min<size_t>(length, 255));
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  return x;
}

// A direct-mapped cache of merged pieces for one encoder on one thread. Each thread keeps a few, reassigned
// round-robin when a thread uses more encoders than that.
struct PieceCache {
  static constexpr size_t kSlots = 32768;
  struct Slot {
    std::string key;
    std::vector<int32_t> ids;
  };
  uint64_t owner = 0;
  std::vector<Slot> slots;
};

PieceCache& thread_piece_cache(uint64_t serial) {
  thread_local std::array<PieceCache, 4> caches;
  thread_local size_t next_victim = 0;
  for (PieceCache& c : caches) {
    if (c.owner == serial) return c;
  }
  PieceCache& c = caches[next_victim];
  next_victim = (next_victim + 1) % caches.size();
  c.owner = serial;
  c.slots.assign(PieceCache::kSlots, {});
  return c;
}

std::atomic<uint64_t> g_next_serial{1};

}  // namespace

BytePairEncoder::BytePairEncoder(std::vector<std::optional<std::string>> tokens, MergeOrder order,
                                 const std::vector<std::pair<int32_t, int32_t>>& merges, bool whole_piece_first,
                                 const std::string& origin)
    : order_(order), whole_piece_first_(whole_piece_first), serial_(g_next_serial.fetch_add(1)) {
  size_t total = 0;
  for (const auto& t : tokens) total += t ? t->size() : 0;
  arena_.reserve(total);
  offsets_.reserve(tokens.size() + 1);
  assigned_.resize(tokens.size());
  offsets_.push_back(0);
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id]) {
      arena_ += *tokens[id];
      assigned_[id] = 1;
    }
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  }

  const uint64_t cap = table_capacity(tokens.size());
  token_slots_.assign(cap, TokenSlot{0, 0, 0});
  token_mask_ = cap - 1;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!assigned_[id] || offsets_[id] == offsets_[id + 1]) continue;
    const std::string_view bytes = token(static_cast<int32_t>(id));
    if (find(bytes)) continue;
    const uint64_t h = hash_bytes(bytes);
    for (uint64_t slot = h & token_mask_;; slot = (slot + 1) & token_mask_) {
      if (token_slots_[slot].tag == 0) {
        token_slots_[slot] = TokenSlot{slot_prefix(bytes), slot_tag(h, bytes.size()), static_cast<int32_t>(id)};
        break;
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const std::optional<int32_t> id = find(std::string_view(&c, 1));
    if (!id) throw UsageError(fmt::format("[tokenizer] {}: the vocabulary has no token for byte 0x{:02X}", origin, b));
    byte_ids_[b] = *id;
  }

  if (order_ == MergeOrder::kMergeList) {
    const uint64_t pcap = table_capacity(merges.size());
    pair_slots_.assign(pcap, PairEntry{kEmptyKey, 0, 0});
    pair_mask_ = pcap - 1;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const auto [left, right] = merges[rank];
      if (!assigned(left) || !assigned(right)) continue;
      const std::optional<int32_t> merged = find(std::string(token(left)) + std::string(token(right)));
      if (!merged) continue;
      const uint64_t key = pair_key(left, right);
      for (uint64_t slot = mix(key) & pair_mask_;; slot = (slot + 1) & pair_mask_) {
        if (pair_slots_[slot].key == key) break;  // listed twice: the earlier rank stays
        if (pair_slots_[slot].key == kEmptyKey) {
          pair_slots_[slot] = PairEntry{key, static_cast<int32_t>(rank), *merged};
          break;
        }
      }
    }
  }
}

std::optional<int32_t> BytePairEncoder::find(std::string_view bytes) const {
  if (bytes.empty()) return std::nullopt;
  const uint64_t h = hash_bytes(bytes);
  const uint32_t tag = slot_tag(h, bytes.size());
  const uint64_t prefix = slot_prefix(bytes);
  for (uint64_t slot = h & token_mask_;; slot = (slot + 1) & token_mask_) {
    const TokenSlot& e = token_slots_[slot];
    if (e.tag == 0) return std::nullopt;
    if (e.tag == tag && e.prefix == prefix) {
      // Equal length (below 255) and first 8 bytes: only longer tokens need the rest compared.
      if (bytes.size() <= 8) return e.id;
      if (token(e.id) == bytes) return e.id;
    }
  }
}

std::optional<BytePairEncoder::RankMerge> BytePairEncoder::pair_merge(std::string_view piece, size_t left_start,
                                                                      int32_t left_id, size_t right_end,
                                                                      int32_t right_id) const {
  if (order_ == MergeOrder::kTokenRank) {
    const std::optional<int32_t> id = find(piece.substr(left_start, right_end - left_start));
    if (!id) return std::nullopt;
    return RankMerge{*id, *id};
  }
  const uint64_t key = pair_key(left_id, right_id);
  for (uint64_t slot = mix(key) & pair_mask_;; slot = (slot + 1) & pair_mask_) {
    const PairEntry& e = pair_slots_[slot];
    if (e.key == key) return RankMerge{e.rank, e.merged};
    if (e.key == kEmptyKey) return std::nullopt;
  }
}

void BytePairEncoder::merge_short(std::string_view piece, std::vector<int32_t>& out) const {
  struct Part {
    uint32_t start;
    int32_t id;
    int32_t rank;  // of merging with the next part; INT_MAX when it cannot
    int32_t merged;
  };
  Part parts[kShortPiece + 1];
  size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) {
    parts[i] = Part{static_cast<uint32_t>(i), byte_ids_[static_cast<unsigned char>(piece[i])], INT_MAX, -1};
  }
  parts[n].start = static_cast<uint32_t>(n);
  const auto update = [&](size_t i) {  // parts i and i + 1 exist
    const std::optional<RankMerge> m =
        pair_merge(piece, parts[i].start, parts[i].id, parts[i + 2].start, parts[i + 1].id);
    parts[i].rank = m ? m->rank : INT_MAX;
    parts[i].merged = m ? m->merged : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) update(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (parts[i].rank < parts[best].rank) best = i;
    }
    if (parts[best].rank == INT_MAX) break;
    parts[best].id = parts[best].merged;
    std::copy(parts + best + 2, parts + n + 1, parts + best + 1);
    --n;
    if (best + 1 < n) {
      update(best);
    } else {
      parts[best].rank = INT_MAX;
    }
    if (best > 0) update(best - 1);
  }
  for (size_t i = 0; i < n; ++i) out.push_back(parts[i].id);
}

void BytePairEncoder::merge_long(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  std::vector<int32_t> id(n);
  std::vector<int32_t> next(n);  // index of the next live part; n at the end
  std::vector<int32_t> prev(n);  // index of the previous live part; -1 at the start
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = static_cast<int32_t>(i + 1);
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  struct Candidate {
    int32_t rank;
    int32_t left;  // part index = start byte, so smaller means further left
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = next[left];
    if (right >= static_cast<int32_t>(n)) return;
    const size_t right_end = static_cast<size_t>(next[right]);
    const std::optional<RankMerge> m = pair_merge(piece, left, id[left], right_end, id[right]);
    if (m) heap.push(Candidate{m->rank, left, right, id[left], id[right], m->merged});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale when either side has merged with something else since the candidate was pushed.
    if (!alive[c.left] || next[c.left] != c.right || id[c.left] != c.left_id || id[c.right] != c.right_id) continue;
    id[c.left] = c.merged;
    alive[c.right] = 0;
    next[c.left] = next[c.right];
    if (next[c.right] < static_cast<int32_t>(n)) prev[next[c.right]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  for (int32_t i = 0; i < static_cast<int32_t>(n); i = next[i]) out.push_back(id[i]);
}

void BytePairEncoder::merge(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() <= kShortPiece) {
    merge_short(piece, out);
  } else {
    merge_long(piece, out);
  }
}

void BytePairEncoder::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (whole_piece_first_) {
    if (const std::optional<int32_t> id = find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  PieceCache& cache = thread_piece_cache(serial_);
  PieceCache::Slot& slot = cache.slots[hash_bytes(piece) & (PieceCache::kSlots - 1)];
  if (slot.key == piece) {
    out.insert(out.end(), slot.ids.begin(), slot.ids.end());
    return;
  }
  const size_t first = out.size();
  merge(piece, out);
  slot.key.assign(piece);
  slot.ids.assign(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
}

}  // namespace primus
