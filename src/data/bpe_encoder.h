// BytePairEncoder: byte-level BPE over one pre-tokenized piece, shared by tiktoken rank files and Hugging Face
// byte-level vocabularies (FORMATS.md section 5).
//
// A vocabulary is a list of byte strings indexed by id (ids may have gaps). Two merge orders exist:
//   kTokenRank  (tiktoken, Llama 3's tokenizer.model): two adjacent parts may merge when their concatenated bytes
//               are a token; the pair whose concatenation has the lowest rank (= id) merges first.
//   kMergeList  (tokenizer.json, merges.txt): only listed pairs merge; the pair listed first merges first.
// Ties go to the leftmost pair in both. With whole_piece_first (tiktoken always; Hugging Face's ignore_merges) a
// piece that is itself a token is emitted as is, without merging.
//
// Pieces that need merging use a linear scan when short and a min-heap over a linked list of parts when long, and
// go through a small per-thread cache, so encode_piece is safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primus {

class BytePairEncoder {
 public:
  enum class MergeOrder { kTokenRank, kMergeList };

  // tokens[id]: the token's bytes, nullopt for an unassigned id. Every single byte must be a token, else
  // UsageError naming `origin` and the first missing byte. Duplicate byte strings: the first id wins.
  // merges (kMergeList only): pairs of ids in priority order; a pair whose concatenation is not a token, or a
  // repeated pair, is ignored here (loaders report bad merge lines themselves).
  BytePairEncoder(std::vector<std::optional<std::string>> tokens, MergeOrder order,
                  const std::vector<std::pair<int32_t, int32_t>>& merges, bool whole_piece_first,
                  const std::string& origin);

  // Appends the ids of one pre-tokenized piece to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // The id of a byte string that is a token.
  std::optional<int32_t> find(std::string_view bytes) const;
  // One past the largest id.
  int32_t id_limit() const { return static_cast<int32_t>(assigned_.size()); }
  bool assigned(int32_t id) const { return id >= 0 && id < id_limit() && assigned_[id]; }
  // The bytes of an assigned id.
  std::string_view token(int32_t id) const {
    return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  MergeOrder order() const { return order_; }

 private:
  struct PairEntry {
    uint64_t key;  // left << 32 | right; kEmptyKey when free
    int32_t rank;
    int32_t merged;
  };
  struct RankMerge {
    int32_t rank;
    int32_t merged;
  };

  std::optional<RankMerge> pair_merge(std::string_view piece, size_t left_start, int32_t left_id, size_t right_end,
                                      int32_t right_id) const;
  void merge_short(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_long(std::string_view piece, std::vector<int32_t>& out) const;
  void merge(std::string_view piece, std::vector<int32_t>& out) const;

  std::string arena_;              // all token bytes, back to back
  std::vector<uint32_t> offsets_;  // token id's bytes are arena_[offsets_[id], offsets_[id + 1])
  std::vector<uint8_t> assigned_;
  // Open addressing over token bytes. A slot keeps the first 8 bytes and the length (in the tag), so looking up a
  // token of up to 8 bytes (most BPE candidates) touches one cache line and never the arena.
  struct TokenSlot {
    uint64_t prefix;  // the first min(8, length) bytes, zero-padded
    uint32_t tag;     // hash bits 63..40 << 8 | min(length, 255); 0 when free
    int32_t id;
  };
  std::vector<TokenSlot> token_slots_;
  uint64_t token_mask_ = 0;
  std::vector<PairEntry> pair_slots_;  // kMergeList only
  uint64_t pair_mask_ = 0;
  int32_t byte_ids_[256];
  MergeOrder order_;
  bool whole_piece_first_;
  uint64_t serial_;  // identifies this encoder's per-thread cache
};

}  // namespace primus
