#include "observe/metrics_log.h"

#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

MetricsLog::MetricsLog(const std::string& path, int64_t keep_through_step) : path_(path) {
  if (std::filesystem::exists(path)) {
    std::istringstream in(read_file(path));
    std::string kept, line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      // A torn last line (killed mid-write) or a step beyond the checkpoint is dropped.
      nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_discarded() || !record.contains("step")) continue;
      if (record["step"].get<int64_t>() <= keep_through_step) kept += line + "\n";
    }
    write_file_atomic(path, kept);
  }
  out_.open(path, std::ios::app);
  if (!out_) throw RuntimeError(fmt::format("cannot open {} for writing", path));
}

void MetricsLog::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw RuntimeError(fmt::format("write to {} failed", path_));
}

}  // namespace primus
