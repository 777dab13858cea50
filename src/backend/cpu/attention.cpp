// Grouped-query attention on the CPU, and the merge of partial results. Values (and so out, dout, dv) may have a head
// size Dv other than the queries' and keys' D (multi-head latent attention); the scale is 1/sqrt(D) either way. For batch b, query head h (reading kv head
// h / (Hq/Hkv)) and query position t, over the keys j in [s0, e] with s0 = 0, or s0 = segment_start[b, t] for
// packed documents, and e = t under the causal mask or the block's last key T − 1 without one:
//   s[j] = (q[t] · k[j]) / sqrt(D)  for s0 ≤ j ≤ e     p = softmax(s)       out[t] = Σ_j p[j] v[j]
//   lse[t] = log Σ_j exp(s[j])
// Backward recomputes p[j] = exp(s[j] − lse[t]) row by row (no [T, T] matrix is kept) and uses
//   dp[j] = dout[t] · v[j],  Δ = dout[t] · out[t],  ds[j] = p[j] (dp[j] − Δ)
//   dq[t] = Σ_j ds[j] k[j] / sqrt(D),  dk[j] += ds[j] q[t] / sqrt(D),  dv[j] += p[j] dout[t]
// Keys and values of one head are first copied transposed to [D, T] scratch so the score loops run over key
// positions (vectorisable). Every fp32 contraction sums over its index in order (0..D−1 or s0..e), so register
// blocking changes no bits; softmax sums and Δ accumulate in double. Forward splits (b, h) among threads;
// backward splits (b, kv head) and walks that head's query group in order, so dk and dv (overwritten) are
// summed without races in a fixed order. Backward reads out and lse as given (backend.h: with a whole attention's
// merged results it yields a block's contributions).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

struct Dims {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
  int64_t v_dim;  // the value (and output) head size: head_dim, or another (multi-head latent attention)
  bool causal;
  int64_t group() const { return q_heads / kv_heads; }
  // One past the last key query t attends to.
  int64_t key_end(int64_t t) const { return causal ? t + 1 : seq; }
  // Offsets of row (b, t, head) in [B, T, H, D] tensors.
  int64_t q_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * q_heads + h) * head_dim; }
  int64_t kv_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * kv_heads + h) * head_dim; }
  // Offsets in v, dv [B, T, Hkv, Dv] and out, dout [B, T, Hq, Dv].
  int64_t v_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * kv_heads + h) * v_dim; }
  int64_t o_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * q_heads + h) * v_dim; }
};

Dims dims_of(const AttentionArgs& args) {
  return Dims{args.q->dim(0), args.q->dim(1), args.q->dim(2),
              args.k->dim(2), args.q->dim(3), args.v->dim(3), args.mask == AttentionMask::kCausal};
}

// The first key of each query row: segment_start[b, t] (checked to lie in [0, t]) or 0 for every row. [B·T]
std::vector<int64_t> first_keys(const AttentionArgs& args, const Dims& d, const char* op) {
  std::vector<int64_t> first(static_cast<size_t>(d.batch * d.seq), 0);
  if (args.segment_start == nullptr) return first;
  const int32_t* start = args.segment_start->i32();  // [B, T]
  for (int64_t i = 0; i < d.batch * d.seq; ++i) {
    const int64_t t = i % d.seq;
    PRIMUS_CHECK(start[i] >= 0 && start[i] <= t, "[op {}] segment start {} of token {} (position {}) is outside [0, {}]",
                 op, start[i], i, t, t);
    first[static_cast<size_t>(i)] = start[i];
  }
  return first;
}

// dst [W, T] = src[b, :, h, :]ᵀ for a [B, T, Hkv, W] tensor (W: D for keys, Dv for values).
void gather_transposed(const Dims& d, const float* src, int64_t width, int64_t b, int64_t h, float* dst) {
  for (int64_t t = 0; t < d.seq; ++t) {
    const float* row = src + ((b * d.seq + t) * d.kv_heads + h) * width;
    for (int64_t i = 0; i < width; ++i) dst[i * d.seq + t] = row[i];
  }
}

constexpr int64_t kLanes = 16;  // outputs kept in registers at a time (four SSE vectors)

// s[j] = scale · Σ_i a[i] · bt[i, j] for j < count, bt being [D, T] scratch. Blocks of kLanes scores stay in
// registers while i runs over D; every score is summed over i in order 0..D−1 however it is blocked.
void row_scores(const float* a, const float* bt, int64_t head_dim, int64_t seq, int64_t count, float scale, float* s) {
  int64_t j0 = 0;
  for (; j0 + kLanes <= count; j0 += kLanes) {
    float acc[kLanes] = {};
    for (int64_t i = 0; i < head_dim; ++i) {
      const float ai = a[i];
      const float* bi = bt + i * seq + j0;
      for (int64_t l = 0; l < kLanes; ++l) acc[l] += ai * bi[l];
    }
    for (int64_t l = 0; l < kLanes; ++l) s[j0 + l] = acc[l] * scale;
  }
  for (int64_t j = j0; j < count; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < head_dim; ++i) acc += a[i] * bt[i * seq + j];
    s[j] = acc * scale;
  }
}

// out[i] = Σ_j w[j] · rows[j · stride + i] for i < D, summed over j in order 0..count−1.
void weighted_rows(const float* w, int64_t count, const float* rows, int64_t stride, int64_t head_dim, float* out) {
  int64_t i0 = 0;
  for (; i0 + kLanes <= head_dim; i0 += kLanes) {
    float acc[kLanes] = {};
    for (int64_t j = 0; j < count; ++j) {
      const float wj = w[j];
      const float* row = rows + j * stride + i0;
      for (int64_t l = 0; l < kLanes; ++l) acc[l] += wj * row[l];
    }
    std::copy_n(acc, kLanes, out + i0);
  }
  for (int64_t i = i0; i < head_dim; ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < count; ++j) acc += w[j] * rows[j * stride + i];
    out[i] = acc;
  }
}

}  // namespace

void CpuBackend::attention_forward(const AttentionArgs& args) {
  const Dims d = dims_of(args);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  const float* q = args.q->f32();  // [B, T, Hq, D]
  const float* k = args.k->f32();  // [B, T, Hkv, D]
  const float* v = args.v->f32();  // [B, T, Hkv, D]
  float* out = args.out->f32();    // [B, T, Hq, Dv]
  float* lse = args.lse->f32();    // [B, Hq, T]
  const std::vector<int64_t> first = first_keys(args, d, "attention_forward");  // [B·T]
  const int64_t work = d.batch * d.q_heads;
#pragma omp parallel
  {
    std::vector<float> kt(static_cast<size_t>(d.head_dim * d.seq));  // [D, T] keys of the cached kv head
    std::vector<float> p(static_cast<size_t>(d.seq));                // [T] scores, then probabilities
    int64_t cached = -1;                                             // b * Hkv + kv head held in kt
#pragma omp for schedule(static)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t b = w / d.q_heads;
      const int64_t h = w % d.q_heads;
      const int64_t kvh = h / d.group();
      if (cached != b * d.kv_heads + kvh) {
        gather_transposed(d, k, d.head_dim, b, kvh, kt.data());
        cached = b * d.kv_heads + kvh;
      }
      for (int64_t t = 0; t < d.seq; ++t) {
        const int64_t s0 = first[b * d.seq + t];  // p[r] belongs to key s0 + r
        const int64_t count = d.key_end(t) - s0;
        row_scores(q + d.q_row(b, t, h), kt.data() + s0, d.head_dim, d.seq, count, scale, p.data());
        const float max = *std::max_element(p.begin(), p.begin() + count);
        double sum = 0.0;
        for (int64_t j = 0; j < count; ++j) {
          p[j] = std::exp(p[j] - max);
          sum += p[j];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < count; ++j) p[j] *= inv;
        weighted_rows(p.data(), count, v + d.v_row(b, s0, kvh), d.kv_heads * d.v_dim, d.v_dim,
                      out + d.o_row(b, t, h));
        lse[(b * d.q_heads + h) * d.seq + t] = static_cast<float>(max + std::log(sum));
      }
    }
  }
}

void CpuBackend::attention_backward(const AttentionArgs& args) {
  const Dims d = dims_of(args);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  const float* q = args.q->f32();        // [B, T, Hq, D]
  const float* k = args.k->f32();        // [B, T, Hkv, D]
  const float* v = args.v->f32();        // [B, T, Hkv, D]
  const float* out = args.out->f32();    // [B, T, Hq, D]
  const float* lse = args.lse->f32();    // [B, Hq, T]
  const float* dout = args.dout->f32();  // [B, T, Hq, D]
  float* dq = args.dq->f32();            // [B, T, Hq, D]
  float* dk = args.dk->f32();            // [B, T, Hkv, D]
  float* dv = args.dv->f32();            // [B, T, Hkv, D]
  const std::vector<int64_t> first = first_keys(args, d, "attention_backward");  // [B·T]
  const int64_t work = d.batch * d.kv_heads;
  const size_t head_size = static_cast<size_t>(d.head_dim * d.seq);
  const size_t v_size = static_cast<size_t>(d.v_dim * d.seq);
#pragma omp parallel
  {
    std::vector<float> kt(head_size);                   // [D, T] keys, transposed
    std::vector<float> vt(v_size);                      // [Dv, T] values, transposed
    std::vector<float> dk_acc(head_size);               // [T, D]
    std::vector<float> dv_acc(v_size);                  // [T, Dv]
    std::vector<float> p(static_cast<size_t>(d.seq));   // [T] probabilities of one query row
    std::vector<float> ds(static_cast<size_t>(d.seq));  // [T] dp, then score gradients (unscaled)
#pragma omp for schedule(static)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t b = w / d.kv_heads;
      const int64_t kvh = w % d.kv_heads;
      gather_transposed(d, k, d.head_dim, b, kvh, kt.data());
      gather_transposed(d, v, d.v_dim, b, kvh, vt.data());
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
        for (int64_t t = 0; t < d.seq; ++t) {
          const int64_t s0 = first[b * d.seq + t];  // p[r] and ds[r] belong to key s0 + r
          const int64_t count = d.key_end(t) - s0;
          const float* qt = q + d.q_row(b, t, h);
          const float* dot = dout + d.o_row(b, t, h);
          const float* ot = out + d.o_row(b, t, h);
          const float row_lse = lse[(b * d.q_heads + h) * d.seq + t];
          row_scores(qt, kt.data() + s0, d.head_dim, d.seq, count, scale, p.data());
          for (int64_t j = 0; j < count; ++j) p[j] = std::exp(p[j] - row_lse);
          row_scores(dot, vt.data() + s0, d.v_dim, d.seq, count, 1.0f, ds.data());
          double delta = 0.0;  // Σ_j p[j] dp[j], computed as dout[t] · out[t]
          for (int64_t i = 0; i < d.v_dim; ++i) delta += static_cast<double>(dot[i]) * ot[i];
          const float delta_f = static_cast<float>(delta);
          for (int64_t j = 0; j < count; ++j) ds[j] = p[j] * (ds[j] - delta_f);
          float* dqt = dq + d.q_row(b, t, h);
          weighted_rows(ds.data(), count, k + d.kv_row(b, s0, kvh), d.kv_heads * d.head_dim, d.head_dim, dqt);
          for (int64_t i = 0; i < d.head_dim; ++i) dqt[i] *= scale;
          for (int64_t j = 0; j < count; ++j) {
            const float dsj = ds[j] * scale;
            const float pj = p[j];
            float* dkj = dk_acc.data() + (s0 + j) * d.head_dim;
            float* dvj = dv_acc.data() + (s0 + j) * d.v_dim;
            for (int64_t i = 0; i < d.head_dim; ++i) dkj[i] += dsj * qt[i];
            for (int64_t i = 0; i < d.v_dim; ++i) dvj[i] += pj * dot[i];
          }
        }
      }
      for (int64_t t = 0; t < d.seq; ++t) {
        std::copy_n(dk_acc.data() + t * d.head_dim, d.head_dim, dk + d.kv_row(b, t, kvh));
        std::copy_n(dv_acc.data() + t * d.v_dim, d.v_dim, dv + d.v_row(b, t, kvh));
      }
    }
  }
}

void CpuBackend::attention_merge(const AttentionMergeArgs& args) {
  const int64_t B = args.out->dim(0), T = args.out->dim(1), H = args.out->dim(2), D = args.out->dim(3);
  float* out = args.out->f32();                // [B, T, H, D]
  float* lse = args.lse->f32();                // [B, H, T]
  const float* block = args.block_out->f32();  // [B, T, H, D]
  const float* block_lse = args.block_lse->f32();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T * H; ++row) {  // row (b, t, h) of out
    const int64_t b = row / (T * H), t = row / H % T, h = row % H;
    const int64_t stat = (b * H + h) * T + t;
    const double a = lse[stat], c = block_lse[stat];
    constexpr double kNone = -std::numeric_limits<double>::infinity();
    if (c == kNone) continue;  // nothing new (also when both are −inf)
    float* o = out + row * D;
    const float* ob = block + row * D;
    if (a == kNone) {  // nothing so far: the block's row as it is (out may hold anything)
      std::copy_n(ob, D, o);
      lse[stat] = block_lse[stat];
      continue;
    }
    const double m = std::max(a, c);
    const double merged = m + std::log(std::exp(a - m) + std::exp(c - m));
    const float wa = static_cast<float>(std::exp(a - merged)), wc = static_cast<float>(std::exp(c - merged));
    for (int64_t i = 0; i < D; ++i) o[i] = wa * o[i] + wc * ob[i];
    lse[stat] = static_cast<float>(merged);
  }
}

}  // namespace primus
