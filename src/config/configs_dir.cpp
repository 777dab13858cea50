// Locating the configs/ directory (installed, build tree or source tree) and model presets inside it.
// Order: PRIMUS_CONFIGS_DIR; beside an installed binary (<prefix>/bin/primus-cli ->
// <prefix>/share/primus/configs, where `cmake --install` and the .deb put them); a configs/ one or two folders
// above the binary (a checkout's build/primus-cli, its build/tests/*); the source tree the binary was built from.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "config/loader_steps.h"

namespace primus {

namespace fs = std::filesystem;

std::string find_configs_dir() {
  if (const char* env = std::getenv("PRIMUS_CONFIGS_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (const fs::path& candidate :
         {dir / ".." / "share" / "primus" / "configs", dir / ".." / "configs", dir / ".." / ".." / "configs"}) {
      if (fs::is_directory(candidate, ec)) return candidate.lexically_normal().string();
    }
  }
  return std::string(PRIMUS_SOURCE_DIR) + "/configs";
}

namespace config {

fs::path find_model_preset(const ConfigNode& model) {
  const std::string& name = model.text;
  std::error_code ec;
  fs::path given(name);
  fs::path base_dir = model.origin.kind == OriginKind::kFile ? fs::path(model.origin.file).parent_path() : fs::path();
  fs::path as_path = given.is_absolute() ? given : base_dir / given;
  if (fs::is_regular_file(as_path, ec)) return as_path;

  fs::path models = fs::path(find_configs_dir()) / "models";
  for (const fs::path& candidate : {models / name, models / (name + ".yaml")}) {
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  if (!fs::is_directory(models, ec)) {
    config_error(model.origin,
                 fmt::format("model preset '{}' not found: it is not a file relative to {}, and there is "
                             "no preset directory {} (set PRIMUS_CONFIGS_DIR)",
                             name, base_dir.empty() ? "the working directory" : base_dir.string(), models.string()));
  }
  std::vector<std::string> available;
  for (const auto& entry : fs::directory_iterator(models, ec)) {
    if (entry.path().extension() == ".yaml") available.push_back(entry.path().stem().string());
  }
  std::sort(available.begin(), available.end());
  std::string list;
  for (const std::string& a : available) list += (list.empty() ? "" : ", ") + a;
  config_error(model.origin, fmt::format("model preset '{}' not found in {} (available: {})", name, models.string(),
                                         list.empty() ? "none" : list));
}

}  // namespace config

}  // namespace primus
