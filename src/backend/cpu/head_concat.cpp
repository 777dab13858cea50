// Per-head concatenation along the feature dimension on the CPU (backend.h, HeadConcatArgs): multi-head latent
// attention's assembly of queries and keys from their parts, and its split of the kv up-projection. Rows (n) are
// independent and split among threads; the sum over the heads sharing b's one head runs in head order, so the bits do
// not depend on the thread count.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"

namespace primus {

void CpuBackend::head_concat(const HeadConcatArgs& args) {
  const int64_t N = args.out->dim(0), H = args.out->dim(1);
  const int64_t Da = args.a->dim(2), Db = args.b->dim(2), Hb = args.b->dim(1);
  const float* a = args.a->f32();  // [N, H, Da]
  const float* b = args.b->f32();  // [N, Hb, Db]
  float* out = args.out->f32();    // [N, H, Da + Db]
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H; ++h) {
      float* row = out + (n * H + h) * (Da + Db);
      std::copy_n(a + (n * H + h) * Da, Da, row);
      std::copy_n(b + (n * Hb + (Hb == 1 ? 0 : h)) * Db, Db, row + Da);
    }
  }
}

void CpuBackend::head_concat_backward(const HeadConcatArgs& args) {
  const int64_t N = args.dout->dim(0), H = args.dout->dim(1);
  const int64_t Da = args.da->dim(2), Db = args.db->dim(2), Hb = args.db->dim(1);
  const float* dout = args.dout->f32();  // [N, H, Da + Db]
  float* da = args.da->f32();            // [N, H, Da]
  float* db = args.db->f32();            // [N, Hb, Db]
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (Hb == 1) std::fill_n(db + n * Db, Db, 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      const float* row = dout + (n * H + h) * (Da + Db);
      std::copy_n(row, Da, da + (n * H + h) * Da);
      if (Hb == 1) {
        float* shared = db + n * Db;
        for (int64_t i = 0; i < Db; ++i) shared[i] += row[Da + i];
      } else {
        std::copy_n(row + Da, Db, db + (n * H + h) * Db);
      }
    }
  }
}

}  // namespace primus
