#include "parallel/gather_text.h"

#include <algorithm>
#include <cstring>

#include "ops/ops.h"

namespace primus {

std::vector<int64_t> all_gather_i64(Communicator& comm, const std::vector<int64_t>& mine) {
  const auto n = static_cast<int64_t>(mine.size());
  Tensor host = Tensor::empty({n}, DType::kI64);
  std::copy(mine.begin(), mine.end(), static_cast<int64_t*>(host.data()));
  const Tensor in = ops::to_device(host, comm.device());
  Tensor out = Tensor::empty({n * comm.size()}, DType::kI64, comm.device());
  comm.all_gather(in, out);
  if (!comm.device().is_cpu()) ops::synchronize(comm.device());  // NCCL's stream is not the copy's
  const Tensor back = ops::to_device(out, kCpuDevice);
  const auto* values = static_cast<const int64_t*>(back.data());
  return std::vector<int64_t>(values, values + n * comm.size());
}

std::vector<std::string> all_gather_text(Communicator& comm, const std::string& text) {
  const std::vector<int64_t> lengths = all_gather_i64(comm, {static_cast<int64_t>(text.size())});
  const int64_t words = std::max<int64_t>(1, (*std::max_element(lengths.begin(), lengths.end()) + 7) / 8);
  std::vector<int64_t> packed(static_cast<size_t>(words), 0);
  std::memcpy(packed.data(), text.data(), text.size());
  const std::vector<int64_t> all = all_gather_i64(comm, packed);
  std::vector<std::string> texts;
  for (int r = 0; r < comm.size(); ++r) {
    const char* bytes = reinterpret_cast<const char*>(all.data() + static_cast<size_t>(r) * static_cast<size_t>(words));
    texts.emplace_back(bytes, static_cast<size_t>(lengths[static_cast<size_t>(r)]));
  }
  return texts;
}

}  // namespace primus
