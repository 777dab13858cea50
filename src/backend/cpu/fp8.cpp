// fp8 quantisation on the CPU, the reference of every quantise kernel (backend.h: Fp8*Args): tile amaxes, scales
// from amaxes, quantise to codes (and the transposed copy) and dequantise, all through core/fp8.h's scalar rules, so
// a device kernel that calls the same header functions on the same f32 values gives the same bits. Loops run over
// tile rows with OpenMP; a max has no order to get wrong, and every other output element is computed alone.
#include <algorithm>
#include <limits>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

// The tile extents of one dimension of `size` elements cut into tiles of `tile` (0: one tile of all).
int64_t tile_extent(int64_t tile, int64_t size) { return tile == 0 ? std::max<int64_t>(size, 1) : tile; }

// A matrix [rows, cols] seen through a tiling: which tile an element is in, in a row-major grid.
struct TileGrid {
  int64_t tile_rows, tile_cols, grid_cols;
  TileGrid(Fp8Tiling tiling, int64_t rows, int64_t cols)
      : tile_rows(tile_extent(tiling.rows, rows)),
        tile_cols(tile_extent(tiling.cols, cols)),
        grid_cols((cols + tile_extent(tiling.cols, cols) - 1) / tile_extent(tiling.cols, cols)) {}
  int64_t tile_of(int64_t r, int64_t c) const { return (r / tile_rows) * grid_cols + c / tile_cols; }
};

// max that keeps a NaN once it has seen one.
float max_keeping_nan(float m, float v) { return (v > m || v != v) && m == m ? v : m; }

// x's elements as f32: bf16 widens exactly, so quantising bf16 values gives the codes of the same values in f32.
float widen(float v) { return v; }
float widen(uint16_t bf16_bits) { return bf16_to_f32(bf16_bits); }

// Calls body(p) with x's data typed as its storage: const float* or const uint16_t* (bf16 bits).
template <typename Body>
void with_float_input(const Tensor& x, Body&& body) {
  if (x.dtype() == DType::kBF16) {
    body(static_cast<const uint16_t*>(x.data()));
  } else {
    body(static_cast<const float*>(x.data()));
  }
}

template <typename T>
void amax_tiles(const Fp8AmaxArgs& args, const T* px) {
  const Tensor& x = *args.x;
  const int64_t r_count = x.dim(0), c_count = x.dim(1);
  // Over xᵀ: element (i, j) of the [C, R] view is x[j, i].
  const int64_t rows = args.transposed ? c_count : r_count, cols = args.transposed ? r_count : c_count;
  const TileGrid grid(args.tiling, rows, cols);
  float* amax = args.amax->f32();
  const int64_t tiles = args.amax->numel();
  // Accumulating starts each tile's max from its current value: max(old, new), a NaN in old kept.
  if (!args.accumulate) std::fill(amax, amax + tiles, 0.0f);
  const int64_t grid_rows = tiles / grid.grid_cols;
  // One thread per row of tiles: no amax is written by two threads.
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < grid_rows; ++g) {
    const int64_t end = std::min(rows, (g + 1) * grid.tile_rows);
    for (int64_t i = g * grid.tile_rows; i < end; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const float v = widen(args.transposed ? px[j * c_count + i] : px[i * c_count + j]);
        float& m = amax[grid.tile_of(i, j)];
        m = max_keeping_nan(m, v < 0.0f ? -v : v);
      }
    }
  }
  for (int64_t t = 0; t < tiles; ++t) {
    if (amax[t] != amax[t]) amax[t] = std::numeric_limits<float>::quiet_NaN();  // one NaN, whatever the input's
  }
}

template <typename T>
void quantize_codes(const Fp8QuantizeArgs& args, const T* px) {
  const Tensor& x = *args.x;
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const TileGrid grid(args.tiling, rows, cols);
  const float* scale = args.scale->f32();
  auto* codes = static_cast<uint8_t*>(args.codes->data());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      codes[i * cols + j] = fp8_encode(widen(px[i * cols + j]) * scale[grid.tile_of(i, j)], args.format, true);
    }
  }
  if (args.codes_t == nullptr) return;
  const TileGrid grid_t(args.tiling, cols, rows);
  const float* scale_t = args.scale_t->f32();
  auto* codes_t = static_cast<uint8_t*>(args.codes_t->data());
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      codes_t[j * rows + i] = fp8_encode(widen(px[i * cols + j]) * scale_t[grid_t.tile_of(j, i)], args.format, true);
    }
  }
}

}  // namespace

void CpuBackend::fp8_amax(const Fp8AmaxArgs& args) {
  with_float_input(*args.x, [&](const auto* px) { amax_tiles(args, px); });
}

void CpuBackend::fp8_scale(const Fp8ScaleArgs& args) {
  const float max_finite = fp8_info(args.format).max_finite;
  const float* amax = args.amax->f32();
  float* scale = args.scale->f32();
  float* scale_inv = args.scale_inv->f32();
  int64_t non_finite = 0;
  for (int64_t t = 0; t < args.amax->numel(); ++t) {
    const float fallback = args.options.keep_previous ? scale[t] : 1.0f;
    const Fp8Scale s =
        fp8_scale_from_amax(amax[t], max_finite, args.options.margin, fallback, args.options.power_of_two);
    scale[t] = s.scale;
    scale_inv[t] = 1.0f / s.scale;
    if (s.state == Fp8AmaxState::kNonFinite) ++non_finite;
  }
  args.non_finite->i32()[0] += static_cast<int32_t>(non_finite);
}

void CpuBackend::fp8_quantize(const Fp8QuantizeArgs& args) {
  with_float_input(*args.x, [&](const auto* px) { quantize_codes(args, px); });
}

void CpuBackend::fp8_dequantize(const Fp8DequantizeArgs& args) {
  const Tensor& codes_tensor = *args.codes;
  const int64_t rows = codes_tensor.dim(0), cols = codes_tensor.dim(1);
  const auto* codes = static_cast<const uint8_t*>(codes_tensor.data());
  const TileGrid grid(args.tiling, rows, cols);
  const float* scale_inv = args.scale_inv->f32();
  float* y = args.y->f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      y[i * cols + j] = fp8_decode(codes[i * cols + j], args.format) * scale_inv[grid.tile_of(i, j)];
    }
  }
}

}  // namespace primus
