// A checkpoint or Hugging Face folder is input the loader must not trust (issue 12, holes 7, 8, 9, 11, 13). Each
// test edits a real save of a tiny model the way the bad-input probe did, usually fixing the manifest's size and
// CRC as a careful hand-edit would, so that only the check under test can catch it:
//   - the manifest: a fixed set of files is always verified, entries are range-checked, names stay in the folder;
//   - trainer_state.json: every field range-checked and consistent with the manifest and the directory name;
//   - the checkpoint's config.json and a Hugging Face config.json: compared with the model, naming the key;
//   - a Hugging Face weight_map: confined to its folder (symbolic links too, Hugging Face's cache excepted);
//   - malformed JSON names the file and key; a FIFO in place of any file is refused without blocking.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_catalog.h"
#include "core/file_io.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "expected '" << (part) << "' in: " << (text)

namespace primus {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using testing::message_of;

struct Tiny {
  std::unique_ptr<Model> model;
  AdamW optimizer;
  explicit Tiny(const ModelArgs& args = testing::tiny_llama_args(), int64_t seq_length = 16)
      : model(make_model(args, seq_length)), optimizer(model->params(), AdamWConfig{}) {
    model->params().initialize(7);
  }
};

// A checkpoint of iteration 3 (3 optimizer steps, 6 samples, seed 9) saved under a fresh folder; returns iter_0000003.
std::string save_tiny(const std::string& label) {
  Tiny tiny;
  const std::string dir = testing::temp_dir(label);
  const TrainerState state{.iteration = 3, .consumed_train_samples = 6, .optimizer_steps = 3, .seed = 9, .fp8_scaling = {}};
  save_checkpoint(dir, *tiny.model, tiny.optimizer, state, "exp_name: tiny\n");
  return dir + "/iter_0000003";
}

TrainerState load_into_tiny(const std::string& checkpoint, const ModelArgs& args = testing::tiny_llama_args()) {
  Tiny tiny(args);
  return load_checkpoint(checkpoint, *tiny.model, tiny.optimizer);
}

json read_json(const std::string& path) { return json::parse(read_file(path)); }
void write_json(const std::string& path, const json& j) { write_file_atomic(path, j.dump(2)); }

// Replaces a checkpoint file and gives the manifest its new size and CRC: only the content checks can object.
void rewrite(const std::string& checkpoint, const std::string& name, const std::string& text) {
  write_file_atomic(checkpoint + "/" + name, text);
  json manifest = read_json(checkpoint + "/manifest.json");
  manifest["files"][name] = {{"bytes", text.size()}, {"crc32c", crc32c(text)}};
  write_json(checkpoint + "/manifest.json", manifest);
}

void flip_a_byte(const std::string& path) {
  std::string bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 0x01;
  write_file_atomic(path, bytes);
}

// --- hole 7: the manifest ------------------------------------------------------------------------------------------

TEST(CheckpointVerify, AManifestThatLeavesOutAFileDoesNotExemptItFromVerification) {
  // The probe's case: model.safetensors dropped from the manifest, then a byte of it flipped.
  for (const char* name :
       {"model.safetensors", "optimizer.safetensors", "config.json", "trainer_state.json", "config.yaml"}) {
    const std::string ckpt = save_tiny("drop");
    json manifest = read_json(ckpt + "/manifest.json");
    manifest["files"].erase(name);
    write_json(ckpt + "/manifest.json", manifest);
    flip_a_byte(ckpt + "/" + name);
    const std::string message = message_of<RuntimeError>([&] { load_into_tiny(ckpt); });
    EXPECT_CONTAINS(message, ckpt + "/manifest.json");
    EXPECT_CONTAINS(message, name);
  }
}

TEST(CheckpointVerify, ManifestEntriesMustBeUnsignedIntegersInRange) {
  const std::string ckpt = save_tiny("entries");
  const json good = read_json(ckpt + "/manifest.json");
  const uint64_t crc = good["files"]["model.safetensors"]["crc32c"].get<uint64_t>();
  const uint64_t bytes = good["files"]["model.safetensors"]["bytes"].get<uint64_t>();
  const std::vector<std::pair<std::string, json>> bad = {
      {"crc32c", crc + (uint64_t{1} << 32)},  // passed when read as a uint32_t
      {"crc32c", -1},
      {"crc32c", static_cast<double>(crc)},
      {"crc32c", std::to_string(crc)},
      {"bytes", -1},
      {"bytes", static_cast<double>(bytes)},
      {"bytes", std::to_string(bytes)},
      {"bytes", nullptr},
  };
  for (const auto& [key, value] : bad) {
    json manifest = good;
    manifest["files"]["model.safetensors"][key] = value;
    write_json(ckpt + "/manifest.json", manifest);
    const std::string message = message_of<RuntimeError>([&] { verify_checkpoint(ckpt); });
    EXPECT_CONTAINS(message, ckpt + "/manifest.json");
    EXPECT_CONTAINS(message, "files.model.safetensors." + key);
  }
  json manifest = good;
  manifest["files"]["model.safetensors"] = "everything is fine";
  write_json(ckpt + "/manifest.json", manifest);
  EXPECT_CONTAINS(message_of<RuntimeError>([&] { verify_checkpoint(ckpt); }), "files.model.safetensors");
  write_json(ckpt + "/manifest.json", good);
  EXPECT_NO_THROW(verify_checkpoint(ckpt));
}

TEST(CheckpointVerify, ManifestFileNamesStayInTheCheckpointDirectory) {
  const std::string ckpt = save_tiny("names");
  const json good = read_json(ckpt + "/manifest.json");
  fs::create_directories(ckpt + "/sub");
  write_file_atomic(ckpt + "/sub/x", "x");
  for (const std::string name : {"../iter_0000003/config.yaml", "sub/x", "/etc/hostname", ".", ".."}) {
    json manifest = good;
    manifest["files"][name] = {{"bytes", 1}, {"crc32c", crc32c("x")}};
    write_json(ckpt + "/manifest.json", manifest);
    const std::string message = message_of<RuntimeError>([&] { verify_checkpoint(ckpt); });
    EXPECT_CONTAINS(message, ckpt + "/manifest.json");
    EXPECT_CONTAINS(message, "'" + name + "'");
  }
}

TEST(CheckpointVerify, ManifestHeaderAndSyntaxAreCheckedNamingTheFile) {
  const std::string ckpt = save_tiny("header");
  const std::string path = ckpt + "/manifest.json";
  const json good = read_json(path);
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"format_version", 99},
                                                                            {"format_version", "1"},
                                                                            {"iteration", -3},
                                                                            {"iteration", 3.0},
                                                                            {"iteration", 4},
                                                                            {"files", json::array()}}) {
    json manifest = good;
    manifest[key] = value;
    write_json(path, manifest);
    const std::string message = message_of<RuntimeError>([&] { verify_checkpoint(ckpt); });
    EXPECT_CONTAINS(message, path);
    EXPECT_CONTAINS(message, key);
  }
  write_file_atomic(path, "{\"files\": ");
  EXPECT_CONTAINS(message_of<RuntimeError>([&] { verify_checkpoint(ckpt); }), path);
  write_file_atomic(path, "[1, 2]");
  EXPECT_CONTAINS(message_of<RuntimeError>([&] { verify_checkpoint(ckpt); }), path);
}

// --- hole 8: trainer_state.json and config.json --------------------------------------------------------------------

// trainer_state.json as the save writes it for iteration 3, with some values replaced by raw JSON text.
std::string state_text(const std::map<std::string, std::string>& replace) {
  std::map<std::string, std::string> fields = {{"format_version", "1"},
                                               {"iteration", "3"},
                                               {"consumed_train_samples", "6"},
                                               {"optimizer_steps", "3"},
                                               {"seed", "9"}};
  for (const auto& [key, value] : replace) fields[key] = value;
  std::string text;
  for (const auto& [key, value] : fields) {
    if (!value.empty()) text += fmt::format("{}\"{}\": {}", text.empty() ? "" : ", ", key, value);
  }
  return "{" + text + "}\n";
}

TEST(CheckpointVerify, TrainerStateFieldsAreRangeChecked) {
  const std::string saved = save_tiny("state");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"iteration", "-5"},
      {"iteration", "1000000000000000000"},   // "done" at once
      {"iteration", "18446744073709551621"},  // 2^64 + 5: wrapped negative and trained forever
      {"iteration", "3.0"},
      {"iteration", "\"3\""},
      {"iteration", ""},  // missing
      {"consumed_train_samples", "-1"},
      {"consumed_train_samples", "6.5"},
      {"optimizer_steps", "-1"},
      {"optimizer_steps", "4"},  // more steps than iterations
      {"format_version", "99"},
      {"seed", "\"nine\""},
      {"seed", "9223372036854775808"},  // INT64_MAX + 1
  };
  for (const auto& [key, value] : bad) {
    const std::string ckpt = testing::temp_dir("state-case") + "/iter_0000003";
    fs::copy(saved, ckpt);
    rewrite(ckpt, "trainer_state.json", state_text({{key, value}}));
    const std::string message = message_of<RuntimeError>([&] { load_into_tiny(ckpt); });
    EXPECT_CONTAINS(message, ckpt + "/trainer_state.json");
    EXPECT_CONTAINS(message, key);
  }
  rewrite(saved, "trainer_state.json", state_text({}));
  const TrainerState state = load_into_tiny(saved);
  EXPECT_EQ(state.iteration, 3);
  EXPECT_EQ(state.optimizer_steps, 3);
  rewrite(saved, "trainer_state.json", "{\"iteration\": ");
  EXPECT_CONTAINS(message_of<RuntimeError>([&] { load_into_tiny(saved); }), saved + "/trainer_state.json");
}

TEST(CheckpointVerify, TheIterationMustAgreeWithTheManifestAndTheDirectoryName) {
  const std::string saved = save_tiny("agree");
  // The directory renamed: it no longer holds the iteration its name says.
  const std::string renamed = fs::path(saved).parent_path().string() + "/iter_0000004";
  fs::copy(saved, renamed);
  std::string message = message_of<RuntimeError>([&] { load_into_tiny(renamed); });
  EXPECT_CONTAINS(message, renamed);
  EXPECT_CONTAINS(message, "iteration 3");
  // Both files say 4 but the directory says 3.
  rewrite(saved, "trainer_state.json", state_text({{"iteration", "4"}}));
  json manifest = read_json(saved + "/manifest.json");
  manifest["iteration"] = 4;
  write_json(saved + "/manifest.json", manifest);
  message = message_of<RuntimeError>([&] { load_into_tiny(saved); });
  EXPECT_CONTAINS(message, "iter_0000003");
  // A folder under another name (load= naming a copy) is fine when the files agree.
  const std::string copy = testing::temp_dir("agree-copy") + "/best";
  fs::copy(renamed, copy);
  EXPECT_EQ(load_into_tiny(copy).iteration, 3);
}

TEST(CheckpointVerify, TheCheckpointsConfigJsonMustDescribeTheModel) {
  const std::string ckpt = save_tiny("config");
  struct Case {
    const char* key;
    std::function<void(ModelArgs&)> change;
  };
  const std::vector<Case> cases = {
      {"rope_theta", [](ModelArgs& a) { a.rotary_base = 500000.0; }},  // same shapes: loaded silently before
      {"rms_norm_eps", [](ModelArgs& a) { a.norm_epsilon = 1e-6; }},
      {"rope_scaling", [](ModelArgs& a) { a.use_rope_scaling = true; }},
      {"tie_word_embeddings", [](ModelArgs& a) { a.untie_embeddings_and_output_weights = false; }},
      {"model_type", [](ModelArgs& a) { a.qk_layernorm = true; }},
      {"vocab_size", [](ModelArgs& a) { a.vocab_size = 64; }},
      {"hidden_size", [](ModelArgs& a) { a.hidden_size = 64; }},
      {"num_key_value_heads", [](ModelArgs& a) { a.num_query_groups = 4; }},
  };
  for (const Case& c : cases) {
    ModelArgs args = testing::tiny_llama_args();
    c.change(args);
    const std::string message = message_of<UsageError>([&] { load_into_tiny(ckpt, args); });
    EXPECT_CONTAINS(message, ckpt + "/config.json");
    EXPECT_CONTAINS(message, c.key);
  }
  ModelArgs theta = testing::tiny_llama_args();
  theta.rotary_base = 500000.0;
  const std::string message = message_of<UsageError>([&] { load_into_tiny(ckpt, theta); });
  EXPECT_CONTAINS(message, "10000");
  EXPECT_CONTAINS(message, "500000");
  EXPECT_EQ(load_into_tiny(ckpt).iteration, 3);
}

// --- hole 11: Hugging Face folders ---------------------------------------------------------------------------------

// A Hugging Face folder of the tiny Llama with its weights in `file` (a path relative to the folder, made here) and
// model.safetensors.index.json mapping every tensor to it.
std::string hf_folder_with_index(const std::string& label, const std::string& file = "weights.safetensors") {
  Tiny tiny;
  const std::string dir = testing::temp_dir(label) + "/hf";
  export_hf_model(dir, *tiny.model);
  fs::create_directories(fs::path(dir + "/" + file).parent_path());
  fs::rename(dir + "/model.safetensors", dir + "/" + file);
  json map = json::object();
  for (const ParamSpec& spec : tiny.model->params().specs()) map[spec.name] = file;
  write_json(dir + "/model.safetensors.index.json", {{"metadata", json::object()}, {"weight_map", map}});
  return dir;
}

void map_first_tensor_to(const std::string& dir, const std::string& file) {
  json index = read_json(dir + "/model.safetensors.index.json");
  index["weight_map"]["model.embed_tokens.weight"] = file;
  write_json(dir + "/model.safetensors.index.json", index);
}

void load_hf_into_tiny(const std::string& dir, const ModelArgs& args = testing::tiny_llama_args(),
                       int64_t seq_length = 16) {
  Tiny tiny(args, seq_length);
  load_hf_weights(dir, *tiny.model);
}

TEST(HfFolderVerify, WeightMapPathsStayInTheFolder) {
  const std::string dir = hf_folder_with_index("hf-confined");
  EXPECT_NO_THROW(load_hf_into_tiny(dir));
  const std::string outside = fs::path(dir).parent_path().string() + "/outside.safetensors";
  fs::copy(dir + "/weights.safetensors", outside);
  fs::create_symlink(outside, dir + "/link.safetensors");
  for (const std::string file : {"../../../../etc/passwd", "/etc/passwd", "../outside.safetensors",
                                 "sub/../../outside.safetensors", "link.safetensors"}) {
    map_first_tensor_to(dir, file);
    const std::string message = message_of<UsageError>([&] { load_hf_into_tiny(dir); });
    EXPECT_CONTAINS(message, dir + "/model.safetensors.index.json");
    EXPECT_CONTAINS(message, "weight_map.model.embed_tokens.weight");
    EXPECT_CONTAINS(message, "outside");
  }
}

TEST(HfFolderVerify, SubfoldersAndHuggingFacesCacheLayoutLoad) {
  EXPECT_NO_THROW(load_hf_into_tiny(hf_folder_with_index("hf-sub", "shards/weights.safetensors")));
  // huggingface_hub's cache: snapshots/<revision>/<file> are symbolic links to ../../blobs/<hash>.
  const std::string made = hf_folder_with_index("hf-cache");
  const std::string repo = fs::path(made).parent_path().string() + "/models--tiny";
  const std::string snapshot = repo + "/snapshots/0123abc";
  fs::create_directories(repo + "/blobs");
  fs::create_directories(snapshot);
  for (const std::string name : {"weights.safetensors", "config.json", "model.safetensors.index.json"}) {
    const std::string blob = repo + "/blobs/" + std::to_string(crc32c(name));
    fs::rename(made + "/" + name, blob);
    fs::create_symlink("../../blobs/" + std::to_string(crc32c(name)), snapshot + "/" + name);
  }
  EXPECT_NO_THROW(load_hf_into_tiny(snapshot));
  EXPECT_NO_THROW(TensorCatalog::open_hf_folder(snapshot));
}

TEST(HfFolderVerify, ConfigJsonMustDescribeTheModel) {
  Tiny tiny;
  const std::string dir = testing::temp_dir("hf-config") + "/hf";
  export_hf_model(dir, *tiny.model);
  const json good = read_json(dir + "/config.json");
  const std::vector<std::pair<std::string, json>> bad = {
      {"rope_theta", 500000.0},
      {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", true},
      {"model_type", "qwen3"},
      {"max_position_embeddings", 8},  // the run's sequences are 16 tokens
      {"rope_scaling",
       {{"rope_type", "llama3"},
        {"factor", 8.0},
        {"low_freq_factor", 1.0},
        {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 16}}},
  };
  for (const auto& [key, value] : bad) {
    json config = good;
    config[key] = value;
    write_json(dir + "/config.json", config);
    const std::string message = message_of<UsageError>([&] { load_hf_into_tiny(dir); });
    EXPECT_CONTAINS(message, dir + "/config.json");
    EXPECT_CONTAINS(message, key);
  }
  // Within a tight relative tolerance (a value printed with fewer digits), and more positions than needed: fine.
  json config = good;
  config["rope_theta"] = 10000.000000001;
  config["max_position_embeddings"] = 131072;
  write_json(dir + "/config.json", config);
  EXPECT_NO_THROW(load_hf_into_tiny(dir));
  config["max_position_embeddings"] = 16;
  write_json(dir + "/config.json", config);
  EXPECT_NO_THROW(load_hf_into_tiny(dir));
  EXPECT_CONTAINS(message_of<UsageError>([&] { load_hf_into_tiny(dir, testing::tiny_llama_args(), 17); }), "17");
}

// --- hole 13: malformed JSON names the file and key ----------------------------------------------------------------

TEST(HfFolderVerify, MalformedIndexNamesTheFileAndKey) {
  const std::string dir = hf_folder_with_index("hf-malformed");
  const std::string index = dir + "/model.safetensors.index.json";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"weight_map\": ", index},
      {"[1]", "weight_map"},
      {"{\"weight_map\": [\"weights.safetensors\"]}", "weight_map"},
      {"{\"weight_map\": {\"model.embed_tokens.weight\": 7}}", "weight_map.model.embed_tokens.weight"},
      {"{\"weight_map\": {\"model.embed_tokens.weight\": \"\"}}", "weight_map.model.embed_tokens.weight"},
  };
  for (const auto& [text, part] : bad) {
    write_file_atomic(index, text);
    const std::string message = message_of<UsageError>([&] { load_hf_into_tiny(dir); });
    EXPECT_CONTAINS(message, index);
    EXPECT_CONTAINS(message, part);
  }
  write_file_atomic(dir + "/config.json", "{\"model_type\": ");
  EXPECT_CONTAINS(message_of<UsageError>([&] { load_hf_into_tiny(dir); }), dir + "/config.json");
}

// --- hole 9: FIFOs -------------------------------------------------------------------------------------------------

// Replaces `path` with a FIFO and runs f, which must throw E naming the FIFO within a few seconds. A reader blocked on
// the FIFO is released (by opening its other end) so that the test fails instead of hanging.
template <typename E>
void expect_fifo_refused(const std::string& path, const std::function<void()>& f) {
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path;
  std::future<std::string> message = std::async(std::launch::async, [&] { return message_of<E>(f); });
  if (message.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "blocked on the FIFO " << path;
    const int fd = ::open(path.c_str(), O_WRONLY);
    if (fd >= 0) ::close(fd);
  }
  EXPECT_CONTAINS(message.get(), path);
}

TEST(CheckpointVerify, FifosInACheckpointAreRefusedWithoutBlocking) {
  const std::string saved = save_tiny("fifo");
  const std::string save_dir = fs::path(saved).parent_path().string();
  auto fresh_copy = [&] {
    const std::string copy = testing::temp_dir("fifo-copy") + "/iter_0000003";
    fs::copy(saved, copy);
    return copy;
  };
  expect_fifo_refused<RuntimeError>(save_dir + "/latest_checkpointed_iteration.txt",
                                    [&] { find_latest_checkpoint(save_dir); });
  for (const char* name : {"manifest.json", "trainer_state.json", "model.safetensors", "config.json"}) {
    const std::string ckpt = fresh_copy();
    expect_fifo_refused<RuntimeError>(ckpt + "/" + name, [&] { load_into_tiny(ckpt); });
  }
  // index.json makes a directory the sharded format; one the manifest lists, and one read directly.
  const std::string ckpt = fresh_copy();
  json manifest = read_json(ckpt + "/manifest.json");
  manifest["files"]["index.json"] = {{"bytes", 2}, {"crc32c", crc32c("{}")}};
  write_json(ckpt + "/manifest.json", manifest);
  expect_fifo_refused<RuntimeError>(ckpt + "/index.json", [&] { load_into_tiny(ckpt); });
  expect_fifo_refused<RuntimeError>(ckpt + "/index.json", [&] { TensorCatalog::open_checkpoint(ckpt); });
}

TEST(HfFolderVerify, FifosInAHuggingFaceFolderAreRefusedWithoutBlocking) {
  Tiny tiny;
  const std::string single = testing::temp_dir("hf-fifo") + "/hf";
  export_hf_model(single, *tiny.model);
  expect_fifo_refused<Error>(single + "/model.safetensors", [&] { load_hf_into_tiny(single); });
  expect_fifo_refused<Error>(single + "/config.json", [&] { load_hf_into_tiny(single); });
  const std::string sharded = hf_folder_with_index("hf-fifo-index");
  expect_fifo_refused<Error>(sharded + "/weights.safetensors", [&] { load_hf_into_tiny(sharded); });
  expect_fifo_refused<Error>(sharded + "/model.safetensors.index.json", [&] { load_hf_into_tiny(sharded); });
}

}  // namespace
}  // namespace primus
