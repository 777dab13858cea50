// Token embedding on the CPU: forward gathers table rows, backward scatters gradient rows back (accumulate).
// Backward splits the table's columns among threads and walks the ids in order inside each block, so a
// repeated id is summed in token order whatever the thread count.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

constexpr int64_t kColumnBlock = 16;  // one 64-byte cache line of floats per thread and row

void check_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    PRIMUS_CHECK(ids[i] >= 0 && ids[i] < vocab, "[op {}] id {} at position {} is outside the table [0, {})", op, ids[i],
                 i, vocab);
  }
}

}  // namespace

void CpuBackend::embedding_forward(const EmbeddingArgs& args) {
  const int64_t n = args.ids->numel();
  const int64_t vocab = args.table->dim(0);
  const int64_t channels = args.table->dim(1);
  const int32_t* ids = args.ids->i32();    // [N]
  const float* table = args.table->f32();  // [V, C]
  float* out = args.out->f32();            // [N, C]
  check_ids(ids, n, vocab, "embedding_forward");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(table + ids[i] * channels, channels, out + i * channels);
  }
}

void CpuBackend::embedding_backward(const EmbeddingArgs& args) {
  const int64_t n = args.ids->numel();
  const int64_t vocab = args.dtable->dim(0);
  const int64_t channels = args.dtable->dim(1);
  const int32_t* ids = args.ids->i32();  // [N]
  const float* dout = args.dout->f32();  // [N, C]
  float* dtable = args.dtable->f32();    // [V, C] accumulate
  check_ids(ids, n, vocab, "embedding_backward");
  const int64_t blocks = (channels + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t c1 = std::min(channels, c0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i) {
      float* dst = dtable + ids[i] * channels;
      const float* src = dout + i * channels;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace primus
