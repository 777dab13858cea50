// The Megatron indexed dataset reader: IndexedDataset over a .idx and a .bin (header, counts, lengths,
// pointers, document index, .bin size), as a text and as a multimodal dataset, then every token and document
// entry of a dataset it accepts.
//
// Input: the .idx bytes \n@@\n the .bin bytes (a missing .bin part is an empty .bin).
#include <vector>

#include "data/indexed_dataset.h"
#include "fuzz_input.h"

namespace {

void read_all(const primus::IndexedDataset& dataset) {
  std::vector<int32_t> tokens;
  for (int64_t s = 0; s < dataset.num_sequences(); ++s) {
    tokens.resize(static_cast<size_t>(dataset.sequence_length(s)));
    dataset.read(s, 0, tokens);
  }
  for (int64_t k = 0; k <= dataset.num_documents(); ++k) (void)dataset.document_entry(k);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts = primus::fuzz::split_parts(input, 2);
  primus::fuzz::write_scratch("data.idx", parts[0]);
  primus::fuzz::write_scratch("data.bin", parts.size() > 1 ? parts[1] : std::string_view());
  const std::string prefix = primus::fuzz::scratch_dir() + "/data";
  for (bool multimodal : {false, true}) {
    primus::fuzz::expect_clean_errors([&] { read_all(primus::IndexedDataset(prefix, multimodal)); });
  }
  return 0;
}
