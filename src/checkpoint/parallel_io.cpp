// Parallel checksums and tensor reads over checkpoint files (parallel_io.h).
#include "checkpoint/parallel_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/parallel_jobs.h"
#include "ops/ops.h"

namespace primus {

namespace {

constexpr uint64_t kChecksumRangeBytes = uint64_t{64} << 20;
constexpr uint64_t kReadPieceBytes = uint64_t{16} << 20;  // also the size of one read of a checksum range
constexpr int64_t kPieceElements = static_cast<int64_t>(kReadPieceBytes / 4);

// A file opened for one job, closed when the job ends (open costs microseconds; a job moves megabytes).
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw RuntimeError(fmt::format("cannot open {}: {}", path, std::generic_category().message(errno)));
  }
  ~ReadOnlyFile() { ::close(fd_); }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  // Exactly n bytes at `offset`, or RuntimeError: a file that ends early was truncated after it was checked.
  void read_exactly(void* dst, uint64_t n, uint64_t offset) const {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw RuntimeError(
            fmt::format("read {} at offset {}: {}", path_, offset, std::generic_category().message(errno)));
      }
      if (got == 0) {
        throw RuntimeError(fmt::format("{}: ends at offset {}, {} bytes short of what was to be read — truncated "
                                       "while loading; not loading",
                                       path_, offset, n));
      }
      p += got;
      n -= static_cast<uint64_t>(got);
      offset += static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

std::vector<uint32_t> checksum_files(const std::vector<FileSpan>& files, int threads,
                                     const std::function<void(uint64_t)>& on_bytes) {
  struct Range {
    size_t file;
    uint64_t begin;
    uint64_t bytes;
  };
  std::vector<Range> ranges;
  for (size_t f = 0; f < files.size(); ++f) {
    for (uint64_t begin = 0; begin < files[f].bytes; begin += kChecksumRangeBytes) {
      ranges.push_back({f, begin, std::min(kChecksumRangeBytes, files[f].bytes - begin)});
    }
  }
  std::vector<uint32_t> range_crcs(ranges.size(), 0);
  PieceReporter report(on_bytes);
  run_parallel_jobs(
      ranges.size(), threads,
      [&](size_t k) {
        const Range& r = ranges[k];
        thread_local std::vector<unsigned char> buffer;
        buffer.resize(kReadPieceBytes);
        const ReadOnlyFile file(files[r.file].path);
        uint32_t crc = 0;
        for (uint64_t at = 0; at < r.bytes; at += kReadPieceBytes) {
          const uint64_t n = std::min(kReadPieceBytes, r.bytes - at);
          file.read_exactly(buffer.data(), n, r.begin + at);
          crc = crc32c(buffer.data(), n, crc);
          report.finished(n);
        }
        range_crcs[k] = crc;
      },
      std::ref(report));
  std::vector<uint32_t> crcs(files.size(), 0);
  for (size_t k = 0; k < ranges.size(); ++k) {
    crcs[ranges[k].file] = crc32c_combine(crcs[ranges[k].file], range_crcs[k], ranges[k].bytes);
  }
  return crcs;
}

namespace {

// Page-locked staging for device reads, unlocked (after the device's copies from it are done) on every way out.
class PinnedStaging {
 public:
  PinnedStaging(Device device, int64_t elements)
      : device_(device), host_(Tensor::empty({elements}, DType::kF32)) {
    ops::pin_host(device_, host_.data(), host_.nbytes());
  }
  ~PinnedStaging() {
    try {
      ops::synchronize(device_);
    } catch (...) {  // the error that brought us here is the one to report
    }
    ops::unpin_host(device_, host_.data());
  }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  Tensor slot(int64_t index) const { return host_.slice_elements(index * kPieceElements, {kPieceElements}); }

 private:
  Device device_;
  Tensor host_;
};

void read_to_device(const std::vector<const TensorRead*>& pieces, Device device, int threads, PieceReporter& report) {
  if (pieces.empty()) return;
  const size_t workers = static_cast<size_t>(threads > 0 ? threads : default_io_threads());
  const size_t slots = std::min(pieces.size(), 2 * workers);  // per half
  const PinnedStaging staging(device, static_cast<int64_t>(2 * slots) * kPieceElements);
  for (size_t first = 0, round = 0; first < pieces.size(); first += slots, ++round) {
    const size_t count = std::min(slots, pieces.size() - first);
    const int64_t half = static_cast<int64_t>((round % 2) * slots);
    run_parallel_jobs(
        count, threads,
        [&](size_t j) {
          const TensorRead& piece = *pieces[first + j];
          const Tensor slot = staging.slot(half + static_cast<int64_t>(j));
          ReadOnlyFile(piece.path).read_exactly(slot.data(), static_cast<uint64_t>(piece.count) * 4, piece.offset);
          report.finished(static_cast<uint64_t>(piece.count) * 4);
        },
        std::ref(report));
    // The previous round's copies read the other half: done, it is free for the next round.
    ops::synchronize(device);
    for (size_t j = 0; j < count; ++j) {
      const TensorRead& piece = *pieces[first + j];
      Tensor dst = piece.dst;
      ops::copy(dst, staging.slot(half + static_cast<int64_t>(j)).slice_elements(0, {piece.count}));
    }
  }
  ops::synchronize(device);
}

}  // namespace

void read_tensors(const std::vector<TensorRead>& reads, int threads, const std::function<void(uint64_t)>& on_bytes) {
  // Every read cut into pieces of at most 16 MiB, host and device ones apart.
  std::vector<TensorRead> pieces;
  for (const TensorRead& r : reads) {
    PRIMUS_CHECK(r.dst.dtype() == DType::kF32 && r.dst.numel() == r.count && r.count >= 0,
                 "[checkpoint] reading {} elements of {} into {}", r.count, r.path, r.dst.describe());
    const Tensor flat = r.dst.reshape({r.count});
    for (int64_t at = 0; at < r.count; at += kPieceElements) {
      const int64_t n = std::min(kPieceElements, r.count - at);
      pieces.push_back(TensorRead{r.path, r.offset + 4 * static_cast<uint64_t>(at), n, flat.slice_elements(at, {n})});
    }
  }
  std::vector<const TensorRead*> host;
  std::vector<const TensorRead*> device;
  for (const TensorRead& p : pieces) (p.dst.device().is_cpu() ? host : device).push_back(&p);
  PieceReporter report(on_bytes);
  run_parallel_jobs(
      host.size(), threads,
      [&](size_t k) {
        const TensorRead& piece = *host[k];
        ReadOnlyFile(piece.path).read_exactly(piece.dst.data(), static_cast<uint64_t>(piece.count) * 4, piece.offset);
        report.finished(static_cast<uint64_t>(piece.count) * 4);
      },
      std::ref(report));
  // Device pieces, one device at a time (a process loads into one).
  while (!device.empty()) {
    const Device target = device.front()->dst.device();
    std::vector<const TensorRead*> mine;
    std::erase_if(device, [&](const TensorRead* p) {
      if (p->dst.device() != target) return false;
      mine.push_back(p);
      return true;
    });
    read_to_device(mine, target, threads, report);
  }
  report();
}

}  // namespace primus
