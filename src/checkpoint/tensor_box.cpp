// Boxes of tensors, their strided runs, the per-tensor coverage check and the copy of a box's range from pieces.
#include "checkpoint/tensor_box.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/error.h"

namespace primus {

namespace {

// Elements per step along dimension d of a tensor of `whole` (the product of the dimensions after it).
int64_t inner_size(const Shape& whole, size_t d) {
  int64_t n = 1;
  for (size_t j = d + 1; j < whole.size(); ++j) n *= whole[j];
  return n;
}

bool boxes_overlap(const TensorBox& a, const TensorBox& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    if (a.offset[d] + a.shape[d] <= b.offset[d] || b.offset[d] + b.shape[d] <= a.offset[d]) return false;
  }
  return true;
}

}  // namespace

TensorBox TensorBox::whole(const Shape& shape) { return TensorBox{Shape(shape.size(), 0), shape}; }

bool TensorBox::is_whole(const Shape& whole_shape) const { return *this == whole(whole_shape); }

std::string TensorBox::str() const {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    s += fmt::format("{}{}:{}", d > 0 ? ", " : "", offset[d], offset[d] + shape[d]);
  }
  return s + "]";
}

std::string box_flaw(const TensorBox& box, const Shape& whole) {
  if (box.offset.size() != whole.size() || box.shape.size() != whole.size()) {
    return fmt::format("box offset {} and shape {} do not both have the tensor's {} dimensions", shape_str(box.offset),
                       shape_str(box.shape), whole.size());
  }
  for (size_t d = 0; d < whole.size(); ++d) {
    // offset + shape <= whole without overflow: both non-negative and each at most whole.
    if (box.offset[d] < 0 || box.shape[d] < 0 || box.offset[d] > whole[d] || box.shape[d] > whole[d] - box.offset[d]) {
      return fmt::format("box {} lies outside the tensor's shape {}", box.str(), shape_str(whole));
    }
  }
  if (box.numel() == 0) return {};
  // The innermost dimension the box does not span whole; every dimension from the outermost one of extent > 1 to
  // it (exclusive) must be whole, or the runs are not equally spaced.
  int partial = -1;
  for (int d = static_cast<int>(whole.size()) - 1; d >= 0; --d) {
    if (box.shape[static_cast<size_t>(d)] != whole[static_cast<size_t>(d)]) {
      partial = d;
      break;
    }
  }
  int outermost = -1;
  for (int d = 0; d < partial; ++d) {
    if (outermost < 0 && box.shape[static_cast<size_t>(d)] > 1) outermost = d;
    if (outermost >= 0 && d > outermost && box.shape[static_cast<size_t>(d)] != whole[static_cast<size_t>(d)]) {
      return fmt::format(
          "box {} of a tensor of shape {} is not equally spaced runs of its elements (at most one "
          "partial dimension may have others outside it)",
          box.str(), shape_str(whole));
    }
  }
  return {};
}

StridedRuns strided_runs(const TensorBox& box, const Shape& whole) {
  const std::string flaw = box_flaw(box, whole);
  PRIMUS_CHECK(flaw.empty(), "[checkpoint] {}", flaw);
  StridedRuns r;
  if (box.numel() == 0) return r;
  int partial = -1;
  for (int d = static_cast<int>(whole.size()) - 1; d >= 0 && partial < 0; --d) {
    if (box.shape[static_cast<size_t>(d)] != whole[static_cast<size_t>(d)]) partial = d;
  }
  if (partial < 0) {  // the whole tensor
    r.runs = 1;
    r.run = r.stride = box.numel();
    return r;
  }
  const auto p = static_cast<size_t>(partial);
  r.run = box.shape[p] * inner_size(whole, p);
  r.runs = 1;
  for (size_t d = 0; d < p; ++d) r.runs *= box.shape[d];
  r.stride = r.runs > 1 ? whole[p] * inner_size(whole, p) : r.run;
  for (size_t d = 0; d < whole.size(); ++d) r.begin += box.offset[d] * inner_size(whole, d);
  return r;
}

std::string coverage_flaw(const Shape& whole, const std::vector<TensorPiece>& pieces) {
  const int64_t numel = shape_numel(whole);
  auto where = [&](const TensorBox& box) {
    return box.is_whole(whole) ? std::string("the tensor") : "box " + box.str();
  };
  // The pieces of each box, in order of their first element.
  std::map<std::pair<Shape, Shape>, std::vector<const TensorPiece*>> by_box;
  for (const TensorPiece& p : pieces) {
    if (std::string flaw = box_flaw(p.box, whole); !flaw.empty()) return fmt::format("{}'s piece: {}", p.owner, flaw);
    if (p.begin < 0 || p.end < p.begin || p.end > p.box.numel()) {
      return fmt::format("{}'s piece [{}, {}) lies outside its box {} of {} elements", p.owner, p.begin, p.end,
                         p.box.str(), p.box.numel());
    }
    if (p.end > p.begin) by_box[{p.box.offset, p.box.shape}].push_back(&p);
  }
  int64_t held = 0;
  std::vector<const TensorPiece*> boxes;  // one piece of each box
  for (auto& [box, list] : by_box) {
    std::sort(list.begin(), list.end(), [](const TensorPiece* a, const TensorPiece* b) { return a->begin < b->begin; });
    for (size_t k = 1; k < list.size(); ++k) {
      if (list[k]->begin < list[k - 1]->end) {
        return fmt::format("{}'s piece [{}, {}) of {} overlaps {}'s [{}, {})", list[k]->owner, list[k]->begin,
                           list[k]->end, where(list[k]->box), list[k - 1]->owner, list[k - 1]->begin, list[k - 1]->end);
      }
    }
    for (const TensorPiece* p : list) held += p->end - p->begin;
    boxes.push_back(list.front());
  }
  for (size_t a = 0; a < boxes.size(); ++a) {
    for (size_t b = a + 1; b < boxes.size(); ++b) {
      if (boxes_overlap(boxes[a]->box, boxes[b]->box)) {
        return fmt::format("{}'s box {} overlaps {}'s box {}", boxes[b]->owner, boxes[b]->box.str(), boxes[a]->owner,
                           boxes[a]->box.str());
      }
    }
  }
  if (held == numel) return {};
  // Disjoint boxes whose pieces are disjoint: fewer elements than the tensor's means some are in no piece.
  for (const auto& [box, list] : by_box) {
    int64_t at = 0;
    for (const TensorPiece* p : list) {
      if (p->begin > at) {
        return fmt::format("elements [{}, {}) of {} are in no piece", at, p->begin, where(p->box));
      }
      at = p->end;
    }
    if (at < list.front()->box.numel()) {
      return fmt::format("elements [{}, {}) of {} are in no piece", at, list.front()->box.numel(),
                         where(list.front()->box));
    }
  }
  std::string listed;
  for (const TensorPiece* p : boxes) listed += (listed.empty() ? "" : " ") + p->box.str();
  return fmt::format("its pieces hold {} of its {} elements: their boxes {} do not fill its shape {}", held, numel,
                     listed.empty() ? "(none)" : listed, shape_str(whole));
}

int64_t copy_box_range(const StridedRuns& want, int64_t begin, int64_t end, const std::vector<RunSource>& sources,
                       const StretchCopy& copy) {
  if (begin >= end) return -1;
  PRIMUS_CHECK(want.run > 0 && begin >= 0 && end <= want.runs * want.run,
               "[checkpoint] elements [{}, {}) of a box "
               "of {} runs of {}",
               begin, end, want.runs, want.run);
  size_t hint = 0;  // consecutive stretches mostly come from the same piece
  // The piece holding whole-tensor element `pos`, and where: its element number within the piece's box.
  auto find = [&](int64_t pos, size_t& source, int64_t& at) {
    for (size_t t = 0; t < sources.size(); ++t) {
      const size_t s = (hint + t) % sources.size();
      const RunSource& src = sources[s];
      if (src.runs.run <= 0 || pos < src.runs.begin) continue;
      const int64_t j = (pos - src.runs.begin) / src.runs.stride;
      const int64_t u = pos - src.runs.begin - j * src.runs.stride;
      if (j >= src.runs.runs || u >= src.runs.run) continue;
      const int64_t f = j * src.runs.run + u;
      if (f < src.begin || f >= src.end) continue;
      source = s;
      at = f;
      return true;
    }
    return false;
  };
  for (int64_t k = begin / want.run; k * want.run < end; ++k) {
    const int64_t u0 = std::max<int64_t>(begin - k * want.run, 0);
    const int64_t u1 = std::min<int64_t>(end - k * want.run, want.run);
    const int64_t x = want.begin + k * want.stride + u0;  // this run's part: whole-tensor elements [x, x + u1 - u0)
    const int64_t dst = k * want.run + u0 - begin;
    for (int64_t pos = x; pos < x + (u1 - u0);) {
      size_t s = 0;
      int64_t f = 0;
      if (!find(pos, s, f)) return dst + (pos - x);
      hint = s;
      const RunSource& src = sources[s];
      const int64_t in_run = src.runs.run - f % src.runs.run;  // left in the piece's run
      const int64_t n = std::min({x + (u1 - u0) - pos, in_run, src.end - f});
      copy(s, f - src.begin, n, dst + (pos - x));
      pos += n;
    }
  }
  return -1;
}

}  // namespace primus
