// Memory-mapped files, MD5, and .npy reading and writing for index caches.
#include "data/npy_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw RuntimeError(fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw RuntimeError(fmt::format("{}: cannot mmap {} bytes: {}", path, size_, std::strerror(err)));
    }
    data_ = static_cast<const unsigned char*>(mapped);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

namespace {

// MD5 round constants: floor(|sin(i + 1)| * 2^32), and the per-round left rotations.
constexpr std::array<uint32_t, 64> kMd5K = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
constexpr std::array<int, 16> kMd5Shift = {7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21};

uint32_t rotl(uint32_t x, int s) { return (x << s) | (x >> (32 - s)); }

void md5_block(std::array<uint32_t, 4>& h, const unsigned char* block) {
  uint32_t m[16];
  for (int i = 0; i < 16; ++i) {
    m[i] = uint32_t{block[4 * i]} | uint32_t{block[4 * i + 1]} << 8 | uint32_t{block[4 * i + 2]} << 16 |
           uint32_t{block[4 * i + 3]} << 24;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
  for (int i = 0; i < 64; ++i) {
    uint32_t f;
    int g;
    if (i < 16) {
      f = (b & c) | (~b & d);
      g = i;
    } else if (i < 32) {
      f = (d & b) | (~d & c);
      g = (5 * i + 1) % 16;
    } else if (i < 48) {
      f = b ^ c ^ d;
      g = (3 * i + 5) % 16;
    } else {
      f = c ^ (b | ~d);
      g = (7 * i) % 16;
    }
    uint32_t next = b + rotl(a + f + kMd5K[i] + m[g], kMd5Shift[(i / 16) * 4 + i % 4]);
    a = d;
    d = c;
    c = b;
    b = next;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
}

int dtype_size(IndexDType dtype) { return dtype == IndexDType::kI64 ? 8 : 4; }

[[noreturn]] void bad_npy(const std::string& path, uint64_t offset, const std::string& what) {
  throw RuntimeError(fmt::format("{}: corrupt .npy file at byte offset {}: {}", path, offset, what));
}

// The value of `key` in a .npy header dict, up to its terminating ',' or '}' (or the closing ')' of a shape).
std::string header_field(const std::string& path, const std::string& header, const std::string& key,
                         uint64_t header_offset) {
  size_t at = header.find("'" + key + "':");
  if (at == std::string::npos) bad_npy(path, header_offset, fmt::format("header has no '{}'", key));
  size_t begin = header.find_first_not_of(' ', at + key.size() + 3);
  if (begin == std::string::npos) bad_npy(path, header_offset + at, fmt::format("'{}' has no value", key));
  size_t end = header[begin] == '(' ? header.find(')', begin) : header.find_first_of(",}", begin);
  if (end == std::string::npos) bad_npy(path, header_offset + begin, fmt::format("'{}' is not terminated", key));
  return header.substr(begin, end - begin + (header[begin] == '(' ? 1 : 0));
}

}  // namespace

std::string md5_hex(std::string_view bytes) {
  std::array<uint32_t, 4> h = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  size_t full = bytes.size() / 64 * 64;
  for (size_t i = 0; i < full; i += 64) md5_block(h, reinterpret_cast<const unsigned char*>(bytes.data() + i));
  // Padding: 0x80, zeros to 56 mod 64, then the bit length as little-endian u64.
  std::string tail(bytes.substr(full));
  tail.push_back(static_cast<char>(0x80));
  while (tail.size() % 64 != 56) tail.push_back('\0');
  uint64_t bits = static_cast<uint64_t>(bytes.size()) * 8;
  for (int i = 0; i < 8; ++i) tail.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  for (size_t i = 0; i < tail.size(); i += 64) md5_block(h, reinterpret_cast<const unsigned char*>(tail.data() + i));
  std::string hex;
  for (uint32_t word : h) {
    for (int i = 0; i < 4; ++i) hex += fmt::format("{:02x}", (word >> (8 * i)) & 0xFF);
  }
  return hex;
}

const char* npy_descr(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::kI32:
      return "<i4";
    case IndexDType::kU32:
      return "<u4";
    case IndexDType::kI64:
      return "<i8";
  }
  return "?";
}

IndexArray::IndexArray(std::vector<int64_t> values, std::vector<int64_t> shape)
    : owned_(std::move(values)), shape_(std::move(shape)), size_(static_cast<int64_t>(owned_.size())) {
  int64_t product = 1;
  for (int64_t d : shape_) product *= d;
  PRIMUS_CHECK(product == size_, "index array of {} values given a shape with {} elements", size_, product);
}

IndexArray IndexArray::map_npy(const std::string& path) {
  auto file = std::make_shared<const MappedFile>(path);
  const unsigned char* p = file->data();
  uint64_t n = file->size();
  static constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (n < 10 || std::memcmp(p, kMagic, 6) != 0) bad_npy(path, 0, "no \\x93NUMPY magic");
  int major = p[6];
  if (major < 1 || major > 3) bad_npy(path, 6, fmt::format("unsupported format version {}.{}", major, p[7]));
  uint64_t header_len = 0;
  uint64_t header_offset = 10;
  if (major == 1) {
    header_len = uint64_t{p[8]} | uint64_t{p[9]} << 8;
  } else {
    if (n < 12) bad_npy(path, 8, "truncated header length");
    header_len = uint64_t{p[8]} | uint64_t{p[9]} << 8 | uint64_t{p[10]} << 16 | uint64_t{p[11]} << 24;
    header_offset = 12;
  }
  if (header_offset + header_len > n) bad_npy(path, header_offset, "header runs past the end of the file");
  std::string header(reinterpret_cast<const char*>(p + header_offset), header_len);

  IndexArray array;
  std::string descr = header_field(path, header, "descr", header_offset);
  if (descr == "'<i4'") {
    array.dtype_ = IndexDType::kI32;
  } else if (descr == "'<u4'") {
    array.dtype_ = IndexDType::kU32;
  } else if (descr == "'<i8'") {
    array.dtype_ = IndexDType::kI64;
  } else {
    bad_npy(path, header_offset, fmt::format("dtype {} is not '<i4', '<u4' or '<i8'", descr));
  }
  if (header_field(path, header, "fortran_order", header_offset) != "False") {
    bad_npy(path, header_offset, "fortran_order is not False");
  }
  std::string shape = header_field(path, header, "shape", header_offset);
  int64_t count = 1;
  size_t pos = 1;
  while (pos < shape.size() - 1) {
    size_t end = shape.find_first_of(",)", pos);
    std::string word = shape.substr(pos, end - pos);
    word.erase(0, word.find_first_not_of(' '));
    if (!word.empty()) {
      char* stop = nullptr;
      long long d = std::strtoll(word.c_str(), &stop, 10);
      if (*stop != '\0' || d < 0) bad_npy(path, header_offset, fmt::format("shape {} is malformed", shape));
      array.shape_.push_back(d);
      if (d > 0 && count > std::numeric_limits<int64_t>::max() / d) bad_npy(path, header_offset, "shape overflows");
      count *= d;
    }
    pos = end + 1;
  }
  uint64_t data_offset = header_offset + header_len;
  uint64_t want = static_cast<uint64_t>(count) * static_cast<uint64_t>(dtype_size(array.dtype_));
  if (n - data_offset != want) {
    bad_npy(path, data_offset,
            fmt::format("shape {} needs {} data bytes, the file has {}", shape, want, n - data_offset));
  }
  array.size_ = count;
  array.data_ = p + data_offset;
  array.file_ = std::move(file);
  return array;
}

std::string IndexArray::source() const { return file_ ? file_->path() : std::string("memory"); }

int64_t IndexArray::operator[](int64_t i) const {
  if (file_ == nullptr) return owned_[static_cast<size_t>(i)];
  const unsigned char* at = data_ + i * dtype_size(dtype_);
  switch (dtype_) {
    case IndexDType::kI32: {
      int32_t v;
      std::memcpy(&v, at, 4);
      return v;
    }
    case IndexDType::kU32: {
      uint32_t v;
      std::memcpy(&v, at, 4);
      return v;
    }
    case IndexDType::kI64: {
      int64_t v;
      std::memcpy(&v, at, 8);
      return v;
    }
  }
  return 0;
}

void write_npy(const std::string& path, const std::vector<int64_t>& values, const std::vector<int64_t>& shape,
               IndexDType dtype) {
  std::string dims;
  for (int64_t d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", npy_descr(dtype), dims);
  // Pad with spaces and end with '\n' so the data starts 64-byte aligned, as numpy does.
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');

  std::string prefix = "\x93NUMPY";
  prefix.push_back('\x01');
  prefix.push_back('\x00');
  prefix.push_back(static_cast<char>(header.size() & 0xFF));
  prefix.push_back(static_cast<char>(header.size() >> 8));
  AtomicFileWriter writer(path);
  writer.append(prefix + header);
  // Values go out in chunks so a cache of any size needs no second full copy in memory.
  size_t itemsize = static_cast<size_t>(dtype_size(dtype));
  constexpr size_t kChunk = 1 << 16;
  std::string chunk;
  for (size_t begin = 0; begin < values.size(); begin += kChunk) {
    size_t end = std::min(values.size(), begin + kChunk);
    chunk.resize((end - begin) * itemsize);
    char* out = chunk.data();
    for (size_t i = begin; i < end; ++i, out += itemsize) {
      int64_t v = values[i];
      if (dtype == IndexDType::kI64) {
        std::memcpy(out, &v, 8);
      } else if (dtype == IndexDType::kI32) {
        PRIMUS_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
                     "{}: value {} does not fit int32", path, v);
        int32_t w = static_cast<int32_t>(v);
        std::memcpy(out, &w, 4);
      } else {
        PRIMUS_CHECK(v >= 0 && v <= std::numeric_limits<uint32_t>::max(), "{}: value {} does not fit uint32", path, v);
        uint32_t w = static_cast<uint32_t>(v);
        std::memcpy(out, &w, 4);
      }
    }
    writer.append(chunk);
  }
  writer.commit();
}

}  // namespace primus
