// Token embedding on the CPU: forward gathers table rows, backward scatters gradient rows back (accumulate).
// Backward splits the table's columns among threads and walks the ids in order inside each block, so a
// repeated id is summed in token order whatever the thread count.
// With a vocabulary shard (args.shard, backend.h) the table holds rows [begin, begin + V) of the vocabulary: an id
// there maps to table row id − begin, any other valid id gives a zero row (forward) and no gradient (backward).
#include <algorithm>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

constexpr int64_t kColumnBlock = 16;  // one 64-byte cache line of floats per thread and row

// Every id in [0, shard.total); the unsharded table is named as such, a shard's limit is the whole vocabulary.
void check_ids(const int32_t* ids, int64_t n, VocabShard shard, int64_t rows, const char* op) {
  const char* range = shard.begin == 0 && shard.total == rows ? "the table" : "the vocabulary";
  for (int64_t i = 0; i < n; ++i) {
    PRIMUS_CHECK(ids[i] >= 0 && ids[i] < shard.total, "[op {}] id {} at position {} is outside {} [0, {})", op, ids[i],
                 i, range, shard.total);
  }
}

// The table row of an id, or -1 when another shard holds it.
int64_t local_row(int32_t id, VocabShard shard, int64_t rows) {
  const int64_t row = id - shard.begin;
  return row >= 0 && row < rows ? row : -1;
}

}  // namespace

void CpuBackend::embedding_forward(const EmbeddingArgs& args) {
  const int64_t n = args.ids->numel();
  const int64_t rows = args.table->dim(0);
  const int64_t channels = args.table->dim(1);
  const VocabShard shard = resolve_shard(args.shard, rows);
  const int32_t* ids = args.ids->i32();    // [N]
  const float* table = args.table->f32();  // [V, C]
  float* out = args.out->f32();            // [N, C]
  check_ids(ids, n, shard, rows, "embedding_forward");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = local_row(ids[i], shard, rows);
    if (row < 0) {
      std::fill_n(out + i * channels, channels, 0.0f);
    } else {
      std::copy_n(table + row * channels, channels, out + i * channels);
    }
  }
}

void CpuBackend::embedding_backward(const EmbeddingArgs& args) {
  const int64_t n = args.ids->numel();
  const int64_t rows = args.dtable->dim(0);
  const int64_t channels = args.dtable->dim(1);
  const VocabShard shard = resolve_shard(args.shard, rows);
  const int32_t* ids = args.ids->i32();  // [N]
  const float* dout = args.dout->f32();  // [N, C]
  float* dtable = args.dtable->f32();    // [V, C] accumulate
  check_ids(ids, n, shard, rows, "embedding_backward");
  const int64_t blocks = (channels + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t c1 = std::min(channels, c0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = local_row(ids[i], shard, rows);
      if (row < 0) continue;
      float* dst = dtable + row * channels;
      const float* src = dout + i * channels;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace primus
