// MMIDIDX reading (with validation) and writing.
#include "data/indexed_dataset.h"

#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace {

constexpr unsigned char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kVersion = 1;
constexpr size_t kBinBufferBytes = size_t{1} << 20;

template <typename T>
T load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

[[noreturn]] void corrupt(const std::string& path, uint64_t offset, const std::string& what) {
  throw RuntimeError(fmt::format("{}: corrupt indexed dataset at byte offset {}: {}", path, offset, what));
}

// Token range of each dtype the writer can store.
bool fits(TokenDType dtype, int32_t token) {
  switch (dtype) {
    case TokenDType::kU8:
      return token >= 0 && token <= 255;
    case TokenDType::kI8:
      return token >= -128 && token <= 127;
    case TokenDType::kI16:
      return token >= -32768 && token <= 32767;
    case TokenDType::kU16:
      return token >= 0 && token <= 65535;
    case TokenDType::kI32:
    case TokenDType::kI64:
      return true;
    default:
      return false;
  }
}

}  // namespace

int64_t token_dtype_size(uint8_t code) {
  switch (static_cast<TokenDType>(code)) {
    case TokenDType::kU8:
    case TokenDType::kI8:
      return 1;
    case TokenDType::kI16:
    case TokenDType::kU16:
      return 2;
    case TokenDType::kI32:
    case TokenDType::kF32:
      return 4;
    case TokenDType::kI64:
    case TokenDType::kF64:
      return 8;
  }
  return 0;
}

std::string token_dtype_name(uint8_t code) {
  switch (static_cast<TokenDType>(code)) {
    case TokenDType::kU8:
      return "uint8";
    case TokenDType::kI8:
      return "int8";
    case TokenDType::kI16:
      return "int16";
    case TokenDType::kI32:
      return "int32";
    case TokenDType::kI64:
      return "int64";
    case TokenDType::kF64:
      return "float64";
    case TokenDType::kF32:
      return "float32";
    case TokenDType::kU16:
      return "uint16";
  }
  return "unknown";
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kU16 : TokenDType::kI32;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

bool indexed_dataset_exists(const std::string& prefix) {
  std::error_code ec;
  return std::filesystem::is_regular_file(idx_path(prefix), ec) &&
         std::filesystem::is_regular_file(bin_path(prefix), ec);
}

std::string strip_indexed_suffix(const std::string& path) {
  if (path.ends_with(".idx") || path.ends_with(".bin")) return path.substr(0, path.size() - 4);
  return path;
}

IndexedDataset::IndexedDataset(const std::string& prefix, bool multimodal) : prefix_(prefix) {
  const std::string ipath = idx_path(prefix);
  const std::string bpath = bin_path(prefix);
  for (const std::string& path : {ipath, bpath}) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      throw UsageError(
          fmt::format("indexed dataset '{}': {} does not exist (expected {} and {})", prefix, path, ipath, bpath));
    }
  }
  idx_ = std::make_shared<const MappedFile>(ipath);
  bin_ = std::make_shared<const MappedFile>(bpath);
  const unsigned char* p = idx_->data();
  const uint64_t size = idx_->size();

  if (size < kIdxHeaderBytes) {
    corrupt(ipath, size, fmt::format("file ends inside the {}-byte header ({} bytes)", kIdxHeaderBytes, size));
  }
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) corrupt(ipath, 0, "magic is not MMIDIDX\\0\\0");
  uint64_t version = load<uint64_t>(p + 9);
  if (version != kVersion) corrupt(ipath, 9, fmt::format("version {} (only version 1 is known)", version));
  uint8_t code = p[17];
  itemsize_ = token_dtype_size(code);
  if (itemsize_ == 0) corrupt(ipath, 17, fmt::format("unknown dtype code {}", code));
  if (code == static_cast<uint8_t>(TokenDType::kF32) || code == static_cast<uint8_t>(TokenDType::kF64)) {
    corrupt(ipath, 17, fmt::format("dtype {} cannot hold token ids", token_dtype_name(code)));
  }
  dtype_ = static_cast<TokenDType>(code);

  uint64_t s = load<uint64_t>(p + 18);
  uint64_t d = load<uint64_t>(p + 26);
  // Bounds that keep the size arithmetic below far from overflow; larger counts cannot match any real file.
  constexpr uint64_t kMaxCount = uint64_t{1} << 56;
  if (s > kMaxCount) corrupt(ipath, 18, fmt::format("sequence count {} is out of range", s));
  if (d > kMaxCount) corrupt(ipath, 26, fmt::format("document-index size {} is out of range", d));
  if (d < 1) corrupt(ipath, 26, "document-index size is 0 (it holds at least the leading 0)");
  uint64_t expected = kIdxHeaderBytes + 12 * s + 8 * d + (multimodal ? s : 0);
  if (size < expected) {
    corrupt(ipath, size,
            fmt::format("file is truncated: {} sequences and {} document-index entries need {} bytes, it has {}", s, d,
                        expected, size));
  }
  if (size > expected) {
    corrupt(ipath, expected,
            fmt::format("{} unexpected bytes after the arrays of {} sequences and {} document-index entries{}",
                        size - expected, s, d, multimodal ? "" : " (a multimodal dataset?)"));
  }
  num_sequences_ = static_cast<int64_t>(s);
  num_doc_entries_ = static_cast<int64_t>(d);
  lengths_ = p + kIdxHeaderBytes;
  pointers_ = lengths_ + 4 * s;
  documents_ = pointers_ + 8 * s;

  // Pointers must be the running sum of lengths × itemsize, so every sequence lies inside the .bin.
  uint64_t next_pointer = 0;
  for (int64_t i = 0; i < num_sequences_; ++i) {
    int32_t length = load<int32_t>(lengths_ + 4 * i);
    if (length < 0) corrupt(ipath, kIdxHeaderBytes + 4 * i, fmt::format("sequence {} has length {}", i, length));
    int64_t pointer = load<int64_t>(pointers_ + 8 * i);
    if (static_cast<uint64_t>(pointer) != next_pointer || pointer < 0) {
      corrupt(ipath, kIdxHeaderBytes + 4 * s + 8 * i,
              fmt::format("sequence {} points at .bin byte {}, expected {} (the sum of the lengths before it × {})", i,
                          pointer, next_pointer, itemsize_));
    }
    next_pointer += static_cast<uint64_t>(length) * static_cast<uint64_t>(itemsize_);
  }
  int64_t previous = 0;
  for (int64_t k = 0; k < num_doc_entries_; ++k) {
    int64_t entry = load<int64_t>(documents_ + 8 * k);
    uint64_t at = kIdxHeaderBytes + 12 * s + 8 * k;
    if (k == 0 && entry != 0) corrupt(ipath, at, fmt::format("document index starts at {}, not 0", entry));
    if (entry < previous || entry > num_sequences_) {
      corrupt(ipath, at,
              fmt::format("document-index entry {} is {}: outside [{}, {}] (entries rise to the sequence count)", k,
                          entry, previous, num_sequences_));
    }
    previous = entry;
  }
  if (previous != num_sequences_) {
    corrupt(ipath, kIdxHeaderBytes + 12 * s + 8 * (d - 1),
            fmt::format("document index ends at {}, not at the sequence count {}", previous, num_sequences_));
  }
  if (bin_->size() != next_pointer) {
    corrupt(bpath, std::min<uint64_t>(bin_->size(), next_pointer),
            fmt::format("file has {} bytes; {} needs {} ({} tokens of {} bytes)", bin_->size(), ipath, next_pointer,
                        next_pointer / static_cast<uint64_t>(itemsize_), itemsize_));
  }
  num_tokens_ = static_cast<int64_t>(next_pointer) / itemsize_;
}

int32_t IndexedDataset::sequence_length(int64_t sequence) const {
  PRIMUS_CHECK(sequence >= 0 && sequence < num_sequences_, "{}: sequence {} outside [0, {})", prefix_, sequence,
               num_sequences_);
  return load<int32_t>(lengths_ + 4 * sequence);
}

int64_t IndexedDataset::sequence_pointer(int64_t sequence) const {
  PRIMUS_CHECK(sequence >= 0 && sequence < num_sequences_, "{}: sequence {} outside [0, {})", prefix_, sequence,
               num_sequences_);
  return load<int64_t>(pointers_ + 8 * sequence);
}

int64_t IndexedDataset::document_entry(int64_t k) const {
  PRIMUS_CHECK(k >= 0 && k < num_doc_entries_, "{}: document-index entry {} outside [0, {})", prefix_, k,
               num_doc_entries_);
  return load<int64_t>(documents_ + 8 * k);
}

void IndexedDataset::read(int64_t sequence, int64_t offset, std::span<int32_t> out) const {
  int64_t length = sequence_length(sequence);
  int64_t count = static_cast<int64_t>(out.size());
  PRIMUS_CHECK(offset >= 0 && count >= 0 && offset + count <= length,
               "{}: tokens [{}, {}) are outside sequence {} of length {}", prefix_, offset, offset + count, sequence,
               length);
  uint64_t byte = static_cast<uint64_t>(sequence_pointer(sequence) + offset * itemsize_);
  const unsigned char* p = bin_->data() + byte;
  switch (dtype_) {
    case TokenDType::kU8:
      for (int64_t i = 0; i < count; ++i) out[i] = p[i];
      break;
    case TokenDType::kI8:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int8_t>(p[i]);
      break;
    case TokenDType::kI16:
      for (int64_t i = 0; i < count; ++i) out[i] = load<int16_t>(p + 2 * i);
      break;
    case TokenDType::kU16:
      for (int64_t i = 0; i < count; ++i) out[i] = load<uint16_t>(p + 2 * i);
      break;
    case TokenDType::kI32:
      if (count > 0) std::memcpy(out.data(), p, static_cast<size_t>(count) * 4);
      break;
    case TokenDType::kI64:
      for (int64_t i = 0; i < count; ++i) {
        int64_t token = load<int64_t>(p + 8 * i);
        if (token < std::numeric_limits<int32_t>::min() || token > std::numeric_limits<int32_t>::max()) {
          throw RuntimeError(fmt::format("{}: corrupt indexed dataset at byte offset {}: token {} is outside int32",
                                         bin_->path(), byte + 8 * static_cast<uint64_t>(i), token));
        }
        out[i] = static_cast<int32_t>(token);
      }
      break;
    default:
      PRIMUS_CHECK(false, "{}: unreadable dtype {}", prefix_, token_dtype_name(static_cast<uint8_t>(dtype_)));
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t sequence) const {
  std::vector<int32_t> tokens(static_cast<size_t>(sequence_length(sequence)));
  read(sequence, 0, tokens);
  return tokens;
}

struct IndexedDatasetWriter::Files {
  explicit Files(const std::string& prefix) : bin(bin_path(prefix)) {}
  AtomicFileWriter bin;
};

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDType dtype)
    : prefix_(prefix), dtype_(dtype), itemsize_(token_dtype_size(static_cast<uint8_t>(dtype))) {
  PRIMUS_CHECK(itemsize_ > 0 && dtype != TokenDType::kF32 && dtype != TokenDType::kF64,
               "indexed dataset writer: dtype {} cannot hold token ids", token_dtype_name(static_cast<uint8_t>(dtype)));
  std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) throw RuntimeError(fmt::format("{}: cannot create directory: {}", parent.string(), ec.message()));
  }
  files_ = std::make_unique<Files>(prefix);
  buffer_.reserve(kBinBufferBytes);
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  PRIMUS_CHECK(!finished_, "{}: add_sequence after finish", prefix_);
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw UsageError(fmt::format("{}: sequence {} has {} tokens, more than an int32 length can hold", prefix_,
                                 lengths_.size(), tokens.size()));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t token = tokens[i];
    if (!fits(dtype_, token)) {
      throw UsageError(fmt::format("{}: token {} (sequence {}, position {}) does not fit the dataset dtype {}", prefix_,
                                   token, lengths_.size(), i, token_dtype_name(static_cast<uint8_t>(dtype_))));
    }
    switch (dtype_) {
      case TokenDType::kU8:
      case TokenDType::kI8:
        buffer_.push_back(static_cast<char>(token));
        break;
      case TokenDType::kI16:
        put(buffer_, static_cast<int16_t>(token));
        break;
      case TokenDType::kU16:
        put(buffer_, static_cast<uint16_t>(token));
        break;
      case TokenDType::kI32:
        put(buffer_, token);
        break;
      default:
        put(buffer_, static_cast<int64_t>(token));
        break;
    }
    if (buffer_.size() >= kBinBufferBytes) flush_bin();
  }
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetWriter::end_document() {
  PRIMUS_CHECK(!finished_, "{}: end_document after finish", prefix_);
  documents_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  if (!tokens.empty()) add_sequence(tokens);
  end_document();
}

void IndexedDatasetWriter::flush_bin() {
  files_->bin.append(buffer_);
  buffer_.clear();
}

void IndexedDatasetWriter::finish() {
  PRIMUS_CHECK(!finished_, "{}: finish called twice", prefix_);
  if (documents_.back() != static_cast<int64_t>(lengths_.size())) end_document();
  flush_bin();

  AtomicFileWriter idx(idx_path(prefix_));
  std::string header(reinterpret_cast<const char*>(kMagic), sizeof(kMagic));
  put(header, kVersion);
  header.push_back(static_cast<char>(dtype_));
  put(header, static_cast<uint64_t>(lengths_.size()));
  put(header, static_cast<uint64_t>(documents_.size()));
  idx.append(header);
  idx.append(lengths_.data(), lengths_.size() * sizeof(int32_t));
  std::string chunk;
  int64_t pointer = 0;
  for (int32_t length : lengths_) {
    put(chunk, pointer);
    pointer += static_cast<int64_t>(length) * itemsize_;
    if (chunk.size() >= kBinBufferBytes) {
      idx.append(chunk);
      chunk.clear();
    }
  }
  idx.append(chunk);
  idx.append(documents_.data(), documents_.size() * sizeof(int64_t));
  files_->bin.commit();
  idx.commit();
  finished_ = true;
}

}  // namespace primus
