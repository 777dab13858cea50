// Reading checkpoint files on several threads: the CRC32C of whole files, and element ranges of files into tensors
// on any device. Internal to src/checkpoint (verify_checkpoint and load_checkpoint use it).
//
// Why pread and not mmap: pages faulted in one at a time through a mapping came in at half the speed of large
// preads into the destination on the H200 host (docs/perf/checkpoint.md), and a read error surfaces as an error
// naming the file, not as SIGBUS.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace primus {

// The bytes of one file a checksum or a read covers.
struct FileSpan {
  std::string path;
  uint64_t bytes = 0;
};

// The CRC32C of every file (whole, `bytes` long: the caller checked the sizes), in the order given. The files are
// cut into 64 MiB ranges that `threads` threads (<= 0: default_io_threads()) checksum in parallel, whatever file
// they belong to; the ranges' CRCs are then joined per file (crc32c_combine). `on_bytes` hears of each piece read
// (one call a piece), on the calling thread, a few times a second. RuntimeError naming the file and offset for a failed or short
// read.
std::vector<uint32_t> checksum_files(const std::vector<FileSpan>& files, int threads,
                                     const std::function<void(uint64_t)>& on_bytes = {});

// `count` f32 elements at byte `offset` of `path` into `dst`, a contiguous f32 tensor of `count` elements on
// any device.
struct TensorRead {
  std::string path;
  uint64_t offset = 0;
  int64_t count = 0;
  Tensor dst;
};

// Performs every read, cut into pieces of at most 16 MiB, on `threads` threads. Host destinations are read into
// directly. Device destinations go through page-locked staging buffers in rounds: the threads read one round's
// pieces into one half of the buffers while the copies of the previous round, from the other half, run on the
// device (the calling thread issues them, on the device's compute stream). Returns when every byte is in place.
// RuntimeError naming the file and offset for a failed or short read.
void read_tensors(const std::vector<TensorRead>& reads, int threads,
                  const std::function<void(uint64_t)>& on_bytes = {});

}  // namespace primus
