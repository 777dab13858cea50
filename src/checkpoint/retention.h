// Which checkpoints a save directory keeps (TorchTitan's keep_latest_k): after each commit the oldest complete
// checkpoints beyond the latest K are removed, except every one whose iteration is a multiple of `keep_every`,
// which stays for good. Checkpoints newer than the latest (left by a run that went further before this one
// resumed from an earlier checkpoint) are not counted and not removed: the run overwrites them as it gets there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace primus {

struct RetentionPolicy {
  int64_t keep_latest_k = 0;  // 0: keep every checkpoint
  int64_t keep_every = 0;     // 0: none kept for good beyond the latest K
};

// The iter_N directories that `policy` removes once `latest` is committed, oldest first.
std::vector<std::string> checkpoints_to_remove(const std::string& save_dir, int64_t latest,
                                               const RetentionPolicy& policy);
// Removes them: each is first renamed to a temporary name (`iter_N.tmp.removing`), so a crash part way leaves
// a temporary the next run removes, never a half-deleted iter_N. Returns their names.
std::vector<std::string> apply_retention(const std::string& save_dir, int64_t latest, const RetentionPolicy& policy);

}  // namespace primus
