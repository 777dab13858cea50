// Where a stored piece lies in its logical tensor, whatever layout wrote it. A tensor-parallel rank holds a box of
// a parameter (rows [r0, r0 + R) of a column-parallel weight, columns [c0, c0 + C) of a row-parallel one, the whole
// of a replicated one), and a data-parallel rank saves a flat range of that box, which may start and end inside a
// row. So a piece is elements [begin, end) of a box, the box's elements numbered row-major as the rank's own
// tensor numbers them; an unsliced checkpoint's pieces are flat ranges of the whole tensor (its box). In the whole
// tensor's flattening a box is equally spaced runs of elements (a column slice: one run per row), so a box must be
// that: every dimension between its outermost one of extent > 1 and its innermost partial one is whole.
//
// The check that a checkpoint is complete is per logical tensor (coverage_flaw): every element of it held by
// exactly one piece, whichever ranks wrote them. A rank that holds only some tensors (a pipeline stage) writes
// pieces of those only; each tensor is checked on its own. Internal to src/checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace primus {

// Along each dimension d, indices [offset[d], offset[d] + shape[d]) of the whole tensor.
struct TensorBox {
  Shape offset;
  Shape shape;
  static TensorBox whole(const Shape& shape);
  int64_t numel() const { return shape_numel(shape); }
  bool is_whole(const Shape& whole_shape) const;
  bool operator==(const TensorBox&) const = default;
  // "[0:64, 32:64]" (half-open ranges per dimension).
  std::string str() const;
};

// A box as runs of the whole tensor's row-major flattening: run k (k < runs) is elements
// [begin + k·stride, begin + k·stride + run); the box's own numbering goes through the runs in order.
struct StridedRuns {
  int64_t begin = 0;
  int64_t runs = 0;
  int64_t run = 0;
  int64_t stride = 1;  // >= run; run when there is one run
};

// "" when `box` is a box of a tensor of `whole` that strided_runs can describe; else why not.
std::string box_flaw(const TensorBox& box, const Shape& whole);
// The runs of a box without a flaw (box_flaw), checked.
StridedRuns strided_runs(const TensorBox& box, const Shape& whole);

// A stored piece of a tensor: elements [begin, end) of `box`.
struct TensorPiece {
  TensorBox box;
  int64_t begin = 0;
  int64_t end = 0;
  std::string owner;  // for messages: "rank 3", the file that holds it
};

// "" when the pieces hold every element of a tensor of `whole` exactly once; else the first flaw found: a box
// outside the tensor or not a strided one, a range outside its box, two pieces of one box that overlap, two boxes
// that overlap (pieces of different boxes must lie in disjoint boxes, as every layout writes them), elements no
// piece holds.
std::string coverage_flaw(const Shape& whole, const std::vector<TensorPiece>& pieces);

// Copies elements [begin, end) of the box whose runs are `want` from the pieces whose runs are `sources[i]` and
// ranges [source_begin[i], source_end[i]): calls copy(i, offset from source_begin[i], count, offset from begin)
// for each stretch, in order. Returns -1, or the first element (from begin) that no piece holds.
struct RunSource {
  StridedRuns runs;
  int64_t begin = 0;
  int64_t end = 0;
};
using StretchCopy = std::function<void(size_t source, int64_t source_offset, int64_t count, int64_t dst_offset)>;
int64_t copy_box_range(const StridedRuns& want, int64_t begin, int64_t end, const std::vector<RunSource>& sources,
                       const StretchCopy& copy);

}  // namespace primus
