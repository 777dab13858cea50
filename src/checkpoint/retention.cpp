#include "checkpoint/retention.h"

#include <algorithm>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace fs = std::filesystem;

std::vector<std::string> checkpoints_to_remove(const std::string& save_dir, int64_t latest,
                                               const RetentionPolicy& policy) {
  if (policy.keep_latest_k <= 0) return {};
  std::vector<int64_t> older;  // complete checkpoints up to the latest, newest first
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(save_dir, error)) {
    const int64_t iteration = checkpoint_dir_iteration(entry.path().filename().string());
    if (iteration >= 0 && iteration <= latest && entry.is_directory()) older.push_back(iteration);
  }
  if (error) throw RuntimeError(fmt::format("{}: cannot list the save directory: {}", save_dir, error.message()));
  std::sort(older.rbegin(), older.rend());
  std::vector<std::string> remove;
  for (size_t i = static_cast<size_t>(policy.keep_latest_k); i < older.size(); ++i) {
    if (policy.keep_every > 0 && older[i] % policy.keep_every == 0) continue;
    remove.push_back(checkpoint_dir_name(older[i]));
  }
  std::reverse(remove.begin(), remove.end());
  return remove;
}

std::vector<std::string> apply_retention(const std::string& save_dir, int64_t latest, const RetentionPolicy& policy) {
  const std::vector<std::string> names = checkpoints_to_remove(save_dir, latest, policy);
  for (const std::string& name : names) {
    const std::string doomed = save_dir + "/" + name + ".tmp.removing";
    fs::rename(save_dir + "/" + name, doomed);
    fs::remove_all(doomed);
  }
  if (!names.empty()) fsync_directory(save_dir);
  return names;
}

}  // namespace primus
