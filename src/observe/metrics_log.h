// metrics.jsonl: one JSON object per logged step, appended and flushed line by line so a killed run
// keeps everything it logged. On resume the file is first cut back to the checkpoint's step, so the
// steps that the resumed run repeats are not logged twice.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace primus {

class MetricsLog {
 public:
  // Opens `path` for appending after dropping records whose "step" is greater than `keep_through_step`.
  MetricsLog(const std::string& path, int64_t keep_through_step);
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace primus
