// fp8 quantisation op entry points: shape, dtype and device checks naming the op and its tensors, then dispatch to
// the backend of the tensors' device (fp8_ops.h).
#include "ops/fp8_ops.h"

#include <initializer_list>
#include <string>

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

// The dtype of x in the quantisation ops: f32, or bf16 (activations of the CUDA engine), both read as f32 values.
DType float_input_dtype(const char* op, const Tensor& x) {
  FP8_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, "x is {} but must be f32 or bf16", x.describe());
  return x.dtype();
}

bool is_tiling(Fp8Tiling t, int64_t rows, int64_t cols) { return t.rows == rows && t.cols == cols; }

std::string tiling_str(Fp8Tiling t) { return fmt::format("{}x{}", t.rows, t.cols); }

bool is_fnuz(Fp8Format f) { return f == Fp8Format::kE4M3Fnuz || f == Fp8Format::kE5M2Fnuz; }
bool is_e5m2(Fp8Format f) { return f == Fp8Format::kE5M2 || f == Fp8Format::kE5M2Fnuz; }

// The operand pairs the GEMM takes (fp8_ops.h): a tensorwise pair, or the blockwise recipe's 1x128 activations and
// gradients with 128x128 weights or (weight gradient) 1x128 transposed activations.
void check_gemm_operands(const char* op, const Fp8Operand& a, const Fp8Operand& b) {
  const bool a_tensorwise = is_tiling(a.tiling, 0, 0), b_tensorwise = is_tiling(b.tiling, 0, 0);
  const bool a_blockwise = is_tiling(a.tiling, 1, 128);
  const bool b_blockwise = is_tiling(b.tiling, 128, 128) || is_tiling(b.tiling, 1, 128);
  FP8_CHECK((a_tensorwise && b_tensorwise) || (a_blockwise && b_blockwise),
            "tilings a {} with b {} are not supported: both tensorwise (0x0), or a 1x128 with b 128x128 or 1x128",
            tiling_str(a.tiling), tiling_str(b.tiling));
  FP8_CHECK(is_fnuz(a.format) == is_fnuz(b.format), "formats a {} with b {} mix the OCP and the fnuz pair",
            fp8_format_name(a.format), fp8_format_name(b.format));
  FP8_CHECK(!(is_e5m2(a.format) && is_e5m2(b.format)),
            "formats a {} with b {}: two e5m2 operands are not supported (no recipe multiplies two gradients)",
            fp8_format_name(a.format), fp8_format_name(b.format));
}

}  // namespace

Shape fp8_tile_grid(int64_t rows, int64_t cols, Fp8Tiling tiling) {
  auto count = [](int64_t size, int64_t tile) { return tile == 0 ? 1 : (size + tile - 1) / tile; };
  return {count(rows, tiling.rows), count(cols, tiling.cols)};
}

void fp8_amax(const Tensor& x, Fp8Tiling tiling, Tensor& amax, bool transposed, bool accumulate) {
  const char* op = "fp8_amax";
  const ProfileScope profile_scope(op);
  check_matrix(op, "x", x);
  check_tiling(op, tiling);
  const Shape grid = transposed ? fp8_tile_grid(x.dim(1), x.dim(0), tiling) : fp8_tile_grid(x.dim(0), x.dim(1), tiling);
  Backend& b =
      checked_backend(op, {{"x", &x, float_input_dtype(op, x), x.shape()}, {"amax", &amax, DType::kF32, grid}});
  b.fp8_amax(
      Fp8AmaxArgs{.x = &x, .tiling = tiling, .transposed = transposed, .accumulate = accumulate, .amax = &amax});
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
  Backend& b = checked_backend(op, {{"x", &x, float_input_dtype(op, x), x.shape()},
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
  Backend& b = checked_backend(op, {{"x", &x, float_input_dtype(op, x), x.shape()},
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

void fp8_gemm(const Fp8Operand& a, const Fp8Operand& b, Tensor& c, Fp8GemmOptions options) {
  const char* op = "fp8_gemm";
  const ProfileScope profile_scope(op);
  FP8_CHECK(a.codes != nullptr && a.scale_inv != nullptr && b.codes != nullptr && b.scale_inv != nullptr,
            "every operand needs its codes and scale_inv");
  check_matrix(op, "a", *a.codes);
  check_matrix(op, "b", *b.codes);
  check_tiling(op, a.tiling);
  check_tiling(op, b.tiling);
  check_gemm_operands(op, a, b);
  FP8_CHECK(!options.fast_accumulation || (is_tiling(a.tiling, 0, 0) && is_tiling(b.tiling, 0, 0)),
            "fast_accumulation is for tensorwise scaling only (a is {}, b is {})", tiling_str(a.tiling),
            tiling_str(b.tiling));
  const int64_t m = a.codes->dim(0), k = a.codes->dim(1), n = b.codes->dim(0);
  FP8_CHECK(b.codes->dim(1) == k, "b is {} but must be [N, K] with a's K = {} (both operands K-contiguous)",
            b.codes->describe(), k);
  FP8_CHECK(c.defined() && (c.dtype() == DType::kF32 || c.dtype() == DType::kBF16), "c is {} but must be f32 or bf16",
            c.defined() ? c.describe() : "undefined");
  Backend& backend = checked_backend(op, {{"a", a.codes, DType::kU8, {m, k}},
                                          {"a_scale_inv", a.scale_inv, DType::kF32, fp8_tile_grid(m, k, a.tiling)},
                                          {"b", b.codes, DType::kU8, {n, k}},
                                          {"b_scale_inv", b.scale_inv, DType::kF32, fp8_tile_grid(n, k, b.tiling)},
                                          {"c", &c, c.dtype(), {m, n}}});
  backend.fp8_gemm(Fp8GemmArgs{.a = a.codes,
                               .a_format = a.format,
                               .a_tiling = a.tiling,
                               .a_scale_inv = a.scale_inv,
                               .b = b.codes,
                               .b_format = b.format,
                               .b_tiling = b.tiling,
                               .b_scale_inv = b.scale_inv,
                               .c = &c,
                               .accumulate = options.accumulate,
                               .fast_accumulation = options.fast_accumulation});
}

}  // namespace primus::ops
