// The YAML experiment loader with command-line overrides: load_experiment_config on the input's first part
// (written as exp.yaml in the scratch directory), with each line of the second part as a key=value override,
// then `config show`'s table. exp.yaml may extend base.yaml (a complete experiment, beside it) or itself (a
// cycle), and name any preset of configs/models.
//
// Input: YAML [\n@@\n override lines]. Inputs holding '/' or '\' are skipped, so that `extends` and `model` can
// reach only the scratch directory and the presets (a '\' escape in a quoted scalar can spell '/').
#include <cstdlib>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_input.h"

namespace {

constexpr const char* kBase = R"(work_group: fuzz
user_name: fuzz
exp_name: base
workspace: ./output
modules:
  pre_trainer:
    framework: megatron
    model: tiny_llama
    overrides:
      train_iters: 4
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 16
      lr: 1.0e-3
      mock_data: true
)";

// Overrides beyond these many lines or bytes add nothing the first ones do not exercise.
constexpr size_t kMaxOverrides = 8;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // ${VAR} reaches only these: a variable holding a path would lead `extends` out of the scratch directory.
  clearenv();
  setenv("FUZZ_ITERS", "8", 1);
  setenv("FUZZ_BASE", "base.yaml", 1);
  primus::fuzz::write_scratch("base.yaml", kBase);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.find_first_of("/\\") != std::string_view::npos) return -1;
  std::vector<std::string_view> parts = primus::fuzz::split_parts(input, 2);
  const std::string path = primus::fuzz::write_scratch("exp.yaml", parts[0]);
  std::vector<std::string> overrides;
  if (parts.size() == 2) {
    std::string_view rest = parts[1];
    while (!rest.empty() && overrides.size() < kMaxOverrides) {
      size_t eol = rest.find('\n');
      overrides.emplace_back(rest.substr(0, eol));
      rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 1);
    }
  }
  primus::fuzz::expect_clean_errors([&] {
    primus::LoadedConfig loaded = primus::load_experiment_config(path, overrides);
    (void)primus::format_config_show(loaded);
  });
  return 0;
}
