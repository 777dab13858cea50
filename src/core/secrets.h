// Which environment variables hold secrets, and how they are shown: logs, dry runs and config dumps print
// `***` instead of their values. A name is a secret when it contains TOKEN, KEY, SECRET or PASSWORD in any
// case (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, ...). Erring towards masking is cheap: a masked
// value that was not secret costs a look at the config file; a printed token costs a rotation.
#pragma once

#include <string>
#include <string_view>

namespace primus {

constexpr const char* kMaskedValue = "***";

bool is_secret_name(std::string_view name);

// `value`, or kMaskedValue when `name` is a secret's name.
std::string shown_value(std::string_view name, const std::string& value);

}  // namespace primus
