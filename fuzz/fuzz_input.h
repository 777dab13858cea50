// What the fuzz targets share: a scratch directory for readers that only take a path, the splitting of one
// input into several parts (a file and text to encode, a YAML document and overrides), and the rule that a
// reader may answer bad input only with primus::Error (UsageError, exit 2; RuntimeError, exit 3).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace primus::fuzz {

// The parts of a multi-part input are separated by this line; the dictionaries list it.
inline constexpr std::string_view kSeparator = "\n@@\n";

// $TMPDIR/primus-fuzz.<pid>, created on first use and removed at exit, so that parallel fuzzers never share
// files. Without TMPDIR: in /dev/shm, as writing and mapping files in memory is many times faster than on a
// busy disk (3,000 against 360 executions a second for indexed_dataset), else in /tmp.
const std::string& scratch_dir();

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path; `name` may hold folders of
// fresh_scratch_dir.
std::string write_scratch(const std::string& name, std::string_view bytes);

// An empty folder scratch_dir()/name, emptied again on each call, for readers that look at a folder's files:
// nothing of an earlier input may stay behind in it.
std::string fresh_scratch_dir(const std::string& name);

// `data` cut at each kSeparator into at most `max_parts` parts (the last keeps any further separators); fewer
// parts when `data` has fewer separators.
std::vector<std::string_view> split_parts(std::string_view data, size_t max_parts);

// True when PRIMUS_FUZZ_VERBOSE is set: the targets then print each error they drop (to see how far a seed gets).
bool verbose();

// Runs `fn`; a primus::Error is the reader's expected answer to a bad input and is dropped. Any other exception
// escapes, and the uncaught exception aborts the fuzzer with the input saved: a reader must never leak a raw
// library error (json, yaml-cpp, std::stoi, bad_alloc) to the user.
template <class Fn>
void expect_clean_errors(Fn&& fn);

}  // namespace primus::fuzz

#include <cstdio>

#include "core/error.h"

template <class Fn>
void primus::fuzz::expect_clean_errors(Fn&& fn) {
  try {
    fn();
  } catch (const primus::Error& e) {
    if (verbose()) std::fprintf(stderr, "exit %d: %s\n", e.exit_code(), e.what());
  }
}
