// safetensors writer (ordering and padding as the reference writer) and memory-mapped validating reader.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <mutex>
#include <set>
#include <string_view>
#include <system_error>

#include "core/bf16.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/parallel_jobs.h"
#include "ops/ops.h"

namespace primus {

namespace {

// The reference reader refuses headers above 100 MB; a larger one is corrupt or hostile.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Every dtype the format defines. `order` is the position in the reference implementation's dtype enum, which
// its writer sorts by (descending) before names; `bits` is the element size.
struct DtypeInfo {
  const char* name;
  int order;
  uint32_t bits;
};

constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 0, 8},  {"F4", 1, 4},      {"F6_E2M3", 2, 6}, {"F6_E3M2", 3, 6}, {"U8", 4, 8},
    {"I8", 5, 8},    {"F8_E5M2", 6, 8}, {"F8_E4M3", 7, 8}, {"F8_E8M0", 8, 8}, {"I16", 9, 16},
    {"U16", 10, 16}, {"F16", 11, 16},   {"BF16", 12, 16},  {"I32", 13, 32},   {"U32", 14, 32},
    {"F32", 15, 32}, {"F64", 16, 64},   {"I64", 17, 64},   {"U64", 18, 64},   {"C64", 19, 64},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

std::string os_error(int err) { return std::generic_category().message(err); }

// Index of the first byte that is not part of well-formed UTF-8 (no overlongs, surrogates or code points
// above U+10FFFF), or npos.
size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n) return i;
    unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
    if (c1 < lo || c1 > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      unsigned char ck = static_cast<unsigned char>(s[i + k]);
      if (ck < 0x80 || ck > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

std::string shape_words(const Shape& shape) {
  return shape.empty() ? std::string("scalar") : fmt::format("{}", fmt::join(shape, "x"));
}

const char* json_type(const nlohmann::json& v) { return v.type_name(); }

// A non-negative integer that fits in 64 bits (what the format calls usize).
bool is_u64(const nlohmann::json& v) { return v.is_number_unsigned(); }

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
  }
  PRIMUS_CHECK(false, "dtype {} has no safetensors name", static_cast<int>(dtype));
}

std::optional<DType> dtype_from_safetensors(const std::string& name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8}) {
    if (name == safetensors_dtype_name(d)) return d;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape, const void* data) {
  if (name == "__metadata__") throw RuntimeError("safetensors: tensor name '__metadata__' is reserved");
  if (invalid_utf8_at(name) != std::string_view::npos) {
    throw RuntimeError(fmt::format("safetensors: tensor name '{}' is not valid UTF-8", name));
  }
  for (const Item& item : items_) {
    if (item.name == name) throw RuntimeError(fmt::format("safetensors: tensor '{}' added twice", name));
  }
  for (int64_t d : shape) {
    if (d < 0)
      throw RuntimeError(fmt::format("safetensors: tensor '{}' has negative dimension in {}", name, shape_str(shape)));
  }
  uint64_t nbytes = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
  PRIMUS_CHECK(data != nullptr || nbytes == 0, "safetensors: tensor '{}' has no data", name);
  items_.push_back(Item{name, dtype, shape, data, nbytes, Tensor(), Producer()});
}

void SafetensorsWriter::add(const std::string& name, const Tensor& tensor) {
  PRIMUS_CHECK(tensor.defined(), "safetensors: tensor '{}' is undefined", name);
  if (tensor.device().is_cpu()) {
    add(name, tensor.dtype(), tensor.shape(), tensor.data());
    items_.back().keep_alive = tensor;
    return;
  }
  // A device tensor: each piece through a host staging tensor, so the host never holds the whole tensor.
  const size_t element = dtype_size(tensor.dtype());
  const Tensor flat = tensor.reshape({tensor.numel()});
  add(name, tensor.dtype(), tensor.shape(), [flat, element](uint64_t offset, uint64_t bytes, void* dst) {
    const Tensor piece =
        flat.slice_elements(static_cast<int64_t>(offset / element), {static_cast<int64_t>(bytes / element)});
    Tensor staging = Tensor::empty(piece.shape(), piece.dtype());
    ops::copy(staging, piece);
    std::memcpy(dst, staging.data(), bytes);
  });
  items_.back().keep_alive = tensor;
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape, Producer produce) {
  PRIMUS_CHECK(produce != nullptr, "safetensors: tensor '{}' has no producer", name);
  // A placeholder pointer passes add()'s data check; write() reads through the producer, never through it.
  static const unsigned char kNoData = 0;
  add(name, dtype, shape, &kNoData);
  items_.back().data = nullptr;
  items_.back().produce = std::move(produce);
}

void SafetensorsWriter::add_metadata(const std::string& key, const std::string& value) {
  PRIMUS_CHECK(key != "format" || value == "pt", "safetensors: __metadata__.format must stay \"pt\", got \"{}\"",
               value);
  if (invalid_utf8_at(key) != std::string_view::npos || invalid_utf8_at(value) != std::string_view::npos) {
    throw RuntimeError(fmt::format("safetensors: metadata entry '{}' is not valid UTF-8", key));
  }
  metadata_[key] = value;
}

std::vector<const SafetensorsWriter::Item*> SafetensorsWriter::ordered() const {
  std::vector<const Item*> order;
  for (const Item& item : items_) order.push_back(&item);
  auto rank = [](DType d) { return find_dtype(safetensors_dtype_name(d))->order; };
  std::sort(order.begin(), order.end(), [&](const Item* a, const Item* b) {
    int ra = rank(a->dtype), rb = rank(b->dtype);
    return ra != rb ? ra > rb : a->name < b->name;
  });
  return order;
}

std::string SafetensorsWriter::header() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["__metadata__"] = nlohmann::ordered_json(metadata_);
  uint64_t offset = 0;
  for (const Item* item : ordered()) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = safetensors_dtype_name(item->dtype);
    entry["shape"] = item->shape;
    entry["data_offsets"] = {offset, offset + item->nbytes};
    j[item->name] = std::move(entry);
    offset += item->nbytes;
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

uint64_t SafetensorsWriter::file_bytes() const {
  uint64_t bytes = 8 + header().size();
  for (const Item& item : items_) bytes += item.nbytes;
  return bytes;
}

SafetensorsWriter::Written SafetensorsWriter::write(const std::string& path,
                                                    const std::function<void(uint64_t)>& on_bytes,
                                                    int threads) const {
  constexpr uint64_t kPieceBytes = uint64_t{16} << 20;
  // The 8-byte length and the header, then every tensor in pieces; each piece's place in the file is known up
  // front, so the pieces are written at their offsets by several threads.
  std::string start = header();
  const uint64_t n = start.size();
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  start.insert(0, prefix);
  struct Piece {
    const Item* item;  // null: `start`
    uint64_t begin;    // within the tensor's bytes
    uint64_t bytes;
    uint64_t at;       // in the file
  };
  std::vector<Piece> pieces = {{nullptr, 0, start.size(), 0}};
  uint64_t at = start.size();
  for (const Item* item : ordered()) {
    for (uint64_t begin = 0; begin < item->nbytes; begin += kPieceBytes) {
      const uint64_t bytes = std::min(kPieceBytes, item->nbytes - begin);
      pieces.push_back({item, begin, bytes, at});
      at += bytes;
    }
  }

  AtomicFileWriter out(path);
  std::vector<uint32_t> crcs(pieces.size(), 0);
  std::mutex producing;  // producers copy from a device or gather views: one at a time (see the header)
  PieceReporter report(on_bytes);
  run_parallel_jobs(
      pieces.size(), threads,
      [&](size_t k) {
        const Piece& p = pieces[k];
        thread_local std::vector<unsigned char> staging;  // this thread's produced pieces
        const unsigned char* bytes = nullptr;
        if (p.item == nullptr) {
          bytes = reinterpret_cast<const unsigned char*>(start.data());
        } else if (p.item->data != nullptr) {
          bytes = static_cast<const unsigned char*>(p.item->data) + p.begin;
        } else {
          std::lock_guard<std::mutex> lock(producing);
          staging.resize(std::max<size_t>(staging.size(), static_cast<size_t>(p.bytes)));
          p.item->produce(p.begin, p.bytes, staging.data());
          bytes = staging.data();
        }
        out.write_at(p.at, bytes, p.bytes);
        out.start_writeback(p.at, p.bytes);
        crcs[k] = crc32c(bytes, p.bytes);
        report.finished(p.bytes);
      },
      std::ref(report));
  Written written;
  for (size_t k = 0; k < pieces.size(); ++k) written.crc32c = crc32c_combine(written.crc32c, crcs[k], pieces[k].bytes);
  written.bytes = at;
  out.commit();
  return written;
}

// ---------------------------------------------------------------------------------------------------------
// Reader

struct SafetensorsFile::Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO is refused below, not waited on
  if (fd < 0) throw RuntimeError(fmt::format("cannot open {}: {}", path, os_error(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    throw RuntimeError(fmt::format("{}: not a regular file ({})", path, os_error(err != 0 ? err : EINVAL)));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw RuntimeError(
        fmt::format("{}: file is {} bytes, too short for the 8-byte header length at offset 0", path, file_size));
  }
  auto mapping = std::make_shared<Mapping>();
  void* base = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (base == MAP_FAILED) throw RuntimeError(fmt::format("cannot mmap {}: {}", path, os_error(map_err)));
  mapping->base = base;
  mapping->size = file_size;
  const unsigned char* bytes = static_cast<const unsigned char*>(base);

  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (n > file_size - 8) {
    throw RuntimeError(fmt::format("{}: header length {} at offset 0 exceeds file size {}", path, n, file_size));
  }
  if (n > kMaxHeaderBytes) {
    throw RuntimeError(
        fmt::format("{}: header length {} at offset 0 exceeds the limit of {} bytes", path, n, kMaxHeaderBytes));
  }
  std::string_view text(reinterpret_cast<const char*>(bytes + 8), n);
  if (size_t bad = invalid_utf8_at(text); bad != std::string_view::npos) {
    throw RuntimeError(fmt::format("{}: header is not valid UTF-8 (byte 0x{:02X} at offset {})", path,
                                   static_cast<unsigned>(bytes[8 + bad]), 8 + bad));
  }

  // Duplicate tensor names would silently shadow each other in a JSON object; catch them while parsing.
  std::string duplicate;
  std::set<std::string> seen;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::parse_error& e) {
    throw RuntimeError(fmt::format("{}: header JSON (offsets 8..{}) does not parse at header byte {}: {}", path, 8 + n,
                                   e.byte, e.what()));
  } catch (const nlohmann::json::out_of_range& e) {  // a number past a double's range (1e999): no parse error
    throw RuntimeError(fmt::format("{}: header JSON (offsets 8..{}) holds a number outside the range of a double ({})",
                                   path, 8 + n, e.what()));
  }
  if (!duplicate.empty()) throw RuntimeError(fmt::format("{}: header names tensor '{}' twice", path, duplicate));
  if (!header.is_object()) {
    throw RuntimeError(fmt::format("{}: header at offset 8 is a JSON {}, expected an object", path, json_type(header)));
  }

  SafetensorsFile file;
  file.path_ = path;
  struct Pending {
    SafetensorsEntry entry;
    uint64_t begin, end;
    uint32_t bits;
  };
  std::vector<Pending> pending;
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        throw RuntimeError(fmt::format("{}: __metadata__ is a JSON {}, expected an object", path, json_type(value)));
      }
      for (auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          throw RuntimeError(
              fmt::format("{}: __metadata__.{} is a JSON {}, expected a string", path, mk, json_type(mv)));
        }
        file.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    auto where = [&, &key = key](const std::string& field) {
      return fmt::format("{}: tensor '{}' {}", path, key, field);
    };
    if (!value.is_object())
      throw RuntimeError(where(fmt::format("is a JSON {}, expected an object", json_type(value))));
    auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) throw RuntimeError(where("has no string \"dtype\""));
    const std::string dtype_name = dtype_it->get<std::string>();
    const DtypeInfo* info = find_dtype(dtype_name);
    if (info == nullptr) throw RuntimeError(where(fmt::format("has unknown dtype \"{}\"", dtype_name)));
    auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) throw RuntimeError(where("has no \"shape\" array"));
    Shape shape;
    for (const auto& d : *shape_it) {
      if (!is_u64(d) || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        throw RuntimeError(
            where(fmt::format("shape {} has an entry that is not a non-negative integer", shape_it->dump())));
      }
      shape.push_back(d.get<int64_t>());
    }
    auto off_it = value.find("data_offsets");
    if (off_it == value.end() || !off_it->is_array() || off_it->size() != 2 || !is_u64((*off_it)[0]) ||
        !is_u64((*off_it)[1])) {
      throw RuntimeError(where("has no \"data_offsets\" pair of non-negative integers"));
    }
    Pending p;
    p.entry.name = key;
    p.entry.dtype = dtype_name;
    p.entry.shape = std::move(shape);
    p.begin = (*off_it)[0].get<uint64_t>();
    p.end = (*off_it)[1].get<uint64_t>();
    p.bits = info->bits;
    pending.push_back(std::move(p));
  }

  // Tensor data must tile [0, end) exactly: sorted by offsets, each begins where the previous ended.
  std::sort(pending.begin(), pending.end(),
            [](const Pending& a, const Pending& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t expected = 0;
  std::string previous;
  for (const Pending& p : pending) {
    const std::string& name = p.entry.name;
    if (p.end < p.begin) {
      throw RuntimeError(
          fmt::format("{}: tensor '{}' data_offsets [{}, {}] end before they begin", path, name, p.begin, p.end));
    }
    if (p.begin > expected) {
      throw RuntimeError(fmt::format("{}: gap in tensor data: bytes [{}, {}) before tensor '{}' belong to no tensor",
                                     path, expected, p.begin, name));
    }
    if (p.begin < expected) {
      throw RuntimeError(fmt::format("{}: tensor '{}' data_offsets [{}, {}] overlap tensor '{}' which ends at {}", path,
                                     name, p.begin, p.end, previous, expected));
    }
    uint64_t numel = 1;
    bool overflow = false;
    for (int64_t d : p.entry.shape) overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
    uint64_t bits = 0;
    overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(p.bits), &bits);
    if (overflow) {
      throw RuntimeError(fmt::format("{}: tensor '{}' shape {} is too large (byte count overflows)", path, name,
                                     shape_str(p.entry.shape)));
    }
    if (bits % 8 != 0 || bits / 8 != p.end - p.begin) {
      std::string need =
          bits % 8 == 0 ? fmt::format("{} bytes", bits / 8) : fmt::format("{} bits, not a whole number of bytes", bits);
      throw RuntimeError(fmt::format("{}: tensor '{}' data_offsets [{}, {}] but {} {} needs {}", path, name, p.begin,
                                     p.end, shape_words(p.entry.shape), p.entry.dtype, need));
    }
    expected = p.end;
    previous = name;
  }
  const uint64_t data_start = 8 + n;
  const uint64_t available = file_size - data_start;
  if (expected > available) {
    throw RuntimeError(fmt::format("{}: truncated: tensor data ends at offset {} but the file is {} bytes", path,
                                   data_start + expected, file_size));
  }
  if (expected < available) {
    throw RuntimeError(
        fmt::format("{}: {} trailing bytes after the last tensor (data ends at offset {}, file is {} "
                    "bytes)",
                    path, available - expected, data_start + expected, file_size));
  }

  for (Pending& p : pending) {
    p.entry.data_offset = data_start + p.begin;
    p.entry.nbytes = p.end - p.begin;
    p.entry.data = bytes + p.entry.data_offset;
    file.index_[p.entry.name] = file.entries_.size();
    file.entries_.push_back(std::move(p.entry));
  }
  file.mapping_ = std::move(mapping);
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsFile::require(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) throw RuntimeError(fmt::format("{}: no tensor named '{}'", path_, name));
  return *e;
}

Tensor SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsEntry& e = require(name);
  Tensor out = Tensor::empty(e.shape, DType::kF32);
  float* dst = out.f32();
  const unsigned char* src = static_cast<const unsigned char*>(e.data);
  const size_t count = static_cast<size_t>(out.numel());
  // Third-party files need not align tensors, so 16-bit elements are loaded with memcpy.
  if (e.dtype == "F32") {
    std::memcpy(dst, src, e.nbytes);
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    const bool bf16 = e.dtype == "BF16";
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  } else {
    throw RuntimeError(
        fmt::format("{}: tensor '{}' has dtype {}; only F32, BF16 and F16 can be read as f32", path_, name, e.dtype));
  }
  return out;
}

void SafetensorsFile::read_f32_into(const std::string& name, int64_t begin, int64_t count, float* dst) const {
  const SafetensorsEntry& e = require(name);
  const int64_t numel = shape_numel(e.shape);
  if (begin < 0 || count < 0 || begin > numel || count > numel - begin) {
    throw RuntimeError(fmt::format("{}: tensor '{}' has {} elements; elements [{}, {}) are outside it", path_, name,
                                   numel, begin, begin + count));
  }
  const unsigned char* src = static_cast<const unsigned char*>(e.data);
  if (e.dtype == "F32") {
    std::memcpy(dst, src + 4 * begin, static_cast<size_t>(count) * 4);
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    const bool bf16 = e.dtype == "BF16";
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * (begin + i), 2);
      dst[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  } else {
    throw RuntimeError(
        fmt::format("{}: tensor '{}' has dtype {}; only F32, BF16 and F16 can be read as f32", path_, name, e.dtype));
  }
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = require(name);
  std::optional<DType> dtype = dtype_from_safetensors(e.dtype);
  if (!dtype) {
    throw RuntimeError(
        fmt::format("{}: tensor '{}' has dtype {}, which has no native equivalent", path_, name, e.dtype));
  }
  Tensor out = Tensor::empty(e.shape, *dtype);
  std::memcpy(out.data(), e.data, e.nbytes);
  return out;
}

}  // namespace primus
