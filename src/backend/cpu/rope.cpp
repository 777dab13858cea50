// Rotary position embedding on the CPU, Hugging Face "rotate half" layout: within each head vector of size D,
// the pair (x[i], x[i + D/2]) rotates by angle[t, i]:
//   forward:  (a, b) -> (a·cos − b·sin, b·cos + a·sin)
//   backward: the transpose (inverse) rotation, (a, b) -> (a·cos + b·sin, b·cos − a·sin)
// Both work in place on x [B, T, H, D] with cos, sin [T, D/2].
#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

// sign +1 rotates forward, -1 applies the inverse rotation.
void rotate(const RopeArgs& args, float sign) {
  const int64_t seq = args.x->dim(1);
  const int64_t heads = args.x->dim(2);
  const int64_t head_dim = args.x->dim(3);
  const int64_t half = head_dim / 2;
  const int64_t vectors = args.x->numel() / head_dim;  // B * T * H
  float* x = args.x->f32();                            // [B, T, H, D]
  const float* cos = args.cos->f32();                  // [T, D/2]
  const float* sin = args.sin->f32();                  // [T, D/2]
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < vectors; ++v) {
    const int64_t t = (v / heads) % seq;
    float* lo = x + v * head_dim;
    float* hi = lo + half;
    const float* ct = cos + t * half;
    const float* st = sin + t * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = lo[i];
      const float b = hi[i];
      const float s = sign * st[i];
      lo[i] = a * ct[i] - b * s;
      hi[i] = b * ct[i] + a * s;
    }
  }
}

}  // namespace

void CpuBackend::rope_forward(const RopeArgs& args) { rotate(args, 1.0f); }

void CpuBackend::rope_backward(const RopeArgs& args) { rotate(args, -1.0f); }

}  // namespace primus
