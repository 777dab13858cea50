// The sharded save: shard pieces, the exchanges that make every rank agree on the outcome, the index and the
// commit on rank 0.
#include "checkpoint/sharded_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_catalog.h"
#include "core/error.h"
#include "ops/ops.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Fields of the record each rank all_gathers after writing its shard.
enum RecordField : int64_t { kOk, kBytes, kCrc32c, kPieces, kNumel, kRecordFields };

// Collectives on host vectors; the communicator's buffers live on its device.
std::vector<int64_t> all_gather_i64(Communicator& group, const std::vector<int64_t>& mine) {
  const auto n = static_cast<int64_t>(mine.size());
  Tensor host = Tensor::empty({n}, DType::kI64);
  std::copy(mine.begin(), mine.end(), static_cast<int64_t*>(host.data()));
  const Tensor in = ops::to_device(host, group.device());
  Tensor out = Tensor::empty({n * group.size()}, DType::kI64, group.device());
  group.all_gather(in, out);
  if (!group.device().is_cpu()) ops::synchronize(group.device());
  const Tensor back = ops::to_device(out, kCpuDevice);
  const auto* values = static_cast<const int64_t*>(back.data());
  return std::vector<int64_t>(values, values + n * group.size());
}

int64_t broadcast_i64(Communicator& group, int64_t value, int root) {
  Tensor host = Tensor::empty({1}, DType::kI64);
  *static_cast<int64_t*>(host.data()) = value;
  Tensor buf = ops::to_device(host, group.device());
  group.broadcast(buf, root);
  if (!group.device().is_cpu()) ops::synchronize(group.device());
  return *static_cast<const int64_t*>(ops::to_device(buf, kCpuDevice).data());
}

// The parameter holding flat element `at`.
size_t param_at(const ParamStore& params, int64_t at) {
  size_t lo = 0, hi = params.specs().size();
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    (params.offset(mid) <= at ? lo : hi) = mid;
  }
  return lo;
}

// A rank's ranges cut at tensor boundaries: each piece lies in one tensor. Flat elements [begin, end).
std::vector<FlatRange> shard_pieces(const ParamStore& params, std::vector<FlatRange> ranges) {
  std::erase_if(ranges, [](const FlatRange& r) { return r.empty(); });
  std::sort(ranges.begin(), ranges.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  std::vector<FlatRange> pieces;
  int64_t previous_end = 0;
  for (const FlatRange& r : ranges) {
    if (r.begin < previous_end || r.end > params.numel()) {
      throw RuntimeError(
          fmt::format("[checkpoint] range [{}, {}) overlaps another of this rank's or lies outside "
                      "the flat buffer [0, {})",
                      r.begin, r.end, params.numel()));
    }
    previous_end = r.end;
    for (int64_t at = r.begin; at < r.end;) {
      const size_t i = param_at(params, at);
      const int64_t tensor_end = params.offset(i) + shape_numel(params.specs()[i].shape);
      const int64_t end = std::min(r.end, tensor_end);
      pieces.push_back({at, end});
      at = end;
    }
  }
  return pieces;
}

// The key of each piece inside its shard: the tensor's name, or `<name>@<first element>` when the shard holds
// several pieces of it. A function of the piece list alone, so rank 0 names other ranks' pieces the same way.
std::vector<std::string> piece_keys(const ParamStore& params, const std::vector<FlatRange>& pieces) {
  std::map<size_t, int> count;
  for (const FlatRange& p : pieces) ++count[param_at(params, p.begin)];
  std::vector<std::string> keys;
  for (const FlatRange& p : pieces) {
    const size_t i = param_at(params, p.begin);
    const std::string& name = params.specs()[i].name;
    keys.push_back(count[i] == 1 ? name : fmt::format("{}@{}", name, p.begin - params.offset(i)));
  }
  return keys;
}

SafetensorsWriter::Written write_shard(const std::string& path, const ParamStore& params, const AdamW& optimizer,
                                       const std::vector<FlatRange>& pieces, const CheckpointProgressFn& progress) {
  SafetensorsWriter writer;
  const std::vector<std::string> keys = piece_keys(params, pieces);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const FlatRange p = pieces[k];
    add_views(writer, keys[k], {p.size()}, weight_views(params, optimizer, p.begin, p.end));
    add_views(writer, "exp_avg." + keys[k], {p.size()}, moment_views(optimizer, false, p.begin, p.end));
    add_views(writer, "exp_avg_sq." + keys[k], {p.size()}, moment_views(optimizer, true, p.begin, p.end));
  }
  int64_t done = 0;
  return writer.write(path, save_progress(progress, static_cast<int64_t>(writer.file_bytes()), done));
}

std::string index_text(const ParamStore& params, const std::vector<std::vector<FlatRange>>& pieces_of,
                       int64_t iteration) {
  const int size = static_cast<int>(pieces_of.size());
  json tensors = json::object();
  json files = json::array();
  for (int r = 0; r < size; ++r) {
    const std::string file = shard_file_name(r, size);
    files.push_back(file);
    const std::vector<std::string> keys = piece_keys(params, pieces_of[r]);
    for (size_t k = 0; k < pieces_of[r].size(); ++k) {
      const FlatRange p = pieces_of[r][k];
      const size_t i = param_at(params, p.begin);
      const ParamSpec& spec = params.specs()[i];
      const int64_t offset = params.offset(i);
      for (const char* prefix : {"", "exp_avg.", "exp_avg_sq."}) {
        tensors[prefix + spec.name].push_back({{"file", file},
                                               {"key", prefix + keys[k]},
                                               {"shape", spec.shape},
                                               {"slice", {p.begin - offset, p.end - offset}},
                                               {"dtype", "F32"}});
      }
    }
  }
  for (auto& [name, list] : tensors.items()) {
    std::sort(list.begin(), list.end(),
              [](const json& a, const json& b) { return a["slice"][0].get<int64_t>() < b["slice"][0].get<int64_t>(); });
  }
  const json index = {{"format", kShardedIndexFormat},
                      {"format_version", kCheckpointFormatVersion},
                      {"iteration", iteration},
                      {"world_size", size},
                      {"numel", params.numel()},
                      {"files", files},
                      {"tensors", tensors}};
  return index.dump(1) + "\n";
}

// The first flaw in how the ranks' pieces cover [0, numel), or empty when they tile it exactly.
std::string coverage_flaw(const std::vector<std::vector<FlatRange>>& pieces_of, int64_t numel) {
  std::vector<std::pair<FlatRange, int>> all;
  for (size_t r = 0; r < pieces_of.size(); ++r) {
    for (const FlatRange& p : pieces_of[r]) all.push_back({p, static_cast<int>(r)});
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
  int64_t at = 0;
  int last_rank = -1;
  for (const auto& [p, r] : all) {
    if (p.begin > at) return fmt::format("flat elements [{}, {}) belong to no rank's ranges", at, p.begin);
    if (p.begin < at) {
      return fmt::format("rank {}'s range from {} overlaps rank {}'s, which ends at {}", r, p.begin, last_rank, at);
    }
    at = p.end;
    last_rank = r;
  }
  if (at < numel) return fmt::format("flat elements [{}, {}) belong to no rank's ranges", at, numel);
  return {};
}

}  // namespace

std::string shard_file_name(int rank, int size) { return fmt::format("shard_{}_of_{}.safetensors", rank, size); }

int64_t save_sharded_checkpoint(const std::string& save_dir, const Model& model, const AdamW& optimizer,
                                const std::vector<FlatRange>& ranges, Communicator& group, const TrainerState& state,
                                const std::string& config_yaml, const CheckpointProgressFn& progress) {
  const ParamStore& params = model.params();
  const int rank = group.rank();
  const int size = group.size();
  if (size == 1) {
    // A world of one keeps the single-file format, which Hugging Face loads as it is.
    const std::string flaw = coverage_flaw({shard_pieces(params, ranges)}, params.numel());
    if (!flaw.empty()) throw RuntimeError(fmt::format("[checkpoint] save of a world of one: {}", flaw));
    return save_checkpoint(save_dir, model, optimizer, state, config_yaml, progress);
  }
  const std::string iteration_name = checkpoint_dir_name(state.iteration);
  const std::string tmp_dir = temporary_checkpoint_dir(save_dir, state.iteration);
  auto abandon = [&](const std::string& why) {
    return RuntimeError(
        fmt::format("[checkpoint] save of {} by {} ranks abandoned: {}; the latest checkpoint is "
                    "still the previous one",
                    iteration_name, size, why));
  };

  // 1. Rank 0 prepares the temporary directory; the broadcast keeps the others from writing into it before.
  std::string error;
  int64_t ok = 1;
  if (rank == 0) {
    try {
      fs::create_directories(save_dir);
      remove_stale_temporaries(save_dir);
      fs::create_directories(tmp_dir);
    } catch (const std::exception& e) {
      ok = 0;
      error = e.what();
    }
  }
  if (broadcast_i64(group, ok, 0) == 0) {
    throw abandon(rank == 0 ? error : fmt::format("rank 0 could not create {} (see its log)", tmp_dir));
  }

  // 2. Every rank writes its shard, then all learn how every rank fared.
  std::vector<FlatRange> pieces;
  SafetensorsWriter::Written written;
  try {
    pieces = shard_pieces(params, ranges);
    written = write_shard(tmp_dir + "/" + shard_file_name(rank, size), params, optimizer, pieces, progress);
  } catch (const std::exception& e) {
    ok = 0;
    error = e.what();
  }
  const std::vector<int64_t> records =
      all_gather_i64(group, {ok, static_cast<int64_t>(written.bytes), static_cast<int64_t>(written.crc32c),
                             static_cast<int64_t>(pieces.size()), params.numel()});
  auto field = [&](int r, RecordField f) { return records[static_cast<size_t>(r * kRecordFields + f)]; };
  std::vector<int> failed;
  int64_t max_pieces = 0;
  int64_t total_bytes = 0;
  for (int r = 0; r < size; ++r) {
    if (field(r, kOk) == 0) failed.push_back(r);
    if (field(r, kNumel) != params.numel()) {
      throw abandon(
          fmt::format("rank {} has {} parameters, rank {} has {}", r, field(r, kNumel), rank, params.numel()));
    }
    max_pieces = std::max(max_pieces, field(r, kPieces));
    total_bytes += field(r, kBytes);
  }
  if (!failed.empty()) {
    throw abandon(
        ok == 0 ? fmt::format("rank {} could not write its shard: {}", rank, error)
                : fmt::format("rank(s) {} could not write their shards (see their logs)", fmt::join(failed, ", ")));
  }

  // The flat ranges of every rank's pieces: rank 0 indexes them, and every rank checks that they tile the buffer.
  std::vector<int64_t> mine(static_cast<size_t>(2 * max_pieces), -1);
  for (size_t k = 0; k < pieces.size(); ++k) {
    mine[2 * k] = pieces[k].begin;
    mine[2 * k + 1] = pieces[k].end;
  }
  const std::vector<int64_t> all = all_gather_i64(group, mine);
  std::vector<std::vector<FlatRange>> pieces_of(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    for (int64_t k = 0; k < field(r, kPieces); ++k) {
      const size_t at = static_cast<size_t>((r * max_pieces + k) * 2);
      pieces_of[r].push_back({all[at], all[at + 1]});
    }
  }
  if (const std::string flaw = coverage_flaw(pieces_of, params.numel()); !flaw.empty()) throw abandon(flaw);

  // 3. Rank 0 writes the small files, the manifest last, and commits; the broadcast is the closing barrier.
  if (rank == 0) {
    try {
      ManifestFiles files;
      for (int r = 0; r < size; ++r) {
        files.add(shard_file_name(r, size), static_cast<uint64_t>(field(r, kBytes)),
                  static_cast<uint32_t>(field(r, kCrc32c)));
      }
      files.write_text(tmp_dir, kShardedIndexFile, index_text(params, pieces_of, state.iteration));
      files.write_text(tmp_dir, "trainer_state.json", trainer_state_text(state));
      files.write_text(tmp_dir, "config.yaml", config_yaml);
      files.write_text(tmp_dir, "config.json", hf_config_json_text(model.args()));
      files.write_manifest(tmp_dir, state.iteration);
      commit_checkpoint_dir(tmp_dir, save_dir, state.iteration);
    } catch (const std::exception& e) {
      ok = 0;
      error = e.what();
    }
  }
  if (broadcast_i64(group, ok, 0) == 0) {
    throw abandon(rank == 0 ? error : "rank 0 could not commit the checkpoint (see its log)");
  }
  return total_bytes;
}

}  // namespace primus
