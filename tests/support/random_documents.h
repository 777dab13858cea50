// An indexed dataset of random byte documents for tests of packed documents (reset_attention_mask and friends).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace primus::testing {

// `documents` documents of 5 to 34 random bytes drawn from Rng(seed), each followed by the byte tokenizer's EOD (256)
// when `append_eod`; written as PREFIX.bin/.idx. Returns the prefix.
inline std::string write_random_documents(const std::string& prefix, int documents, uint64_t seed, bool append_eod) {
  Rng rng(seed);
  IndexedDatasetWriter writer(prefix, TokenDType::kU16);
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> doc(static_cast<size_t>(5 + rng.below(30)));
    for (int32_t& id : doc) id = static_cast<int32_t>(rng.below(256));
    if (append_eod) doc.push_back(ByteLevelTokenizer::kEodId);
    writer.add_document(doc);
  }
  writer.finish();
  return prefix;
}

}  // namespace primus::testing
