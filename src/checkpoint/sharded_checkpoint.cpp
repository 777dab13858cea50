// The sharded save: shard pieces, the exchanges that make every rank agree on the outcome, the index and the
// commit on rank 0.
#include "checkpoint/sharded_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_catalog.h"
#include "core/error.h"
#include "ops/ops.h"
#include "parallel/gather_text.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Fields of the record each rank all_gathers after writing its shard.
enum RecordField : int64_t { kOk, kBytes, kCrc32c, kRecordFields };

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

// The key of each piece inside its shard: the tensor's name, or `<name>@<first element of its box>` when the shard
// holds several pieces of it.
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

// This rank's pieces under their keys: the weights, then both moments of each.
SafetensorsWriter shard_writer(const ParamStore& params, const SavedState& source,
                               const std::vector<FlatRange>& pieces) {
  SafetensorsWriter writer;
  const std::vector<std::string> keys = piece_keys(params, pieces);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const FlatRange p = pieces[k];
    add_views(writer, keys[k], {p.size()}, source.weights(p.begin, p.end));
    add_views(writer, "exp_avg." + keys[k], {p.size()}, source.moments(false, p.begin, p.end));
    add_views(writer, "exp_avg_sq." + keys[k], {p.size()}, source.moments(true, p.begin, p.end));
  }
  return writer;
}

// The single-file format's two data files: every tensor whole, under its Hugging Face name.
std::pair<SafetensorsWriter, SafetensorsWriter> single_file_writers(const ParamStore& params,
                                                                    const SavedState& source) {
  SafetensorsWriter weights, moments;
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const int64_t begin = params.offset(i);
    const int64_t end = begin + shape_numel(spec.shape);
    add_views(weights, spec.name, spec.shape, source.weights(begin, end));
    add_views(moments, "exp_avg." + spec.name, spec.shape, source.moments(false, begin, end));
    add_views(moments, "exp_avg_sq." + spec.name, spec.shape, source.moments(true, begin, end));
  }
  return {std::move(weights), std::move(moments)};
}

// A piece as every rank sees it: which tensor, where in it, under which key of its rank's shard.
struct PieceRecord {
  std::string name;
  Shape whole;  // the logical tensor's shape
  TensorBox box;
  int64_t begin = 0;  // elements [begin, end) of the box
  int64_t end = 0;
  std::string key;
};

std::vector<PieceRecord> piece_records(const ParamStore& params, const std::vector<FlatRange>& pieces) {
  const std::vector<std::string> keys = piece_keys(params, pieces);
  std::vector<PieceRecord> records;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const size_t i = param_at(params, pieces[k].begin);
    const ParamSpec& spec = params.specs()[i];
    records.push_back(PieceRecord{spec.name, spec.whole_shape(), param_box(spec), pieces[k].begin - params.offset(i),
                                  pieces[k].end - params.offset(i), keys[k]});
  }
  return records;
}

// The description a rank sends in step 3: JSON [[name, whole shape, box offset, box shape, begin, end, key], ...].
std::string describe(const std::vector<PieceRecord>& records) {
  json list = json::array();
  for (const PieceRecord& r : records) {
    list.push_back({r.name, r.whole, r.box.offset, r.box.shape, r.begin, r.end, r.key});
  }
  return list.dump();
}

std::vector<PieceRecord> parse_description(const std::string& text) {
  std::vector<PieceRecord> records;
  for (const json& p : json::parse(text)) {
    records.push_back(PieceRecord{p[0].get<std::string>(), p[1].get<Shape>(),
                                  TensorBox{p[2].get<Shape>(), p[3].get<Shape>()}, p[4].get<int64_t>(),
                                  p[5].get<int64_t>(), p[6].get<std::string>()});
  }
  return records;
}

// Every tensor's pieces over the ranks, by name.
using TensorPieces = std::map<std::string, std::vector<std::pair<int, PieceRecord>>>;

// The first flaw in how the ranks' pieces cover the tensors, or empty: a tensor whose ranks disagree on its shape,
// a tensor whose pieces do not hold every element exactly once, a tensor of `params` (this rank's) in no piece.
std::string tensors_flaw(const TensorPieces& tensors, const ParamStore& params) {
  for (const auto& [name, list] : tensors) {
    std::vector<TensorPiece> pieces;
    for (const auto& [rank, p] : list) {
      if (p.whole != list.front().second.whole) {
        return fmt::format("rank {} gives tensor '{}' shape {}, rank {} gives it {}", rank, name, shape_str(p.whole),
                           list.front().first, shape_str(list.front().second.whole));
      }
      pieces.push_back(TensorPiece{p.box, p.begin, p.end, fmt::format("rank {}", rank)});
    }
    if (const std::string flaw = coverage_flaw(list.front().second.whole, pieces); !flaw.empty()) {
      return fmt::format("tensor '{}': {}", name, flaw);
    }
  }
  for (const ParamSpec& spec : params.specs()) {
    if (shape_numel(spec.shape) > 0 && tensors.count(spec.name) == 0) {
      return fmt::format("tensor '{}' is in no rank's pieces", spec.name);
    }
  }
  return {};
}

std::string index_text(const TensorPieces& tensors, int size, int64_t iteration, int format_version) {
  json files = json::array();
  for (int r = 0; r < size; ++r) files.push_back(shard_file_name(r, size));
  json index_tensors = json::object();
  int64_t numel = 0;
  for (const auto& [name, list] : tensors) {
    std::vector<std::pair<int, PieceRecord>> sorted = list;
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
      return std::tie(a.second.box.offset, a.second.begin) < std::tie(b.second.box.offset, b.second.begin);
    });
    numel += shape_numel(sorted.front().second.whole);
    for (const char* prefix : {"", "exp_avg.", "exp_avg_sq."}) {
      json& entries = index_tensors[prefix + name];
      for (const auto& [rank, p] : sorted) {
        json entry = {{"file", shard_file_name(rank, size)}, {"key", prefix + p.key}, {"shape", p.whole}};
        if (!p.box.is_whole(p.whole)) entry["box"] = {{"offset", p.box.offset}, {"shape", p.box.shape}};
        entry["slice"] = {p.begin, p.end};
        entry["dtype"] = "F32";
        entries.push_back(std::move(entry));
      }
    }
  }
  const json index = {{"format", kShardedIndexFormat},
                      {"format_version", format_version},
                      {"iteration", iteration},
                      {"world_size", size},
                      {"numel", numel},
                      {"files", files},
                      {"tensors", index_tensors}};
  return index.dump(1) + "\n";
}

}  // namespace


TensorBox param_box(const ParamSpec& spec) {
  TensorBox box{Shape(spec.shape.size(), 0), spec.shape};
  if (spec.slice.sliced()) box.offset[static_cast<size_t>(spec.slice.dim)] = spec.slice.offset;
  return box;
}

SavedState live_state(const ParamStore& params, const AdamW& optimizer) {
  return SavedState{
      .weights = [&params, &optimizer](int64_t begin, int64_t end) {
        return weight_views(params, optimizer, begin, end);
      },
      .moments = [&optimizer](bool second, int64_t begin, int64_t end) {
        return moment_views(optimizer, second, begin, end);
      }};
}

CheckpointSave::CheckpointSave(std::string save_dir, const Model& model, std::vector<FlatRange> ranges,
                               Communicator* group, TrainerState state, std::string config_yaml)
    : save_dir_(std::move(save_dir)),
      final_dir_(save_dir_ + "/" + checkpoint_dir_name(state.iteration)),
      tmp_dir_(temporary_checkpoint_dir(save_dir_, state.iteration)),
      model_(model),
      group_(group != nullptr && group->size() > 1 ? group : nullptr),
      state_(state),
      config_yaml_(std::move(config_yaml)) {
  const ParamStore& params = model.params();
  pieces_ = shard_pieces(params, std::move(ranges));
  int64_t elements = 0;
  for (const FlatRange& p : pieces_) elements += p.size();
  if (group_ == nullptr) {
    // The single-file format holds every tensor whole.
    TensorPieces tensors;
    for (const PieceRecord& r : piece_records(params, pieces_)) tensors[r.name].push_back({0, r});
    std::string flaw = tensors_flaw(tensors, params);
    for (const ParamSpec& spec : params.specs()) {
      if (flaw.empty() && spec.slice.sliced()) flaw = fmt::format("'{}' is a tensor-parallel slice", spec.name);
    }
    if (!flaw.empty()) throw RuntimeError(fmt::format("[checkpoint] save of a world of one: {}", flaw));
  } else {
    // Rank 0 checks the free space for what every rank writes (ranks may hold different tensors).
    const int64_t mine = elements;
    elements = 0;
    for (int64_t n : all_gather_i64(*group_, {mine})) elements += n;
  }
  const int rank = group_ ? group_->rank() : 0;
  std::string error;
  int64_t ok = 1;
  if (rank == 0) {
    try {
      prepare_temporary_dir(save_dir_, state_.iteration, checkpoint_bytes_estimate(elements));
    } catch (const std::exception& e) {
      ok = 0;
      error = e.what();
    }
  }
  // The broadcast keeps the other ranks from writing into the directory before it exists.
  if (group_ != nullptr) ok = broadcast_i64(*group_, ok, 0);
  if (ok == 0) {
    throw RuntimeError(fmt::format("[checkpoint] save of {} abandoned: {}; the latest checkpoint is still the "
                                   "previous one",
                                   checkpoint_dir_name(state_.iteration),
                                   rank == 0 ? error : fmt::format("rank 0 could not create {} (see its log)", tmp_dir_)));
  }
}

void CheckpointSave::write(const SavedState& source, const CheckpointProgressFn& progress, const CheckpointIo& io) {
  const ParamStore& params = model_.params();
  try {
    if (group_ == nullptr) {
      const auto [weights, moments] = single_file_writers(params, source);
      int64_t done = 0;
      const auto on_bytes =
          save_progress(progress, static_cast<int64_t>(weights.file_bytes() + moments.file_bytes()), done);
      const SafetensorsWriter::Written model = weights.write(tmp_dir_ + "/model.safetensors", on_bytes, io.threads);
      written_.push_back({"model.safetensors", model.bytes, model.crc32c});
      const SafetensorsWriter::Written optim = moments.write(tmp_dir_ + "/optimizer.safetensors", on_bytes, io.threads);
      written_.push_back({"optimizer.safetensors", optim.bytes, optim.crc32c});
    } else {
      const std::string name = shard_file_name(group_->rank(), group_->size());
      const SafetensorsWriter writer = shard_writer(params, source, pieces_);
      int64_t done = 0;
      const SafetensorsWriter::Written shard = writer.write(
          tmp_dir_ + "/" + name, save_progress(progress, static_cast<int64_t>(writer.file_bytes()), done), io.threads);
      written_.push_back({name, shard.bytes, shard.crc32c});
    }
    written_ok_ = true;
  } catch (const std::exception& e) {
    write_error_ = e.what();
  }
}

int64_t CheckpointSave::finish() {
  const ParamStore& params = model_.params();
  const std::string iteration_name = checkpoint_dir_name(state_.iteration);
  const int size = group_ ? group_->size() : 1;
  const int rank = group_ ? group_->rank() : 0;
  auto abandon = [&](const std::string& why) {
    if (rank == 0) {
      std::error_code ignored;  // every rank has stopped writing into it
      fs::remove_all(tmp_dir_, ignored);
    }
    return RuntimeError(fmt::format("[checkpoint] save of {}{} abandoned: {}; the latest checkpoint is still the "
                                    "previous one",
                                    iteration_name, size > 1 ? fmt::format(" by {} ranks", size) : "", why));
  };
  int64_t ok = written_ok_ ? 1 : 0;
  if (group_ == nullptr) {
    if (!written_ok_) throw abandon(write_error_);
    std::string error;
    try {
      ManifestFiles files;
      int64_t bytes = 0;
      for (const DataFile& f : written_) {
        files.add(f.name, f.bytes, f.crc32c);
        bytes += static_cast<int64_t>(f.bytes);
      }
      finish_checkpoint_dir(files, tmp_dir_, save_dir_, hf_config_json_text(model_.args()), state_, config_yaml_,
                            kFirstCheckpointFormatVersion);
      return bytes;
    } catch (const std::exception& e) {
      error = e.what();
    }
    throw abandon(error);
  }

  // Every rank learns how every rank fared.
  Communicator& group = *group_;
  const std::string description = describe(piece_records(params, pieces_));
  const DataFile shard = written_ok_ ? written_.front() : DataFile{};
  const std::vector<int64_t> records =
      all_gather_i64(group, {ok, static_cast<int64_t>(shard.bytes), static_cast<int64_t>(shard.crc32c)});
  auto field = [&](int r, RecordField f) { return records[static_cast<size_t>(r * kRecordFields + f)]; };
  std::vector<int> failed;
  int64_t total_bytes = 0;
  for (int r = 0; r < size; ++r) {
    if (field(r, kOk) == 0) failed.push_back(r);
    total_bytes += field(r, kBytes);
  }
  if (!failed.empty()) {
    throw abandon(ok == 0 ? fmt::format("rank {} could not write its shard: {}", rank, write_error_)
                          : fmt::format("rank(s) {} could not write their shards (see their logs)",
                                        fmt::join(failed, ", ")));
  }

  // Every rank's pieces: rank 0 indexes them, and every rank checks that they hold every tensor's elements once.
  const std::vector<std::string> descriptions = all_gather_text(group, description);
  TensorPieces tensors;
  bool boxes = false;
  for (int r = 0; r < size; ++r) {
    for (PieceRecord& p : parse_description(descriptions[static_cast<size_t>(r)])) {
      boxes = boxes || !p.box.is_whole(p.whole);
      tensors[p.name].push_back({r, std::move(p)});
    }
  }
  if (const std::string flaw = tensors_flaw(tensors, params); !flaw.empty()) throw abandon(flaw);

  // Rank 0 writes the small files, the manifest last, and commits; the broadcast is the closing barrier.
  std::string error;
  if (rank == 0) {
    try {
      const int version = boxes ? kCheckpointFormatVersion : kFirstCheckpointFormatVersion;
      ManifestFiles files;
      for (int r = 0; r < size; ++r) {
        files.add(shard_file_name(r, size), static_cast<uint64_t>(field(r, kBytes)),
                  static_cast<uint32_t>(field(r, kCrc32c)));
      }
      files.write_text(tmp_dir_, kShardedIndexFile, index_text(tensors, size, state_.iteration, version));
      finish_checkpoint_dir(files, tmp_dir_, save_dir_, hf_config_json_text(model_.args()), state_, config_yaml_,
                            version);
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

int64_t save_sharded_checkpoint(const std::string& save_dir, const Model& model, const AdamW& optimizer,
                                const std::vector<FlatRange>& ranges, Communicator& group, const TrainerState& state,
                                const std::string& config_yaml, const CheckpointProgressFn& progress) {
  CheckpointSave save(save_dir, model, ranges, &group, state, config_yaml);
  save.write(live_state(model.params(), optimizer), progress);
  return save.finish();
}

}  // namespace primus
