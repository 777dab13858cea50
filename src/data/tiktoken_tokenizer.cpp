// tiktoken rank file reader and the per-encoding presets (regex, special tokens, chunking).
#include "data/tiktoken_tokenizer.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

// Llama 3 (meta-llama/llama3 tokenizer.py) and cl100k_base share this pattern.
constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::optional<std::string> base64_decode(std::string_view in) {
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else {
        if (pad) return std::nullopt;  // data after padding
        v[k] = base64_value(c);
        if (v[k] < 0) return std::nullopt;
      }
    }
    const uint32_t triple = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(triple >> 16));
    if (pad < 2) out.push_back(static_cast<char>((triple >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(triple & 0xFF));
  }
  return out;
}

std::vector<AddedToken> specials(std::initializer_list<std::pair<const char*, int32_t>> list) {
  std::vector<AddedToken> out;
  for (const auto& [text, id] : list) out.push_back(AddedToken{.content = text, .id = id});
  return out;
}

// Llama 3.1+ names for the 256 reserved ids (3.0 called 128004, 128008 and 128010 reserved tokens).
std::vector<AddedToken> llama3_specials() {
  std::vector<AddedToken> out = specials({{"<|begin_of_text|>", 128000},
                                          {"<|end_of_text|>", 128001},
                                          {"<|reserved_special_token_0|>", 128002},
                                          {"<|reserved_special_token_1|>", 128003},
                                          {"<|finetune_right_pad_id|>", 128004},
                                          {"<|reserved_special_token_2|>", 128005},
                                          {"<|start_header_id|>", 128006},
                                          {"<|end_header_id|>", 128007},
                                          {"<|eom_id|>", 128008},
                                          {"<|eot_id|>", 128009},
                                          {"<|python_tag|>", 128010}});
  for (int i = 3; i <= 247; ++i) {
    out.push_back(AddedToken{.content = fmt::format("<|reserved_special_token_{}|>", i), .id = 128008 + i});
  }
  return out;
}

}  // namespace

std::vector<std::optional<std::string>> read_tiktoken_ranks(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("[tokenizer] cannot open the rank file {}", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string data = buffer.str();
  std::vector<std::optional<std::string>> tokens;
  size_t line_no = 0;
  size_t count = 0;
  for (size_t pos = 0; pos < data.size();) {
    size_t eol = data.find('\n', pos);
    if (eol == std::string::npos) eol = data.size();
    std::string_view line(data.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const auto fail = [&](const std::string& why) {
      return UsageError(fmt::format("[tokenizer] {}:{}: {} (expected `base64 rank`, got '{}')", path, line_no, why,
                                    line.substr(0, 80)));
    };
    if (space == std::string_view::npos) throw fail("no space between token and rank");
    const std::optional<std::string> bytes = base64_decode(line.substr(0, space));
    if (!bytes) throw fail("invalid base64");
    const std::string_view rank_text = line.substr(space + 1);
    int64_t rank = -1;
    const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0 || rank >= (1 << 24)) {
      throw fail("the rank is not an integer in [0, 16777216)");
    }
    if (static_cast<size_t>(rank) >= tokens.size()) tokens.resize(static_cast<size_t>(rank) + 1);
    if (tokens[rank]) throw fail(fmt::format("rank {} appears twice", rank));
    tokens[rank] = *bytes;
    ++count;
  }
  if (count == 0) throw UsageError(fmt::format("[tokenizer] {}: the rank file has no ranks", path));
  return tokens;
}

std::unique_ptr<BpeTokenizer> load_tiktoken_tokenizer(const std::string& given_path, const std::string& type) {
  std::string path = given_path;
  if (fs::is_directory(path)) path = (fs::path(path) / "tokenizer.model").string();
  std::vector<std::optional<std::string>> ranks = read_tiktoken_ranks(path);
  size_t count = 0;
  for (const auto& t : ranks) count += t.has_value();

  BpeTokenizer::Options o;
  o.name = type;
  std::string encoding;
  const char* pattern = nullptr;
  if (count == 128000) {
    encoding = "Llama 3";
    pattern = kCl100kPattern;
    o.added = llama3_specials();
    o.eod_id = 128001;
    o.bos_id = 128000;
    o.llama3_chunks = true;
  } else if (count == 100256) {
    encoding = "cl100k_base";
    pattern = kCl100kPattern;
    o.added = specials({{"<|endoftext|>", 100257},
                        {"<|fim_prefix|>", 100258},
                        {"<|fim_middle|>", 100259},
                        {"<|fim_suffix|>", 100260},
                        {"<|endofprompt|>", 100276}});
    o.eod_id = 100257;
  } else if (count == 199998) {
    encoding = "o200k_base";
    pattern = kO200kPattern;
    o.added = specials({{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}});
    o.eod_id = 199999;
  } else if (count == 50256 || count == 50280) {
    encoding = count == 50256 ? "r50k_base" : "p50k_base";
    pattern = kGpt2Pattern;
    o.added = specials({{"<|endoftext|>", 50256}});
    o.eod_id = 50256;
  } else {
    throw UsageError(fmt::format(
        "[tokenizer {}] {}: {} ranks match no known encoding (Llama 3: 128000, cl100k_base: 100256, o200k_base: "
        "199998, r50k_base: 50256, p50k_base: 50280)",
        type, path, count));
  }
  if (type == "Llama3Tokenizer" && encoding != "Llama 3") {
    throw UsageError(
        fmt::format("[tokenizer Llama3Tokenizer] {} holds {} ranks ({}), not Llama 3's 128000; use "
                    "TikTokenizer for other rank files",
                    path, count, encoding));
  }
  o.patterns.push_back({pattern, fmt::format("{} ({} regex)", path, encoding)});
  BytePairEncoder encoder(std::move(ranks), BytePairEncoder::MergeOrder::kTokenRank, {}, true, path);
  return std::make_unique<BpeTokenizer>(std::move(encoder), std::move(o));
}

}  // namespace primus
