// fp8 quantisation op entry points: shape, dtype and device checks naming the op and its tensors, then dispatch to
// the backend of the tensors' device (fp8_ops.h).
#include "ops/fp8_ops.h"

#include <initializer_list>

#include "ops/checked_args.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus::ops {

namespace {

#define FP8_CHECK(cond, ...) PRIMUS_CHECK(cond, "[op {}] {}", op, fmt::format(__VA_ARGS__))

// A non-empty matrix.
void check_matrix(const char* op, const char* name, const Tensor& t) {
  FP8_CHECK(t.defined() && t.ndim() == 2 && t.numel() > 0, "{} is {} but must be a non-empty matrix [R, C]", name,
            t.defined() ? t.describe() : "undefined");
}

void check_tiling(const char* op, Fp8Tiling tiling) {
  FP8_CHECK(tiling.rows >= 0 && tiling.cols >= 0, "tiling {} x {} must be non-negative (0: the whole dimension)",
            tiling.rows, tiling.cols);
}

}  // namespace

Shape fp8_tile_grid(int64_t rows, int64_t cols, Fp8Tiling tiling) {
  auto count = [](int64_t size, int64_t tile) { return tile == 0 ? 1 : (size + tile - 1) / tile; };
  return {count(rows, tiling.rows), count(cols, tiling.cols)};
}

void fp8_amax(const Tensor& x, Fp8Tiling tiling, Tensor& amax, bool transposed) {
  const char* op = "fp8_amax";
  const ProfileScope profile_scope(op);
  check_matrix(op, "x", x);
  check_tiling(op, tiling);
  const Shape grid = transposed ? fp8_tile_grid(x.dim(1), x.dim(0), tiling) : fp8_tile_grid(x.dim(0), x.dim(1), tiling);
  Backend& b = checked_backend(op, {{"x", &x, DType::kF32, x.shape()}, {"amax", &amax, DType::kF32, grid}});
  b.fp8_amax(Fp8AmaxArgs{.x = &x, .tiling = tiling, .transposed = transposed, .amax = &amax});
}

void fp8_scale(const Tensor& amax, Fp8Format format, Fp8ScaleOptions options, Tensor& scale, Tensor& scale_inv,
               Tensor& non_finite) {
  const char* op = "fp8_scale";
  const ProfileScope profile_scope(op);
  FP8_CHECK(amax.defined(), "amax is undefined");
  FP8_CHECK(options.margin >= 0 && options.margin <= 64, "margin {} must lie in [0, 64]", options.margin);
  Backend& b = checked_backend(op, {{"amax", &amax, DType::kF32, amax.shape()},
                                    {"scale", &scale, DType::kF32, amax.shape()},
                                    {"scale_inv", &scale_inv, DType::kF32, amax.shape()},
                                    {"non_finite", &non_finite, DType::kI32, {1}}});
  b.fp8_scale(Fp8ScaleArgs{.amax = &amax,
                           .format = format,
                           .options = options,
                           .scale = &scale,
                           .scale_inv = &scale_inv,
                           .non_finite = &non_finite});
}

void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Fp8Tiling tiling, Tensor& codes) {
  const char* op = "fp8_quantize";
  const ProfileScope profile_scope(op);
  check_matrix(op, "x", x);
  check_tiling(op, tiling);
  Backend& b = checked_backend(op, {{"x", &x, DType::kF32, x.shape()},
                                    {"scale", &scale, DType::kF32, fp8_tile_grid(x.dim(0), x.dim(1), tiling)},
                                    {"codes", &codes, DType::kU8, x.shape()}});
  b.fp8_quantize(Fp8QuantizeArgs{.x = &x, .format = format, .tiling = tiling, .scale = &scale, .codes = &codes});
}

void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Fp8Tiling tiling, Tensor& codes,
                  const Tensor& scale_t, Tensor& codes_t) {
  const char* op = "fp8_quantize";
  const ProfileScope profile_scope(op);
  check_matrix(op, "x", x);
  check_tiling(op, tiling);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Backend& b = checked_backend(op, {{"x", &x, DType::kF32, x.shape()},
                                    {"scale", &scale, DType::kF32, fp8_tile_grid(rows, cols, tiling)},
                                    {"codes", &codes, DType::kU8, x.shape()},
                                    {"scale_t", &scale_t, DType::kF32, fp8_tile_grid(cols, rows, tiling)},
                                    {"codes_t", &codes_t, DType::kU8, {cols, rows}}});
  b.fp8_quantize(Fp8QuantizeArgs{.x = &x,
                                 .format = format,
                                 .tiling = tiling,
                                 .scale = &scale,
                                 .codes = &codes,
                                 .scale_t = &scale_t,
                                 .codes_t = &codes_t});
}

void fp8_dequantize(const Tensor& codes, const Tensor& scale_inv, Fp8Format format, Fp8Tiling tiling, Tensor& y) {
  const char* op = "fp8_dequantize";
  const ProfileScope profile_scope(op);
  check_matrix(op, "codes", codes);
  check_tiling(op, tiling);
  Backend& b = checked_backend(
      op, {{"codes", &codes, DType::kU8, codes.shape()},
           {"scale_inv", &scale_inv, DType::kF32, fp8_tile_grid(codes.dim(0), codes.dim(1), tiling)},
           {"y", &y, DType::kF32, codes.shape()}});
  b.fp8_dequantize(
      Fp8DequantizeArgs{.codes = &codes, .format = format, .tiling = tiling, .scale_inv = &scale_inv, .y = &y});
}

}  // namespace primus::ops
