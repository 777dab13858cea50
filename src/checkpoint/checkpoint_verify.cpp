// Verifying a checkpoint directory before anything is loaded from it, and reading its trainer state. A checkpoint
// may have been damaged or edited by hand, so nothing in it decides what is checked:
//   - one fixed set of files is verified for each format, whatever the manifest lists: the single-file format's
//     model.safetensors, optimizer.safetensors, config.json, trainer_state.json and config.yaml; the sharded
//     format's index.json, trainer_state.json, config.yaml, config.json and shard_<r>_of_<n>.safetensors for every
//     r < n, n being index.json's world_size (index.json is verified before it is believed, and the loader reads
//     no file outside that set: TensorCatalog::open_checkpoint);
//   - the manifest's entries are exact unsigned integers in range (a CRC of 2^32 + x is not x), its file names
//     plain names inside the directory;
//   - trainer_state.json's fields are exact integers in range, and the iteration agrees with the manifest's and
//     with the directory's name `iter_N`.
// Errors are RuntimeError naming the file and the key (exit 3: a checkpoint is a file the program wrote).
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/checkpoint_json.h"
#include "checkpoint/parallel_io.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/tensor_catalog.h"
#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct ManifestEntry {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct Manifest {
  std::string path;
  int64_t iteration = 0;
  std::map<std::string, ManifestEntry> files;
};

// A name the manifest gives a file: a plain name inside the checkpoint directory, so that a manifest cannot point
// the verification (and so the trust it grants) elsewhere.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void require_format_version(const JsonFields& fields) {
  const int64_t version = fields.integer("format_version", INT64_MIN, INT64_MAX);
  if (version < kFirstCheckpointFormatVersion || version > kCheckpointFormatVersion) {
    fields.fail("format_version", fmt::format("is {}; this build reads formats {} to {} (written by another version?)",
                                              version, kFirstCheckpointFormatVersion, kCheckpointFormatVersion));
  }
}

Manifest read_manifest(const std::string& dir) {
  Manifest manifest;
  manifest.path = dir + "/" + kManifestFile;
  if (!fs::exists(manifest.path)) {
    throw RuntimeError(
        fmt::format("{}: no {} — the checkpoint is incomplete and will not be loaded", dir, kManifestFile));
  }
  const json j = read_json_object(manifest.path);
  const JsonFields fields(j, manifest.path);
  require_format_version(fields);
  manifest.iteration = fields.integer("iteration", 0, INT64_MAX);
  const json& files = fields.object("files");
  if (files.empty()) fields.fail("files", "lists no files");
  for (const auto& [name, entry] : files.items()) {
    if (!plain_file_name(name)) {
      fields.fail("files", fmt::format("names '{}', which is not a plain file name in the checkpoint directory", name));
    }
    const JsonFields entry_fields(entry, manifest.path, "files." + name + ".");
    manifest.files[name] =
        ManifestEntry{static_cast<uint64_t>(entry_fields.integer("bytes", 0, INT64_MAX)),
                      static_cast<uint32_t>(entry_fields.integer("crc32c", 0, UINT32_MAX, "a CRC32C has 32 bits"))};
  }
  return manifest;
}

// The number N of a directory named iter_N (checkpoint_dir_name), or -1 for another name: a checkpoint copied
// elsewhere and named by `load=` directly may be called anything.
int64_t iteration_of_name(const std::string& dir) {
  std::error_code error;
  fs::path path = fs::weakly_canonical(dir, error);
  if (error) path = fs::path(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  const std::string name = path.filename().string();
  const std::string digits = name.rfind("iter_", 0) == 0 ? name.substr(5) : "";
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  int64_t n = -1;
  const auto [end, status] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  return status == std::errc() ? n : INT64_MAX;  // more digits than an int64 holds: no iteration matches it
}

void require_name_matches(const std::string& dir, int64_t iteration, const std::string& says) {
  const int64_t named = iteration_of_name(dir);
  if (named >= 0 && named != iteration) {
    throw RuntimeError(
        fmt::format("{}: holds iteration {} ({} says so), not the one its name says — renamed or "
                    "edited; not loading",
                    dir, iteration, says));
  }
}

void require_listed(const Manifest& manifest, const std::string& name, const char* format) {
  if (manifest.files.count(name) == 0) {
    throw RuntimeError(
        fmt::format("{}: does not list {}, which every {} checkpoint has verified — damaged or edited; "
                    "not loading",
                    manifest.path, name, format));
  }
}

// Presence, kind and size: cheap, so all of them come before any CRC.
void check_size(const std::string& dir, const std::string& name, const ManifestEntry& entry) {
  const std::string path = dir + "/" + name;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) throw RuntimeError(fmt::format("{}: missing (listed in the manifest)", path));
  if (!fs::is_regular_file(status)) {
    throw RuntimeError(fmt::format("{}: not a regular file (a FIFO, device, socket or folder); not reading it", path));
  }
  const uint64_t size = fs::file_size(path, error);
  if (error) throw RuntimeError(fmt::format("{}: cannot read its size: {}", path, error.message()));
  if (size != entry.bytes) {
    throw RuntimeError(fmt::format("{}: {} bytes, the manifest says {} — truncated or modified; not loading", path,
                                   size, entry.bytes));
  }
}

void check_crc(const std::string& dir, const std::string& name, const ManifestEntry& entry) {
  const std::string path = dir + "/" + name;
  const uint32_t crc = checksum_files({{path, entry.bytes}}, 1).front();
  if (crc != entry.crc32c) {
    throw RuntimeError(
        fmt::format("{}: CRC32C {:#010x}, the manifest says {:#010x} — corrupt; not loading", path, crc, entry.crc32c));
  }
}

// Requires the manifest to list the files every checkpoint of this directory's format has. The shards are named by
// index.json, which is verified first.
void require_fixed_files(const std::string& dir, const Manifest& manifest) {
  if (!is_sharded_checkpoint(dir)) {
    for (const char* name :
         {"model.safetensors", "optimizer.safetensors", "config.json", "trainer_state.json", "config.yaml"}) {
      require_listed(manifest, name, "single-file");
    }
    return;
  }
  for (const char* name : {kShardedIndexFile, "trainer_state.json", "config.yaml", "config.json"}) {
    require_listed(manifest, name, "sharded");
  }
  check_size(dir, kShardedIndexFile, manifest.files.at(kShardedIndexFile));
  check_crc(dir, kShardedIndexFile, manifest.files.at(kShardedIndexFile));
  const int64_t world_size = sharded_checkpoint_world_size(dir);
  for (int64_t r = 0; r < world_size; ++r) {
    require_listed(manifest, shard_file_name(static_cast<int>(r), static_cast<int>(world_size)), "sharded");
  }
}

}  // namespace

void verify_checkpoint(const std::string& checkpoint_dir, const CheckpointProgressFn& progress,
                       const CheckpointIo& io) {
  const Manifest manifest = read_manifest(checkpoint_dir);
  require_name_matches(checkpoint_dir, manifest.iteration, manifest.path);
  require_fixed_files(checkpoint_dir, manifest);
  // Every file listed, which includes the required ones: sizes first (cheap), then the CRCs, which read every byte
  // (64 MiB ranges of all the files on io.threads threads, parallel_io.h).
  int64_t total = 0;
  std::vector<FileSpan> files;
  for (const auto& [name, entry] : manifest.files) {
    check_size(checkpoint_dir, name, entry);
    total += static_cast<int64_t>(entry.bytes);
    files.push_back({checkpoint_dir + "/" + name, entry.bytes});
  }
  int64_t done = 0;
  if (progress) progress({"verify", 0, total});
  const std::vector<uint32_t> crcs = checksum_files(files, io.threads, [&](uint64_t bytes) {
    done += static_cast<int64_t>(bytes);
    if (progress) progress({"verify", done, total});
  });
  size_t k = 0;
  for (const auto& [name, entry] : manifest.files) {
    if (crcs[k] != entry.crc32c) {
      throw RuntimeError(fmt::format("{}: CRC32C {:#010x}, the manifest says {:#010x} — corrupt; not loading",
                                     files[k].path, crcs[k], entry.crc32c));
    }
    ++k;
  }
  // Verified now, trainer_state.json must hold the manifest's iteration.
  const std::string state_file = checkpoint_dir + "/trainer_state.json";
  const int64_t iteration = read_trainer_state(checkpoint_dir).iteration;
  if (iteration != manifest.iteration) {
    throw RuntimeError(fmt::format("{}: iteration is {} but {} says {} — edited; not loading", state_file, iteration,
                                   manifest.path, manifest.iteration));
  }
}

namespace {

std::vector<Fp8ScalingRecord> read_fp8_scaling(const json& records, const std::string& file) {
  if (!records.is_array()) throw RuntimeError(fmt::format("{}: fp8_scaling must be a JSON array", file));
  std::vector<Fp8ScalingRecord> out;
  for (size_t i = 0; i < records.size(); ++i) {
    const JsonFields fields(records[i], file, fmt::format("fp8_scaling[{}].", i));
    Fp8ScalingRecord r;
    r.name = fields.string("name");
    const json& history = fields.required("amax_history");
    const json& scale = fields.required("scale");
    if (!history.is_array() || history.empty() || !scale.is_number()) {
      throw RuntimeError(fmt::format("{}: fp8_scaling[{}] ({}) needs a non-empty amax_history array and a numeric "
                                     "scale",
                                     file, i, r.name));
    }
    for (const json& v : history) {
      if (!v.is_null() && !v.is_number()) {
        throw RuntimeError(fmt::format("{}: fp8_scaling[{}] ({}): amax_history holds {}, not a number or null", file,
                                       i, r.name, v.dump()));
      }
      r.amax_history.push_back(v.is_null() ? std::numeric_limits<float>::quiet_NaN() : v.get<float>());
    }
    r.scale = scale.get<float>();
    if (!(r.scale > 0.0f) || !std::isfinite(r.scale)) {
      throw RuntimeError(fmt::format("{}: fp8_scaling[{}] ({}): scale {} is not a positive finite number", file, i,
                                     r.name, scale.dump()));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::vector<Fp8ScalingRecord> parse_fp8_scaling(const std::string& text, const std::string& where) {
  const json records = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (records.is_discarded()) throw RuntimeError(fmt::format("{}: fp8_scaling is not JSON", where));
  return read_fp8_scaling(records, where);
}

TrainerState read_trainer_state(const std::string& checkpoint_dir) {
  const std::string state_file = checkpoint_dir + "/trainer_state.json";
  const json j = read_json_object(state_file);
  const JsonFields fields(j, state_file);
  require_format_version(fields);
  TrainerState state;
  state.iteration = fields.integer("iteration", 0, INT64_MAX);
  state.consumed_train_samples = fields.integer("consumed_train_samples", 0, INT64_MAX);
  state.optimizer_steps =
      fields.integer("optimizer_steps", 0, state.iteration, "at most one optimizer step per iteration");
  state.seed = fields.integer("seed", INT64_MIN, INT64_MAX);
  if (j.contains("fp8_scaling")) state.fp8_scaling = read_fp8_scaling(j.at("fp8_scaling"), state_file);
  return state;
}

}  // namespace primus
