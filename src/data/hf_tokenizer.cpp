// tokenizer.json and vocab.json + merges.txt loaders for byte-level BPE.
#include "data/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "data/bpe_text.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("[tokenizer] cannot open {} {}", what, path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

json parse_json(const std::string& path, const char* what) {
  const std::string text = read_file(path, what);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("[tokenizer] {}: not valid JSON at byte {}: {}", path, e.byte, e.what()));
  } catch (const json::out_of_range& e) {  // a number past a double's range (1e999): no parse error to nlohmann
    throw UsageError(
        fmt::format("[tokenizer] {}: not valid JSON: a number outside the range of a double ({})", path, e.what()));
  }
}

// Reads the fields of one tokenizer.json, naming the file and field path in every error.
class TokenizerJsonReader {
 public:
  TokenizerJsonReader(std::string path, const json& root) : path_(std::move(path)), root_(root) {}

  std::unique_ptr<BpeTokenizer> load();

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw UsageError(fmt::format("[tokenizer] {}: {}: {}", path_, field, why));
  }
  const json& member(const json& obj, const std::string& key, const std::string& field) const {
    if (!obj.is_object() || !obj.contains(key)) fail(field, "missing");
    return obj.at(key);
  }
  bool flag(const json& obj, const char* key, bool fallback, const std::string& field) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    if (!obj.at(key).is_boolean()) fail(field + "." + key, "expected true or false");
    return obj.at(key).get<bool>();
  }

  void read_vocab(const json& model);
  std::vector<std::pair<int32_t, int32_t>> read_merges(const json& model) const;
  void read_added_tokens();
  void read_pre_tokenizer(const json& node, const std::string& field, bool first);
  void read_normalizer(const json& node, const std::string& field);
  std::optional<int32_t> special_id(const std::string& content) const;
  void read_bos_eos();

  std::string path_;
  const json& root_;
  std::vector<std::optional<std::string>> tokens_;          // bytes by id
  std::unordered_map<std::string, int32_t> vocab_;          // spelled token -> id
  std::unordered_map<std::string, int32_t> added_content_;  // added token text -> id
  BpeTokenizer::Options options_;
};

void TokenizerJsonReader::read_added_tokens() {
  if (!root_.contains("added_tokens") || root_.at("added_tokens").is_null()) return;
  const json& list = root_.at("added_tokens");
  if (!list.is_array()) fail("added_tokens", "expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string field = fmt::format("added_tokens[{}]", i);
    const json& t = list[i];
    const json& id = member(t, "id", field + ".id");
    const json& content = member(t, "content", field + ".content");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24)) {
      fail(field + ".id", "expected an integer in [0, 16777216)");
    }
    if (!content.is_string() || content.get<std::string>().empty()) fail(field + ".content", "expected a string");
    AddedToken a;
    a.content = content.get<std::string>();
    a.id = id.get<int32_t>();
    a.special = flag(t, "special", false, field);
    a.lstrip = flag(t, "lstrip", false, field);
    a.rstrip = flag(t, "rstrip", false, field);
    a.single_word = flag(t, "single_word", false, field);
    added_content_[a.content] = a.id;
    options_.added.push_back(std::move(a));
  }
}

void TokenizerJsonReader::read_vocab(const json& model) {
  const json& vocab = member(model, "vocab", "model.vocab");
  if (!vocab.is_object()) fail("model.vocab", "expected an object {token: id}");
  for (const auto& [spelled, id_json] : vocab.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() >= (1 << 24)) {
      fail(fmt::format("model.vocab[\"{}\"]", spelled), "expected an id in [0, 16777216)");
    }
    const auto id = id_json.get<int32_t>();
    vocab_[spelled] = id;
    std::optional<std::string> bytes = byte_level_decode(spelled);
    if (!bytes) {
      if (added_content_.count(spelled)) continue;  // an added token's text, matched before BPE
      fail(fmt::format("model.vocab[\"{}\"]", spelled),
           "not spelled in the byte-level alphabet, so this is not a byte-level BPE vocabulary (SentencePiece "
           "models load from tokenizer.model with SentencePieceTokenizer)");
    }
    if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<size_t>(id) + 1);
    tokens_[id] = std::move(bytes);
  }
}

std::vector<std::pair<int32_t, int32_t>> TokenizerJsonReader::read_merges(const json& model) const {
  std::vector<std::pair<int32_t, int32_t>> merges;
  if (!model.contains("merges")) return merges;
  const json& list = model.at("merges");
  if (!list.is_array()) fail("model.merges", "expected an array");
  merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        fail(fmt::format("model.merges[{}]", i), fmt::format("expected \"left right\", got \"{}\"", s));
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail(fmt::format("model.merges[{}]", i), "expected \"left right\" or [\"left\", \"right\"]");
    }
    const auto left = vocab_.find(a);
    const auto right = vocab_.find(b);
    if (left == vocab_.end() || right == vocab_.end()) {
      fail(fmt::format("model.merges[{}]", i),
           fmt::format("\"{}\" is not in model.vocab", left == vocab_.end() ? a : b));
    }
    if (!vocab_.count(a + b))
      fail(fmt::format("model.merges[{}]", i), fmt::format("\"{}\" is not in model.vocab", a + b));
    merges.emplace_back(left->second, right->second);
  }
  return merges;
}

void TokenizerJsonReader::read_pre_tokenizer(const json& node, const std::string& field, bool first) {
  if (node.is_null()) return;
  const std::string type = member(node, "type", field + ".type").get<std::string>();
  if (type == "Sequence") {
    const json& steps = member(node, "pretokenizers", field + ".pretokenizers");
    if (!steps.is_array()) fail(field + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < steps.size(); ++i) {
      read_pre_tokenizer(steps[i], fmt::format("{}.pretokenizers[{}]", field, i), first && i == 0);
    }
  } else if (type == "ByteLevel") {
    if (flag(node, "add_prefix_space", false, field)) {
      if (!first) fail(field + ".add_prefix_space", "supported only when ByteLevel is the first pre-tokenizer");
      options_.add_prefix_space = true;
    }
    if (flag(node, "use_regex", true, field)) options_.patterns.push_back({kGpt2Pattern, field + " (GPT-2 regex)"});
  } else if (type == "Split") {
    const json& pattern = member(node, "pattern", field + ".pattern");
    const std::string behavior = member(node, "behavior", field + ".behavior").get<std::string>();
    if (behavior != "Isolated")
      fail(field + ".behavior", fmt::format("'{}' is not supported (only Isolated)", behavior));
    if (flag(node, "invert", false, field)) fail(field + ".invert", "true is not supported");
    if (pattern.contains("Regex")) {
      options_.patterns.push_back({pattern.at("Regex").get<std::string>(), path_ + ": " + field + ".pattern.Regex"});
    } else if (pattern.contains("String")) {
      options_.patterns.push_back({"\\Q" + pattern.at("String").get<std::string>() + "\\E", path_ + ": " + field});
    } else {
      fail(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
  } else if (type == "Digits") {
    const bool individual = flag(node, "individual_digits", false, field);
    options_.patterns.push_back({individual ? R"(\p{N})" : R"(\p{N}+)", path_ + ": " + field});
  } else {
    fail(field + ".type", fmt::format("pre-tokenizer '{}' is not supported", type));
  }
}

void TokenizerJsonReader::read_normalizer(const json& node, const std::string& field) {
  if (node.is_null()) return;
  const std::string type = member(node, "type", field + ".type").get<std::string>();
  if (type == "NFC") {
    options_.nfc = true;
  } else if (type == "Sequence") {
    const json& steps = member(node, "normalizers", field + ".normalizers");
    for (size_t i = 0; i < steps.size(); ++i) read_normalizer(steps[i], fmt::format("{}.normalizers[{}]", field, i));
  } else {
    fail(field + ".type", fmt::format("normalizer '{}' is not supported (null or NFC)", type));
  }
}

std::optional<int32_t> TokenizerJsonReader::special_id(const std::string& content) const {
  if (const auto it = added_content_.find(content); it != added_content_.end()) return it->second;
  if (const auto it = vocab_.find(content); it != vocab_.end()) return it->second;
  return std::nullopt;
}

void TokenizerJsonReader::read_bos_eos() {
  std::optional<std::string> eos, bos;
  const fs::path config = fs::path(path_).parent_path() / "tokenizer_config.json";
  if (fs::exists(config)) {
    const json c = parse_json(config.string(), "tokenizer config");
    const auto token_text = [&](const char* key) -> std::optional<std::string> {
      if (!c.contains(key) || c.at(key).is_null()) return std::nullopt;
      const json& v = c.at(key);
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object() && v.contains("content") && v.at("content").is_string())
        return v.at("content").get<std::string>();
      throw UsageError(
          fmt::format("[tokenizer] {}: {}: expected a string or {{\"content\": ...}}", config.string(), key));
    };
    eos = token_text("eos_token");
    bos = token_text("bos_token");
    for (const auto& [key, text] : {std::pair{"eos_token", eos}, std::pair{"bos_token", bos}}) {
      if (text && !special_id(*text)) {
        throw UsageError(
            fmt::format("[tokenizer] {}: {} '{}' is not a token of {}", config.string(), key, *text, path_));
      }
    }
  }
  if (!eos) {
    for (const char* candidate :
         {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<eos>", "<｜end▁of▁sentence｜>"}) {
      if (added_content_.count(candidate)) {
        eos = candidate;
        break;
      }
    }
  }
  if (!eos) {
    throw UsageError(
        fmt::format("[tokenizer] {}: cannot tell the end-of-document token: put a tokenizer_config.json "
                    "with eos_token beside it",
                    path_));
  }
  options_.eod_id = *special_id(*eos);
  if (bos) {
    options_.bos_id = special_id(*bos);
    return;
  }
  // The template that wraps a single sequence names the beginning-of-document token first, if it has one.
  const auto from_template = [&](const json& p) -> std::optional<int32_t> {
    if (!p.is_object() || p.value("type", "") != "TemplateProcessing" || !p.contains("single")) return std::nullopt;
    const json& single = p.at("single");
    if (!single.is_array() || single.empty() || !single[0].contains("SpecialToken")) return std::nullopt;
    return special_id(single[0].at("SpecialToken").value("id", ""));
  };
  if (root_.contains("post_processor")) {
    const json& p = root_.at("post_processor");
    options_.bos_id = from_template(p);
    if (!options_.bos_id && p.is_object() && p.contains("processors") && p.at("processors").is_array()) {
      for (const json& step : p.at("processors")) {
        if ((options_.bos_id = from_template(step))) break;
      }
    }
  }
}

std::unique_ptr<BpeTokenizer> TokenizerJsonReader::load() {
  const json& model = member(root_, "model", "model");
  const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE") fail("model.type", fmt::format("'{}' is not supported (byte-level BPE only)", type));
  if (flag(model, "byte_fallback", false, "model")) {
    fail("model.byte_fallback",
         "true means a SentencePiece-style vocabulary; load tokenizer.model with "
         "SentencePieceTokenizer instead");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && !model.at(key).get<std::string>().empty()) {
      fail(std::string("model.") + key, "is not supported");
    }
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() != 0.0) {
    fail("model.dropout", "BPE dropout is not supported");
  }
  read_added_tokens();
  read_vocab(model);
  const std::vector<std::pair<int32_t, int32_t>> merges = read_merges(model);
  const bool ignore_merges = flag(model, "ignore_merges", false, "model");
  if (root_.contains("normalizer")) read_normalizer(root_.at("normalizer"), "normalizer");
  if (!root_.contains("pre_tokenizer") || root_.at("pre_tokenizer").is_null()) {
    fail("pre_tokenizer", "missing: a byte-level BPE tokenizer needs a ByteLevel pre-tokenizer");
  }
  read_pre_tokenizer(root_.at("pre_tokenizer"), "pre_tokenizer", true);
  read_bos_eos();
  options_.name = "HuggingFaceTokenizer";
  BytePairEncoder encoder(std::move(tokens_), BytePairEncoder::MergeOrder::kMergeList, merges, ignore_merges, path_);
  return std::make_unique<BpeTokenizer>(std::move(encoder), std::move(options_));
}

}  // namespace

std::unique_ptr<BpeTokenizer> load_hf_tokenizer(const std::string& given_path) {
  std::string path = given_path;
  if (fs::is_directory(path)) path = (fs::path(path) / "tokenizer.json").string();
  const json root = parse_json(path, "tokenizer.json");
  try {
    return TokenizerJsonReader(path, root).load();
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    throw UsageError(fmt::format("[tokenizer] {}: unexpected content: {}", path, e.what()));
  }
}

std::unique_ptr<BpeTokenizer> load_gpt2_bpe_tokenizer(const std::string& given_path) {
  fs::path vocab_path = given_path;
  if (fs::is_directory(vocab_path)) vocab_path /= "vocab.json";
  const fs::path merges_path = vocab_path.parent_path() / "merges.txt";
  const json vocab = parse_json(vocab_path.string(), "vocab.json");
  if (!vocab.is_object())
    throw UsageError(fmt::format("[tokenizer] {}: expected an object {{token: id}}", vocab_path.string()));

  std::vector<std::optional<std::string>> tokens;
  std::unordered_map<std::string, int32_t> ids;
  for (const auto& [spelled, id_json] : vocab.items()) {
    const std::optional<std::string> bytes = byte_level_decode(spelled);
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() >= (1 << 24) || !bytes) {
      throw UsageError(
          fmt::format("[tokenizer] {}: entry \"{}\": expected a byte-level token with an id in [0, 16777216)",
                      vocab_path.string(), spelled));
    }
    const auto id = id_json.get<int32_t>();
    ids[spelled] = id;
    if (static_cast<size_t>(id) >= tokens.size()) tokens.resize(static_cast<size_t>(id) + 1);
    tokens[id] = *bytes;
  }

  const std::string text = read_file(merges_path.string(), "merges file");
  std::vector<std::pair<int32_t, int32_t>> merges;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    const auto fail = [&](const std::string& why) {
      return UsageError(fmt::format("[tokenizer] {}:{}: {} (line '{}')", merges_path.string(), line_no, why, line));
    };
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      throw fail("expected `left right`");
    }
    const auto left = ids.find(std::string(line.substr(0, space)));
    const auto right = ids.find(std::string(line.substr(space + 1)));
    if (left == ids.end() || right == ids.end()) throw fail("a side is not in vocab.json");
    if (!ids.count(left->first + right->first)) throw fail("the merged token is not in vocab.json");
    merges.emplace_back(left->second, right->second);
  }

  BpeTokenizer::Options o;
  o.name = "GPT2BPETokenizer";
  o.patterns.push_back({kGpt2Pattern, vocab_path.string() + " (GPT-2 regex)"});
  const auto eod = ids.find("<|endoftext|>");
  if (eod == ids.end()) throw UsageError(fmt::format("[tokenizer] {}: no <|endoftext|> entry", vocab_path.string()));
  o.eod_id = eod->second;
  o.added.push_back(AddedToken{.content = "<|endoftext|>", .id = eod->second});
  BytePairEncoder encoder(std::move(tokens), BytePairEncoder::MergeOrder::kMergeList, merges, false,
                          vocab_path.string());
  return std::make_unique<BpeTokenizer>(std::move(encoder), std::move(o));
}

}  // namespace primus
