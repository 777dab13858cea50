// Rotary position embedding on the CPU, Hugging Face "rotate half" layout: within each head vector of size D,
// the pair (x[i], x[i + D/2]) rotates by angle[p, i] (or, interleaved, the pair (x[2i], x[2i + 1])):
//   forward:  (a, b) -> (a·cos − b·sin, b·cos + a·sin)
//   backward: the transpose (inverse) rotation, (a, b) -> (a·cos + b·sin, b·cos − a·sin)
// Both work in place on x [B, T, H, D]. The table row p of token (b, t) is t (cos, sin [T, D/2]), or
// positions[b, t] when given (cos, sin [P, D/2]; packed documents whose positions restart).
#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

// Every position must name a row of the tables.
void check_positions(const Tensor& positions, int64_t rows, const char* op) {
  const int32_t* p = positions.i32();
  for (int64_t i = 0; i < positions.numel(); ++i) {
    PRIMUS_CHECK(p[i] >= 0 && p[i] < rows, "[op {}] position {} at token {} is outside the rope table [0, {})", op,
                 p[i], i, rows);
  }
}

// sign +1 rotates forward, -1 applies the inverse rotation.
void rotate(const RopeArgs& args, float sign, const char* op) {
  const int64_t seq = args.x->dim(1);
  const int64_t heads = args.x->dim(2);
  const int64_t head_dim = args.x->dim(3);
  const int64_t half = head_dim / 2;
  const int64_t vectors = args.x->numel() / head_dim;  // B * T * H
  float* x = args.x->f32();                            // [B, T, H, D]
  const float* cos = args.cos->f32();                  // [T or P, D/2]
  const float* sin = args.sin->f32();                  // [T or P, D/2]
  const int32_t* positions = nullptr;                  // [B, T] or null
  if (args.positions != nullptr) {
    check_positions(*args.positions, args.cos->dim(0), op);
    positions = args.positions->i32();
  }
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < vectors; ++v) {
    const int64_t token = v / heads;  // b * T + t
    const int64_t row = positions != nullptr ? positions[token] : token % seq;
    // Pair i is (first[i·step], second[i·step]): halves (step 1) or adjacent features (step 2).
    float* first = x + v * head_dim;
    float* second = args.interleaved ? first + 1 : first + half;
    const int64_t step = args.interleaved ? 2 : 1;
    const float* ct = cos + row * half;
    const float* st = sin + row * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = first[i * step];
      const float b = second[i * step];
      const float s = sign * st[i];
      first[i * step] = a * ct[i] - b * s;
      second[i * step] = b * ct[i] + a * s;
    }
  }
}

}  // namespace

void CpuBackend::rope_forward(const RopeArgs& args) { rotate(args, 1.0f, "rope_forward"); }

void CpuBackend::rope_backward(const RopeArgs& args) { rotate(args, -1.0f, "rope_backward"); }

}  // namespace primus
