// check_collectives(comm, seed): every collective of the Communicator seam against the result computed
// locally. Every rank regenerates every rank's random inputs from (seed, rank, call number), so it knows what
// the others contributed without asking them. Runs in forked children where gtest assertions cannot report,
// so a mismatch throws std::runtime_error naming the call, dtype, size and element.
//
// Inputs are never zeros: f32 uniform in [-1, 1]; i32 in [-1000, 1000]; i64 around ±2^40 (beyond 32 bits);
// bf16 small integers, so that sums are exact whatever order the ring adds them in.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "ops/communicator.h"

namespace primus::testing {

inline std::vector<double> random_values(uint64_t seed, int rank, int call, int64_t n, DType dtype) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(rank) * 7919u + static_cast<uint64_t>(call) * 104729u);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    switch (dtype) {
      case DType::kF32:
        x = static_cast<float>(std::uniform_real_distribution<double>(-1.0, 1.0)(rng));
        break;
      case DType::kI32:
        x = static_cast<double>(std::uniform_int_distribution<int>(-1000, 1000)(rng));
        break;
      case DType::kI64:
        x = static_cast<double>((int64_t{1} << 40) * (rng() % 2 ? 1 : -1) +
                                std::uniform_int_distribution<int64_t>(-1000, 1000)(rng));
        break;
      default:  // bf16
        x = static_cast<double>(std::uniform_int_distribution<int>(-8, 8)(rng));
        break;
    }
  }
  return v;
}

inline Tensor to_tensor(const std::vector<double>& v, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        static_cast<float*>(t.data())[i] = static_cast<float>(v[i]);
        break;
      case DType::kI32:
        static_cast<int32_t*>(t.data())[i] = static_cast<int32_t>(v[i]);
        break;
      case DType::kI64:
        static_cast<int64_t*>(t.data())[i] = static_cast<int64_t>(v[i]);
        break;
      default:
        static_cast<uint16_t*>(t.data())[i] = f32_to_bf16(static_cast<float>(v[i]));
        break;
    }
  }
  return t;
}

inline void write_into(Tensor& t, const std::vector<double>& v) {
  Tensor src = to_tensor(v, t.dtype());
  if (t.nbytes() > 0) std::memcpy(t.data(), src.data(), t.nbytes());
}

inline std::vector<double> from_tensor(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t.dtype()) {
      case DType::kF32:
        v[i] = static_cast<const float*>(t.data())[i];
        break;
      case DType::kI32:
        v[i] = static_cast<const int32_t*>(t.data())[i];
        break;
      case DType::kI64:
        v[i] = static_cast<double>(static_cast<const int64_t*>(t.data())[i]);
        break;
      default:
        v[i] = bf16_to_f32(static_cast<const uint16_t*>(t.data())[i]);
        break;
    }
  }
  return v;
}

inline double reduce(ReduceOp op, double a, double b) {
  return op == ReduceOp::kSum ? a + b : op == ReduceOp::kMax ? std::max(a, b) : std::min(a, b);
}

inline void require_equal(const std::vector<double>& got, const std::vector<double>& want, DType dtype,
                          const std::string& what) {
  if (got.size() != want.size()) {
    throw std::runtime_error(fmt::format("{}: {} elements, want {}", what, got.size(), want.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = dtype == DType::kF32 ? 1e-5 * (1.0 + std::fabs(want[i])) : 0.0;
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      throw std::runtime_error(
          fmt::format("{} {}: element {} is {}, want {}", what, dtype_name(dtype), i, got[i], want[i]));
    }
  }
}

inline void check_collectives(Communicator& comm, uint64_t seed) {
  const int size = comm.size();
  const int me = comm.rank();
  int call = 0;
  const DType all_types[] = {DType::kF32, DType::kI32, DType::kI64, DType::kBF16};
  const ReduceOp all_ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  auto inputs = [&](int64_t n, DType dtype) {
    ++call;
    std::vector<std::vector<double>> in;
    for (int r = 0; r < size; ++r) in.push_back(random_values(seed, r, call, n, dtype));
    return in;
  };
  auto label = [&](const char* op, int64_t n) { return fmt::format("{} n={} on rank {} of {}", op, n, me, size); };

  // all_reduce: every dtype and op; 300001 f32 spans several of Gloo's 1 MiB ring segments.
  for (DType dtype : all_types) {
    for (ReduceOp op : all_ops) {
      for (int64_t n : {1, 7, 1000}) {
        auto in = inputs(n, dtype);
        Tensor buf = to_tensor(in[me], dtype);
        comm.all_reduce(buf, op);
        std::vector<double> want = in[0];
        for (int r = 1; r < size; ++r)
          for (int64_t i = 0; i < n; ++i) want[i] = reduce(op, want[i], in[r][i]);
        require_equal(from_tensor(buf), want, dtype, label("all_reduce", n) + " " + reduce_op_name(op));
      }
    }
  }
  {
    auto in = inputs(300001, DType::kF32);
    Tensor buf = to_tensor(in[me], DType::kF32);
    comm.all_reduce(buf, ReduceOp::kSum);
    std::vector<double> want(in[0].size(), 0.0);
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < want.size(); ++i) want[i] += in[r][i];
    require_equal(from_tensor(buf), want, DType::kF32, label("all_reduce", 300001));
  }

  // reduce_scatter, into a separate out and in place (out = this rank's block of in).
  for (DType dtype : all_types) {
    for (ReduceOp op : all_ops) {
      for (int64_t n : {1, 5, 1000}) {
        for (bool in_place : {false, true}) {
          auto in = inputs(size * n, dtype);
          Tensor src = to_tensor(in[me], dtype);
          Tensor out = in_place ? src.slice_elements(me * n, {n}) : Tensor::empty({n}, dtype);
          comm.reduce_scatter(src, out, op);
          std::vector<double> want(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) {
            want[i] = in[0][me * n + i];
            for (int r = 1; r < size; ++r) want[i] = reduce(op, want[i], in[r][me * n + i]);
          }
          require_equal(from_tensor(out), want, dtype,
                        label(in_place ? "reduce_scatter in place" : "reduce_scatter", n) + " " + reduce_op_name(op));
        }
      }
    }
  }

  // all_gather, separate and in place.
  for (DType dtype : {DType::kF32, DType::kI64, DType::kBF16}) {
    for (int64_t n : {1, 7, 1000}) {
      for (bool in_place : {false, true}) {
        auto in = inputs(n, dtype);
        Tensor out = Tensor::empty({size * n}, dtype);
        Tensor mine = in_place ? out.slice_elements(me * n, {n}) : to_tensor(in[me], dtype);
        if (in_place) write_into(mine, in[me]);
        comm.all_gather(mine, out);
        std::vector<double> want;
        for (int r = 0; r < size; ++r) want.insert(want.end(), in[r].begin(), in[r].end());
        require_equal(from_tensor(out), want, dtype, label(in_place ? "all_gather in place" : "all_gather", n));
      }
    }
  }

  // all_to_all: block j of rank i's input lands as block i of rank j's output.
  for (DType dtype : {DType::kF32, DType::kI32}) {
    for (int64_t n : {1, 33}) {
      auto in = inputs(size * n, dtype);
      Tensor src = to_tensor(in[me], dtype);
      Tensor out = Tensor::empty({size * n}, dtype);
      comm.all_to_all(src, out);
      std::vector<double> want;
      for (int r = 0; r < size; ++r) want.insert(want.end(), in[r].begin() + me * n, in[r].begin() + (me + 1) * n);
      require_equal(from_tensor(out), want, dtype, label("all_to_all", n));
    }
  }

  // all_to_all_v with random counts (zeros included), taken from the start of in, landing in rank order.
  for (int round = 0; round < 3; ++round) {
    ++call;
    auto count = [&](int from, int to) {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(call * 131 + from * 17 + to));
      return static_cast<int64_t>(rng() % 6);
    };
    std::vector<std::vector<double>> in;
    for (int r = 0; r < size; ++r) {
      int64_t total = 0;
      for (int j = 0; j < size; ++j) total += count(r, j);
      in.push_back(random_values(seed, r, call, total + 2, DType::kF32));  // 2 spare elements at the end
    }
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<double> want;
    for (int j = 0; j < size; ++j) send_counts.push_back(count(me, j));
    for (int i = 0; i < size; ++i) {
      recv_counts.push_back(count(i, me));
      int64_t offset = 0;
      for (int j = 0; j < me; ++j) offset += count(i, j);
      want.insert(want.end(), in[i].begin() + offset, in[i].begin() + offset + count(i, me));
    }
    Tensor src = to_tensor(in[me], DType::kF32);
    Tensor out = Tensor::empty({static_cast<int64_t>(want.size())}, DType::kF32);
    comm.all_to_all_v(src, send_counts, out, recv_counts);
    require_equal(from_tensor(out), want, DType::kF32, label("all_to_all_v", static_cast<int64_t>(want.size())));
  }

  // broadcast from every root.
  for (int root = 0; root < size; ++root) {
    for (DType dtype : {DType::kF32, DType::kI64}) {
      auto in = inputs(100, dtype);
      Tensor buf = to_tensor(in[me], dtype);
      comm.broadcast(buf, root);
      require_equal(from_tensor(buf), in[root], dtype, label("broadcast", 100) + fmt::format(" root {}", root));
    }
  }

  // Empty buffers: nothing to move, nobody waits.
  {
    Tensor empty = Tensor::empty({0}, DType::kF32);
    Tensor empty_out = Tensor::empty({0}, DType::kF32);
    comm.all_reduce(empty, ReduceOp::kSum);
    comm.reduce_scatter(empty, empty_out, ReduceOp::kSum);
    comm.all_gather(empty, empty_out);
    comm.all_to_all(empty, empty_out);
    comm.broadcast(empty, 0);
  }

  // send/recv around the ring: rank 0 sends first, the others receive first (a send waits for its recv).
  {
    auto in = inputs(257, DType::kF32);
    const int next = (me + 1) % size, prev = (me + size - 1) % size;
    Tensor mine = to_tensor(in[me], DType::kF32);
    Tensor got = Tensor::empty({257}, DType::kF32);
    if (me == 0) {
      comm.send(mine, next);
      comm.recv(got, prev);
    } else {
      comm.recv(got, prev);
      comm.send(mine, next);
    }
    require_equal(from_tensor(got), in[prev], DType::kF32, label("send/recv ring", 257));
  }
  // Several messages between a pair arrive in order, whatever their sizes; a rank may send to itself.
  if (size >= 2 && me < 2) {
    for (int64_t n : {3, 100000, 1}) {
      auto in = inputs(n, DType::kI64);
      Tensor buf = me == 0 ? to_tensor(in[0], DType::kI64) : Tensor::empty({n}, DType::kI64);
      if (me == 0) {
        comm.send(buf, 1);
      } else {
        comm.recv(buf, 0);
        require_equal(from_tensor(buf), in[0], DType::kI64, label("send/recv in order", n));
      }
    }
  }
  {
    auto in = inputs(9, DType::kI32);
    Tensor mine = to_tensor(in[me], DType::kI32);
    Tensor got = Tensor::empty({9}, DType::kI32);
    comm.send(mine, me);
    comm.recv(got, me);
    require_equal(from_tensor(got), in[me], DType::kI32, label("send to self", 9));
  }

  // barrier: nobody leaves before the last one arrives (rank 0 comes 300 ms late).
  {
    const auto start = std::chrono::steady_clock::now();
    if (me == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm.barrier();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (size > 1 && waited < 0.15) {
      throw std::runtime_error(
          fmt::format("barrier on rank {} of {} returned after {} s, before rank 0 arrived", me, size, waited));
    }
  }

  // split by parity, ordered by descending rank (key = -rank), then a split of the split.
  {
    std::unique_ptr<Communicator> group = comm.split(me % 2, -me);
    std::vector<double> members;  // parent ranks of the group in its rank order
    for (int r = size - 1; r >= 0; --r)
      if (r % 2 == me % 2) members.push_back(r);
    const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
    if (group->size() != static_cast<int>(members.size()) || group->rank() != want_rank) {
      throw std::runtime_error(fmt::format("split on rank {} of {}: got rank {} of {}, want {} of {}", me, size,
                                           group->rank(), group->size(), want_rank, members.size()));
    }
    Tensor mine = to_tensor({static_cast<double>(me)}, DType::kI64);
    Tensor all = Tensor::empty({group->size()}, DType::kI64);
    group->all_gather(mine, all);
    require_equal(from_tensor(all), members, DType::kI64, label("split all_gather", 1));
    std::unique_ptr<Communicator> again = group->split(0, group->rank());
    if (again->size() != group->size() || again->rank() != group->rank()) {
      throw std::runtime_error(
          fmt::format("split of a split on rank {}: rank {} of {}", me, again->rank(), again->size()));
    }
    Tensor sum = to_tensor({static_cast<double>(me)}, DType::kI64);
    again->all_reduce(sum, ReduceOp::kSum);
    double want = 0;
    for (double r : members) want += r;
    require_equal(from_tensor(sum), {want}, DType::kI64, label("split of split all_reduce", 1));
    comm.barrier();
  }
}

}  // namespace primus::testing
